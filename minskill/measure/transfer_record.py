"""transfer.json as `--resume` and the report read it: its labels and the shapes they use, checked;
and table.md, the matrix drawn from it as text.

minskill/measure/transfer.py writes transfer.json (its docstring: what each field is) and reads it
back to resume; minskill/report/transfer.py draws it. A file edited by hand or damaged must be a
refusal naming the file and the field, not a traceback, and a label read back must not name a
path: labels name files (trajectories/F/L.jsonl, rewritten/F/L/), so a row labelled `/etc/x` or
`../x` would write there. `check_matrix` checks both, with minskill.files.check_shape (its
docstring: the shape notation).
"""
from __future__ import annotations

import re

from minskill.files import ShapeError, check_shape

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
REWRITTEN = "+rw"        # a rewritten row's label's suffix: "base+rw" is the rewrite of "base"

# what the report and --resume use (RESUME_SHAPE: --resume only)
CELL_SHAPE = {"library": str, "target": str, "reference": str, "status": str, "n": int,
              "trajectories": (None, str), "success": (None, float),
              "ci95": (None, [float, float]), "rewards": (None, [float]),
              "paired": (None, {"diff": float, "gained": int, "lost": int, "p": float}),
              "note?": (None, str)}
SCORED_SHAPE = {"success": float, "ci95": [float, float], "rewards": [float], "errors": int}
MATRIX_SHAPE = {"n_tasks": int, "suite_name": str, "rewriter": (None, str), "complete?": bool,
                "task_ids?": [str], "questions?": [str], "cells": [CELL_SHAPE],
                "libraries": [{"label": str, "rewritten_from": (None, str), "spec": str,
                               "unparsed?": (None, {str: (None, str)}), "digest?": (None, str)}],
                "targets": [{"label": str, "spec": str, "url": (None, str), "model": (None, str)}]}
RESUME_SHAPE = {"suite": str, "task_ids": [str], "questions": [str], "args": {"targets": [str]},
                "seconds?": (None, float), "resumed?": [str]}


def check_matrix(run, where: str, resume: bool = False) -> dict:
    """`run` (a parsed transfer.json) when it has what --resume (`resume`) or the report uses: the
    shapes above, a scored cell's numbers for every task, and labels that are labels (they name
    files: a row labelled with a path must not write there); else ShapeError naming `where` and the
    field."""
    check_shape(run, {**MATRIX_SHAPE, **(RESUME_SHAPE if resume else {})}, where)
    for i, cell in enumerate(run["cells"]):
        if cell["status"] == "scored":
            check_shape(cell, SCORED_SHAPE, f"{where}: cells[{i}] (scored)")
            if len(cell["rewards"]) != run["n_tasks"]:
                raise ShapeError(f"{where}: field cells[{i}].rewards: {len(cell['rewards'])} "
                                 f"rewards for {run['n_tasks']} tasks")
    plain = [r["label"] for r in run["libraries"] if r["rewritten_from"] is None]
    for i, row in enumerate(run["libraries"]):
        base = row["label"] if row["rewritten_from"] is None else \
            row["label"].removesuffix(REWRITTEN)
        if not LABEL.fullmatch(base) or (row["rewritten_from"] is not None and (
                row["label"] == base or row["rewritten_from"] != base or base not in plain)):
            raise ShapeError(f"{where}: field libraries[{i}].label: {row['label'][:80]!r} is not a "
                             f"library label (1-64 of letters, digits, ._+-; a rewritten row: its "
                             f"input's label + {REWRITTEN!r})")
    for i, target in enumerate(run["targets"]):
        if not LABEL.fullmatch(target["label"]):
            raise ShapeError(f"{where}: field targets[{i}].label: {target['label'][:80]!r} is not "
                             f"a target label")
    return run


# --------------------------------------------------------------------------------------------------
# table.md: the matrix as transfer.py prints and writes it

def cell_text(cell: dict) -> str:
    if cell["status"] != "scored":
        return "– (the rewrite did not parse)"
    lo, hi = cell["ci95"]
    text = f"{cell['success']:.2f} ({lo:.2f}–{hi:.2f})"
    if cell["errors"]:
        text += f" [{cell['errors']} errors]"
    d = cell["paired"]
    if d is None:
        return text + " · reference"
    return text + f" · Δ {d['diff']:+.2f}, +{d['gained']}/−{d['lost']}, p {d['p']:.3g}"


def column_note(run: dict, target: dict) -> str:
    """What a column's plain rows are paired against."""
    plain = [r["label"] for r in run["libraries"] if r["rewritten_from"] is None]
    if target["label"] in plain:
        return f"Δ vs {target['label']} (own)"
    return f"Δ vs {plain[0]} (first library: none labelled {target['label']})"


def matrix_table(run: dict) -> str:
    """table.md: libraries × targets, the best success of each column in bold."""
    cells = {(c["library"], c["target"]): c for c in run["cells"]}
    targets = run["targets"]
    best = {t["label"]: max((c["success"] for c in run["cells"] if c["target"] == t["label"]
                             and c["success"] is not None), default=None) for t in targets}
    lines = [f"Success on {run['n_tasks']} held-out {run['suite_name']} tasks (95% Wilson "
             f"interval) · Δ = paired difference to the column's reference on the same tasks: Δ "
             f"success, tasks gained/lost, exact sign test "
             f"p{'; a +rw row is paired against its input library' if run['rewriter'] else ''}.",
             "", "| library \\ target | " + " | ".join(f"{t['label']} · {column_note(run, t)}"
                                                       for t in targets) + " |",
             "|---|" + "---|" * len(targets)]
    for row in run["libraries"]:
        texts = []
        for t in targets:
            cell = cells.get((row["label"], t["label"]))
            text = cell_text(cell) if cell else "(not run)"
            bold = cell and cell["success"] is not None and cell["success"] == best[t["label"]]
            texts.append(f"**{text}**" if bold else text)
        lines.append(f"| {row['label']} | " + " | ".join(texts) + " |")
    lines += ["", *(f"- target {t['label']}: {t['url'] or 'embedded ' + t['spec']}, model "
                    f"{t['model']}"
                    for t in targets), *(f"- library {r['label']}: {r['spec']}"
                                         for r in run["libraries"])]
    return "\n".join(lines)
