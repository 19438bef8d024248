"""Measure a reading path: the code a learner reads to follow one step of an algorithm.

A path is a list of "FILE:QUALNAME" entries in reading order (e.g. "train_grpo.py:train",
"minskill/skill_r1/grpo.py:policy_loss", "minskill/skill_r1/loop.py:Candidate"). Each entry counts the lines of that
function or class as written, from its `def`/`class` line (decorators included) to its last line,
docstring and comments included: what the reader has in front of them. Module docstrings and imports
are not counted (they are read once, not per step).

    python tests/reading_path.py            prints both paths of the README, entry by entry
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _find(tree: ast.Module, qualname: str):
    nodes: list = [tree]
    for part in qualname.split("."):
        found = None
        for parent in nodes[-1:]:
            for child in ast.iter_child_nodes(parent):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                    found = child
        if found is None:
            return None
        nodes.append(found)
    return nodes[-1]


def entry_lines(entry: str) -> int:
    """Source lines of one "FILE:QUALNAME" entry; raises LookupError when it does not exist."""
    file, _, qualname = entry.partition(":")
    tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
    node = _find(tree, qualname)
    if node is None:
        raise LookupError(f"{entry}: no such function or class")
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return node.end_lineno - first + 1


def path_report(entries: list[str]) -> tuple[int, int, list[tuple[str, int]]]:
    """(total lines, number of files, [(entry, lines)])."""
    rows = [(e, entry_lines(e)) for e in entries]
    return sum(n for _, n in rows), len({e.partition(":")[0] for e in entries}), rows


if __name__ == "__main__":
    from test_reading_paths import PATHS
    for name, entries in PATHS.items():
        total, files, rows = path_report(entries)
        print(f"{name}: {total} lines in {files} files")
        for entry, n in rows:
            print(f"  {n:4d}  {entry}")
