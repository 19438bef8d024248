"""python -m minskill.measure.combine on eval.json files of the wrong shape (a clean refusal
naming FILE and the field, never a traceback, never --resume), the success intervals that the
combined record, the printed table and the report share (recomputed from the instances, not
copied), and the sentence saying what the p-values generalise over."""
import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from minskill.paired import generalises_over
from minskill.report import __main__ as report
from minskill.report.html import esc
from minskill.measure import combine
from minskill.skill_r1.eval_table import FROZEN_ROW, print_table, recorded_tasks, success_interval

RUNS = Path(__file__).resolve().parents[1] / "docs" / "runs" / "skill-r1-cold-start"


def fixed_row(name: str) -> dict:
    return {"name": name, "spec": None, "success": 0.5, "scores": [[1.0, 0.0], [0.0, 1.0]],
            "per_generation": [], "evolve_calls": 0, "eval_calls": 4, "ci95": [0.0, 1.0]}


def editor_row(name: str, spec: str, scores: list) -> dict:
    flat = [x for g in scores for x in g]
    success = sum(flat) / len(flat)
    return {"name": f"{name}: {spec}", "spec": spec, "success": success, "scores": scores,
            "per_generation": [0.5, success], "evolve_calls": 8, "eval_calls": 8}


def eval_record(*rows: dict) -> dict:
    """A finished --eval record of 2 instances x 2 evaluation tasks (evaluate.eval_record's
    format)."""
    flags = {"suite": "qa", "seed": 0, "generations": 2, "candidates": 2, "rollouts": 1,
             "task_model": None, "task_url": None, "task_quantize": "none", "eval_scoring": "own"}
    instances = [{"id": f"heldout-{j}", "type": "qa", "evolve_tasks": [f"e{j}"],
                  "eval_tasks": [f"t{2 * j}", f"t{2 * j + 1}"], "eval_questions": ["q", "q"]}
                 for j in range(2)]
    return {"kind": "skill-r1-eval", "version": 2, "finished": True, "flags": flags,
            "task_model": "embedded default", "instances": instances,
            "rows": [fixed_row("no skill"), fixed_row("seed skill"), *rows], "paired": [],
            "usage": None, "wall_seconds": 1.0}


@pytest.fixture
def runs(tmp_path):
    """Two valid runs to join: the frozen row's, and a later Skill-R1 row's."""
    first, later = tmp_path / "frozen.json", tmp_path / "later.json"
    first.write_text(json.dumps(eval_record(editor_row(FROZEN_ROW, "editor",
                                                       [[1.0, 0.0], [1.0, 0.0]]))))
    later.write_text(json.dumps(eval_record(editor_row("Skill-R1 (λ = 0.5)", "ckpt",
                                                       [[1.0, 1.0], [1.0, 0.0]]))))
    return first, later


def set_(path, value):
    def change(record):
        *parents, last = path
        target = record
        for key in parents:
            target = target[key]
        target[last] = value
    return change


WRONG_SHAPES = [   # (what, change to the later run's record, what the message names)
    ("rows null", set_(["rows"], None), "field rows"),
    ("rows empty", set_(["rows"], []), "field rows"),
    ("a row not an object", set_(["rows", 2], "row"), "field rows[2]"),
    ("a row without a name", lambda r: r["rows"][2].pop("name"),
     "field rows[2] lacks the field 'name'"),
    ("a name that is a number", set_(["rows", 2, "name"], 7), "field rows[2].name"),
    ("no flags", lambda r: r.pop("flags"), "lacks the field 'flags'"),
    ("flags null", set_(["flags"], None), "field flags"),
    ("flags without the seed", lambda r: r["flags"].pop("seed"),
     "field flags lacks the field 'seed'"),
    ("a seed as a string", set_(["flags", "seed"], "0"), "field flags.seed"),
    ("a negative seed", set_(["flags", "seed"], -1), "field flags.seed"),
    ("generations as a string", set_(["flags", "generations"], "2"), "field flags.generations"),
    ("scores as strings", set_(["rows", 2, "scores"], [["1.0", "0"], ["1", "0"]]),
     "field rows[2].scores[0][0]"),
    ("scores null", set_(["rows", 2, "scores"], None), "field rows[2].scores"),
    ("a score group too few", set_(["rows", 2, "scores"], [[1.0, 0.0]]), "field rows[2].scores"),
    ("a score group short", set_(["rows", 2, "scores", 1], [1.0]), "field rows[2].scores[1]"),
    ("a score above 1", set_(["rows", 2, "scores", 0, 1], 1.5), "field rows[2].scores[0][1]"),
    ("success as a string", set_(["rows", 1, "success"], "0.5"), "field rows[1].success"),
    ("success NaN", set_(["rows", 2, "success"], float("nan")), "field rows[2].success"),
    ("per_generation null", set_(["rows", 2, "per_generation"], None),
     "field rows[2].per_generation"),
    ("evolve calls as a string", set_(["rows", 2, "evolve_calls"], "8"),
     "field rows[2].evolve_calls"),
    ("instances null", set_(["instances"], None), "field instances"),
    ("an instance without eval_tasks", lambda r: r["instances"][1].pop("eval_tasks"),
     "field instances[1] lacks the field 'eval_tasks'"),
    ("a task model that is a number", set_(["task_model"], 3), "field task_model"),
    ("wall seconds as a string", set_(["wall_seconds"], "1"), "field wall_seconds"),
    ("a row name twice", lambda r: r["rows"].append(copy.deepcopy(r["rows"][2])),
     "field rows[3].name"),
]


