"""Measure a reading path: everything a learner reads to follow one step of an algorithm.

PATHS lists, in reading order, what a learner follows for one Skill-R1 training step and for one
MASA iteration of each phase: every function of the algorithm files that the default run executes
there (tests/test_reading_paths.py traces it), the data classes and configs they read, and the
module docstring of every file the path enters (where the equations are), counted once, where the
path first enters the file. An entry is "FILE:QUALNAME" (e.g.
"minskill/skill_r1/grpo.py:policy_loss"); it counts the lines of that function or class as
written, from its `def`/`class` line (decorators included) to its last line, docstring and comments
included. FILE is where the entry is looked
for first; a name it no longer holds is found by name in the package (`locate`), so a function
that moves between files keeps being counted. Imports are not counted.

An upward jump is an entry that stands above the entry the path read just before it in the same
file: the reader scrolls up (`upward_jumps`).

    python tests/reading_path.py            prints the paths as docs/files.md shows them
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("train_grpo.py", "evolve_masa.py", "rewrite.py")


def _entries(file: str, *names: str) -> list[str]:
    return [f"{file}:{name}" for name in names]


# Stretches that more than one path runs, in the order they run there.
SINGLE_TURN_ROLLOUTS = (_entries("minskill/rollout.py", "run_rollouts", "skill_prompts",
                                 "skill_text") +
                        _entries("minskill/trajectories.py", "with_system") +
                        _entries("minskill/rollout.py", "_run_single_turn", "_score"))
# MASA's paths begin at the search's own loop: evolve_masa.py's run_search around it prints each
# iteration's progress line and saves the state (files, usage) after it, bookkeeping as
# train_grpo.py's checkpoints are
MASA_START = _entries("minskill/masa/search.py", "MasaConfig", "MasaSearch.run")
MASA_PROMPT_PARTS = _entries("minskill/masa/teacher.py", "attribution_messages", "_failure_text",
                             "clip_text", "_skills_text", "_only_general", "_format_help",
                             "_json_format_help")
MASA_ASK_TEACHER = (_entries("minskill/masa/search.py", "MasaSearch.ask") +
                    _entries("minskill/masa/teacher.py", "teacher_seed", "ask_fitting",
                             "trim_levels", "trimmed", "ask_teacher", "RecordingTeacher",
                             "parse_attribution", "_json_in", "_strings", "_quote",
                             "parse_skillset_reply"))
# a proposal becomes a candidate (at the end of propose_general / propose_task_skills), then scored
MASA_ADD = _entries("minskill/masa/search.py", "MasaSearch.add_candidate", "SkillSetCandidate",
                    "_unique")
MASA_EVALUATE = (_entries("minskill/masa/search.py", "MasaSearch.evaluate_candidate",
                          "MasaSearch.evaluate", "rollouts") +
                 SINGLE_TURN_ROLLOUTS + _entries("minskill/rollout.py", "summarize", "_stats") +
                 _entries("minskill/paired.py", "wilson_interval") +
                 _entries("minskill/masa/search.py", "_metrics", "failure_records",
                          "episode_record"))
MASA_GATE = (["minskill/masa/search.py:MasaSearch.gate"] +
             _entries("minskill/gates.py", "masa_decision", "decision") +
             ["minskill/paired.py:sign_test_p_greater"])

PATHS = {
    "Skill-R1: one training step": (
        _entries("train_grpo.py", "train", "train_step", "instance_order") +
        _entries("minskill/skill_r1/run_setup.py", "Run") +
        _entries("minskill/distributed.py", "share", "rank", "world") +
        _entries("minskill/skill_r1/loop.py", "EvolveConfig", "Instance", "Outcome", "Candidate",
                 "HistoryEntry", "Generation", "Evolution", "step_seed", "autocast", "evolve_batch",
                 "score_skills") +
        SINGLE_TURN_ROLLOUTS +
        _entries("minskill/skill_r1/loop.py", "editor_messages", "_history_block", "outcome_line",
                 "_one_line") +
        # (the editor is sampled by nn/sampling.py:generate, language-model machinery like the
        # model's forward)
        _entries("minskill/skill_r1/loop.py", "parse_candidate", "_carry", "assign_advantages") +
        _entries("minskill/skill_r1/grpo.py", "inter_divisor", "bilevel_advantages",
                 "_as_reward_tensor", "intra_advantages", "inter_advantage") +
        _entries("train_grpo.py", "policy_update") +
        _entries("minskill/distributed.py", "sum_over_ranks", "_reduce_numbers") +
        _entries("train_grpo.py", "micro_batches") +
        _entries("minskill/nn/shared_prefix.py", "shared_prefix_logprobs", "DifferentiableKV") +
        _entries("minskill/skill_r1/grpo.py", "policy_loss", "_check_loss_inputs", "_loss_stats") +
        _entries("minskill/distributed.py", "all_reduce_grads")),
    "MASA: one hill-climbing iteration": (
        MASA_START +
        _entries("minskill/masa/search.py", "HillClimbState", "MasaSearch.climb_iteration",
                 "MasaSearch.propose_general") +
        MASA_PROMPT_PARTS + ["minskill/masa/teacher.py:general_rewrite_messages"] +
        MASA_ASK_TEACHER + MASA_ADD + MASA_EVALUATE + MASA_GATE +
        ["minskill/masa/search.py:MasaSearch.calls"]),
    "MASA: one UCB1 iteration": (
        MASA_START +
        _entries("minskill/masa/search.py", "Tree", "MasaSearch.tree_iteration") +
        _entries("minskill/masa/ucb.py", "Node", "select", "ucb_score", "ucb1") +
        ["minskill/masa/search.py:MasaSearch.propose_task_skills"] + MASA_PROMPT_PARTS +
        _entries("minskill/masa/teacher.py", "_only_type", "task_rewrite_messages") +
        MASA_ASK_TEACHER + MASA_ADD +
        ["minskill/masa/ucb.py:expand", "minskill/masa/search.py:MasaSearch.evaluate_node"] +
        MASA_EVALUATE +
        _entries("minskill/masa/ucb.py", "set_reward", "backpropagate", "best_node", "iter_nodes") +
        _entries("minskill/masa/search.py", "MasaSearch.tree_result") + MASA_GATE +
        ["minskill/masa/search.py:MasaSearch.calls"]),
}


@functools.lru_cache(maxsize=None)
def _tree(file: str) -> ast.Module | None:
    path = ROOT / file
    return ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None


def _find(tree: ast.Module | None, qualname: str):
    nodes: list = [tree] if tree is not None else []
    for part in qualname.split("."):
        found = None
        for parent in nodes[-1:]:
            for child in ast.iter_child_nodes(parent):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                        child.name == part:
                    found = child
        if found is None:
            return None
        nodes.append(found)
    return nodes[-1] if len(nodes) > 1 else None


def _python_files() -> list[str]:
    return sorted([p.relative_to(ROOT).as_posix() for p in (ROOT / "minskill").rglob("*.py")] +
                  list(SCRIPTS))


def locate(entry: str) -> tuple[str, ast.AST]:
    """(file, node) of a "FILE:QUALNAME" entry: in FILE, else in the one file of the package (and
    the scripts) that defines QUALNAME; LookupError when none or several do."""
    file, _, qualname = entry.partition(":")
    node = _find(_tree(file), qualname)
    if node is not None:
        return file, node
    found = [(f, n) for f in _python_files() if (n := _find(_tree(f), qualname)) is not None]
    if len(found) != 1:
        where = ", ".join(f for f, _ in found) or "no file"
        raise LookupError(f"{entry}: no such function or class in {file}; defined in {where}")
    return found[0]


def _first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def entry_lines(entry: str) -> int:
    """Source lines of one "FILE:QUALNAME" entry; raises LookupError when it does not exist."""
    _, node = locate(entry)
    return node.end_lineno - _first_line(node) + 1


def docstring_lines(file: str) -> int:
    """Lines of FILE's module docstring (0 without one)."""
    tree = _tree(file)
    first = tree.body[0] if tree is not None and tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
            isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def reading_rows(entries: list[str]) -> list[tuple[str, str, int]]:
    """[(file, what, lines)] in reading order: each entry, and before the first entry of a file its
    module docstring ("docstring")."""
    rows, seen = [], set()
    for entry in entries:
        file, node = locate(entry)
        if file not in seen:
            seen.add(file)
            rows.append((file, "docstring", docstring_lines(file)))
        rows.append((file, entry.partition(":")[2], node.end_lineno - _first_line(node) + 1))
    return rows


