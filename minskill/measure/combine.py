"""Put the rows of several `train_grpo.py --eval` runs into one table, as if one run had measured
them all.

    python -m minskill.measure.combine runs/eval-frozen runs/eval-skill-r1 --out runs/eval-all

An --eval row depends only on the flags, the held-out tasks and the seeds, never on the other rows,
so an editor trained later can be evaluated in a run of its own (`--no-frozen-row`) and its row
joined to the earlier ones here; the paired table is then computed over all of them. In full:
docs/skill-r1.md, "combine in full".

Decisions:
1. What shapes a row must agree (COMPARED_FLAGS, the task model, the instances and their tasks,
   the no-skill and seed-skill rows' per-task scores), else it is refused naming the difference.
2. Rows come in the order of the runs given; a row name given twice is refused.
3. Every field read is checked first (check_eval_record): another shape is refused, naming FILE
   and field.
4. Writes OUT/eval.json (with "combined_from"), each row's "ci95" recomputed from its scores, and
   prints the tables as --eval does."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

from minskill.files import ShapeError, check_shape, read_json, write_json_atomic
from minskill.runs import RunFolderError, check_run_folder, open_run_folder
from minskill.skill_r1.eval_table import (EVAL_FILE, paired_rows, print_table, recorded_tasks,
                                          success_interval)

COMPARED_FLAGS = ("suite", "seed", "n_tasks", "tasks_per_instance", "eval_instances", "eval_tasks",
                  "eval_scoring",
                  "generations", "candidates", "rollouts", "seed_skills", "editor_temperature",
                  "editor_top_p",
                  "max_skill_tokens", "context_tokens", "task_max_tokens", "task_temperature",
                  "task_quantize",
                  "carry_gate", "carry_gate_alpha")
SKILL_ROWS = 2   # each run opens with the no-skill and the seed-skill rows
# what combine reads of an eval.json (minskill.files.check_shape): check_alike's fields, the
# flags that print_table names, the row fields that the tables print or are computed from
ROW_SHAPE = {"name": str, "spec?": (None, str), "success": float, "scores": [[float]],
             "per_generation": [float], "evolve_calls": int, "eval_calls": int}
RECORD_SHAPE = {"flags": {"suite": str, "seed": int, "generations": int, "candidates": int,
                          "rollouts": int, "task_model": object, "task_url": object,
                          "task_quantize": object},
                "task_model": (None, str), "rows": [ROW_SHAPE], "wall_seconds?": float,
                "instances": [{"id": object, "type": str, "eval_tasks": [str]}]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minskill.measure.combine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+",
                   help="--eval run folders (or their eval.json), the first one's rows first")
    p.add_argument("--out", required=True, help="output folder: OUT/eval.json")
    p.add_argument("--overwrite", action="store_true", help="replace what a non-empty --out holds")
    args = p.parse_args(argv)
    if len(args.runs) < 2:
        p.error("give at least two --eval runs")
    out = Path(args.out)
    try:
        check_run_folder(out, False, args.overwrite, "combine", resumable=False)
        record = combine(args.runs)
    except RunFolderError as e:
        print(e, file=sys.stderr)     # (its message names the script)
        return 2
    except (ValueError, OSError) as e:
        print(f"combine: {e}", file=sys.stderr)
        return 2
    flags = SimpleNamespace(**record["flags"])
    evo = [SimpleNamespace(type=x["type"]) for x in record["instances"]]
    print(f"rows of {', '.join(record['combined_from'])}")
    print_table(record["rows"], evo, recorded_tasks(record["instances"]), flags)
    open_run_folder(out, False, args.overwrite, "combine")
    write_json_atomic(out / EVAL_FILE, record)
    print(f"\nwrote {out / EVAL_FILE}; python -m minskill.report {out} draws the evaluation as one "
          "HTML page")
    return 0


def combine(paths: list[str]) -> dict:
    """The combined record (module docstring) of the --eval runs at `paths`."""
    runs = [read_eval(p) for p in paths]
    for other in runs[1:]:
        check_alike(runs[0], other)
    rows, seen = list(runs[0][1]["rows"]), {r["name"] for r in runs[0][1]["rows"]}
    for file, record in runs[1:]:
        for row in record["rows"][SKILL_ROWS:]:
            if row["name"] in seen:
                raise ValueError(f"{file}: the row '{row['name']}' is already in an earlier run "
                                 "given")
            seen.add(row["name"])
            rows.append(row)
    head = runs[0][1]
    test = recorded_tasks(head["instances"])   # a run's stored "ci95" may be older: recomputed
    rows = [{**r, "ci95": success_interval(r, test)} for r in rows]
    return {**head, "rows": rows, "paired": paired_rows(rows, head["flags"]["seed"]),
            "combined_from": [str(f) for f, _ in runs], "usage": None,
            "wall_seconds": sum(r.get("wall_seconds", 0.0) for _, r in runs), "finished": True}


def read_eval(path: str) -> tuple[Path, dict]:
    """An --eval run's record (a folder or its eval.json); ValueError when it is not a finished
    one."""
    file = Path(path) / EVAL_FILE if Path(path).is_dir() else Path(path)
    record = read_json(file, str(file))
    if not isinstance(record, dict) or record.get("kind") != "skill-r1-eval":
        raise ValueError(f"{file}: not a train_grpo.py --eval record")
    if not record.get("finished"):
        raise ValueError(f"{file}: the evaluation did not finish (its paired table is missing): "
                         "run it again")
    check_eval_record(file, record)
    return file, record


def check_eval_record(file: Path, record: dict) -> None:
    """Refuse (ValueError naming FILE and the field) a record whose fields that combine reads
    are not as --eval writes them: RECORD_SHAPE, the two fixed-skill rows at least, per row one
    score group per instance holding one score in [0, 1] per evaluation task and a success in
    [0, 1], a seed that numpy accepts, no row name twice."""
    try:
        check_shape(record, RECORD_SHAPE, str(file))
    except ShapeError as e:
        raise ValueError(str(e)) from None
    rows, instances, seed = record["rows"], record["instances"], record["flags"]["seed"]
    if len(rows) < SKILL_ROWS:
        raise ValueError(f"{file}: field rows: {len(rows)} rows; an --eval run opens with the "
                         f"no-skill and the seed-skill rows")
    if seed < 0:
        raise ValueError(f"{file}: field flags.seed: expected 0 or more, got {seed}")
    names = set()
    for i, row in enumerate(rows):
        where = f"{file}: field rows[{i}]"
        if len(row["scores"]) != len(instances):
            raise ValueError(f"{where}.scores: {len(row['scores'])} groups, expected one per "
                             f"instance ({len(instances)})")
        for j, (group, instance) in enumerate(zip(row["scores"], instances)):
            if len(group) != len(instance["eval_tasks"]):
                raise ValueError(f"{where}.scores[{j}]: {len(group)} scores, expected one per "
                                 f"evaluation task of instances[{j}] "
                                 f"({len(instance['eval_tasks'])})")
            bad = next((k for k, x in enumerate(group) if not 0 <= x <= 1), None)
            if bad is not None:
                raise ValueError(f"{where}.scores[{j}][{bad}]: expected a score in [0, 1], got "
                                 f"{group[bad]!r}")
        if not 0 <= row["success"] <= 1:
            raise ValueError(f"{where}.success: expected a share in [0, 1], got {row['success']!r}")
        if row["name"] in names:
            raise ValueError(f"{where}.name: the row {row['name']!r} appears twice")
        names.add(row["name"])


def check_alike(first: tuple[Path, dict], other: tuple[Path, dict]) -> None:
    """Refuse (ValueError, naming both files and what differs) two runs whose rows cannot share one
    table."""
    (a, ra), (b, rb) = first, other
    flags = [f"--{k.replace('_', '-')} {ra['flags'].get(k)!r} vs {rb['flags'].get(k)!r}"
             for k in COMPARED_FLAGS
             if ra["flags"].get(k) != rb["flags"].get(k)]
    if ra.get("task_model") != rb.get("task_model"):
        flags.append(f"task model {ra.get('task_model')!r} vs {rb.get('task_model')!r}")
    if flags:
        raise ValueError(f"{a} and {b} were measured with other flags: {'; '.join(flags)}")
    if ra["instances"] != rb["instances"]:
        raise ValueError(f"{a} and {b} evaluate other instances or tasks")
    for row_a, row_b in zip(ra["rows"][:SKILL_ROWS], rb["rows"][:SKILL_ROWS]):
        if row_a["scores"] != row_b["scores"]:
            raise ValueError(f"{a} and {b}: the row '{row_a['name']}' scored differently on the "
                             "same tasks, so the two runs did not measure alike (another task "
                             "model, server or quantisation?)")


if __name__ == "__main__":
    sys.exit(main())
