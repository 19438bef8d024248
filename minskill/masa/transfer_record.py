"""transfer.json as `--resume` and the report read it: its labels and the shapes they use, checked.

minskill/masa/transfer.py writes transfer.json (its docstring: what each field is) and reads it
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