@pytest.mark.parametrize("change,named", [c[1:] for c in WRONG_SHAPES],
                         ids=[c[0] for c in WRONG_SHAPES])
def test_a_wrong_shape_is_refused_naming_file_and_field(runs, tmp_path, capsys, change, named):
    first, later = runs
    record = json.loads(later.read_text())
    change(record)
    later.write_text(json.dumps(record))
    out = tmp_path / "all"
    assert combine.main([str(first), str(later), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"combine: {later}: ") and named in err, err
    assert "--resume" not in err and "Traceback" not in err and not out.exists()


def test_a_record_that_is_no_object_and_the_valid_pair(runs, tmp_path, capsys):
    """The fixture's pair itself joins (so each refusal above is the change's); a JSON list is
    refused."""
    first, later = runs
    assert combine.main([str(first), str(later), "--out", str(tmp_path / "all")]) == 0
    assert len(json.loads((tmp_path / "all" / "eval.json").read_text())["rows"]) == 4
    later.write_text("[1, 2]")
    assert combine.main([str(first), str(later), "--out", str(tmp_path / "list")]) == 2
    assert f"combine: {later}: not a train_grpo.py --eval record" in capsys.readouterr().err


def test_a_non_empty_out_is_refused_without_offering_resume(runs, tmp_path, capsys):
    first, later = runs
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert combine.main([str(first), str(later), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "--overwrite" in err and "--resume" not in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def printed_intervals(printed: str) -> dict[str, str]:
    return dict(re.findall(r"^\| (.+?) \| \d\.\d{3} \((\d\.\d\d–\d\.\d\d)\) \|", printed, re.M))


def test_committed_runs_intervals_are_recomputed_alike_in_record_table_and_report(tmp_path, capsys):
    """Two committed eval.json files store an older interval for their editor row (a Wilson
    interval over 480 clustered scores): combine's record, its printed table and the report of
    its folder all give the interval that eval_table.success_interval computes from the row's
    per-instance scores."""
    files = [RUNS / "eval-frozen.json", RUNS / "eval-skill-r1-seed0.json"]
    out = tmp_path / "eval-cs"
    assert combine.main([str(f) for f in files] + ["--out", str(out)]) == 0
    printed = printed_intervals(capsys.readouterr().out)
    record = json.loads((out / "eval.json").read_text())
    test = recorded_tasks(record["instances"])
    stored = {r["name"]: r["ci95"] for f in files for r in json.loads(f.read_text())["rows"]}
    assert any(stored[r["name"]] != pytest.approx(success_interval(r, test))
               for r in record["rows"])
    page = report.write_report(out, tmp_path / "combined.html").read_text(encoding="utf-8")
    for row in record["rows"]:
        low, high = success_interval(row, test)
        shown = f"{low:.2f}–{high:.2f}"
        assert row["ci95"] == pytest.approx([low, high]) and printed[row["name"]] == shown
        assert (f'<td>{esc(row["name"])}</td><td class="num">{row["success"]:.3f}</td>'
                f'<td class="num">{shown}</td>') in page


def test_printed_tables_and_report_say_what_the_p_values_generalise_over(runs, tmp_path, capsys):
    """--eval and combine print (eval_table.print_table) and the report shows
    paired.generalises_over: over the instances and, where a type's instances share their
    scoring tasks, not over new scoring tasks."""
    first, later = runs
    record = json.loads(first.read_text())
    own_ids = [x["eval_tasks"] for x in record["instances"]]
    own, shared = generalises_over(own_ids), generalises_over([["t0", "t1"], ["t0", "t1"]])
    assert "scored on tasks of its own" in own and "not over new scoring tasks" not in own
    assert "not over new scoring tasks" in shared and "2 distinct here" in shared
    for test, note in [(recorded_tasks(record["instances"]), own),
                       ([[SimpleNamespace(id=f"t{k}") for k in range(2)]] * 2, shared)]:
        args = SimpleNamespace(**record["flags"])
        print_table(record["rows"], [SimpleNamespace(type="qa")] * 2, test, args)
        assert note in capsys.readouterr().out
    assert combine.main([str(first), str(later), "--out", str(tmp_path / "all")]) == 0
    assert own in capsys.readouterr().out
    page = report.write_report(tmp_path / "all", tmp_path / "all.html").read_text(encoding="utf-8")
    assert esc(own) in page