def path_report(entries: list[str]) -> tuple[int, int, list[tuple[str, int]]]:
    """(total lines, number of files, [("FILE:WHAT", lines)]), module docstrings included."""
    rows = reading_rows(entries)
    return (sum(n for _, _, n in rows), len({f for f, _, _ in rows}),
            [(f"{f}:{what}", n) for f, what, n in rows])


def upward_jumps(entries: list[str]) -> list[str]:
    """The entries that stand above the entry read just before them in the same file."""
    last: dict[str, int] = {}
    jumps = []
    for entry in entries:
        file, node = locate(entry)
        line = _first_line(node)
        if file in last and line < last[file]:
            jumps.append(entry)
        last[file] = line
    return jumps


def format_path(name: str, width: int = 100) -> str:
    """docs/files.md's block of one path: its title with the counts, then its entries in reading
    order, one line per run of entries of the same file ("LINES QUALNAME", joined by " · "; a long
    run wraps under itself)."""
    total, files, rows = path_report(PATHS[name])
    runs: list[tuple[str, list[str]]] = []
    for entry, n in rows:
        file, _, qualname = entry.partition(":")
        if not runs or runs[-1][0] != file:
            runs.append((file, []))
        runs[-1][1].append(f"{n} {qualname}")
    pad = max(len(file) for file, _ in runs) + 2
    lines = []
    for file, items in runs:
        line = file.ljust(pad)
        for k, item in enumerate(items):
            if k and len(line) + 3 + len(item) > width:
                lines.append(line)
                line = " " * pad + item
            else:
                line += (" · " if k else "") + item
        lines.append(line)
    jumps = len(upward_jumps(PATHS[name]))
    return (f"**{name}: {total} lines in {files} files, {jumps} upward jumps**\n\n```\n" +
            "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    print("\n".join(format_path(name) for name in PATHS))
