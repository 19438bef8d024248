"""measure.sweep: the λ sweep's table and figure on tiny hand-made runs, against values computed by
hand, and every bad input refused by name."""
import json

import pytest

from minskill.measure import sweep


def lineage_record(step, generations, advantages=None):
    """A lineage.jsonl record shaped like the committed runs' (skill_r1.records.lineage_records)."""
    skills = [{"id": "g0", "generation": 0, "parent": None, "reward": 0.0, "advantage": None}]
    for g, rewards in enumerate(generations, 1):
        skills += [{"id": f"g{g}.{k}", "generation": g, "parent": "g0", "text": "skill",
                    "reward": r, "advantage": None if advantages is None else advantages[g - 1][k]}
                   for k, r in enumerate(rewards)]
    carried = ["g0"] + [f"g{g}.0" for g in range(1, len(generations) + 1)]
    return {"step": step, "instance": f"train-{step}", "skills": skills, "carried": carried}


def metrics_rows(probes):
    """One metrics.jsonl row per probe, each holding it (as train_grpo.py records them)."""
    return [{"step": i, "reward_per_generation": [0.0, 0.0, 0.0],
             "probes": [{"after_steps": t, "reward_per_generation": r, "carried_reward": 0.5,
                         "beat_seed_share": 0.25, "skills": []}]}
            for i, (t, r) in enumerate(probes)]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def runs(tmp_path):
    """Arm A, a folder: D = +0.25 in each of 6 records, advantages whose share is 0.1. Arm B, a
    file prefix: D = +0.5, +0.5, +0.5, −0.25, no advantages recorded."""
    a = tmp_path / "run-a"
    a.mkdir()
    write(a / "metrics.jsonl", metrics_rows([(0, [0.25, 0.5]), (2, [0.25, 0.75])]))
    # each generation: |mean A| = 0.1 of mean |A| = 1.0
    write(a / "lineage.jsonl", [lineage_record(s, [[0.0, 0.5], [0.25, 0.75]],
                                               [[1.1, -0.9], [0.9, -1.1]]) for s in range(6)])
    b = tmp_path / "b"
    write(tmp_path / "b.metrics.jsonl", metrics_rows([(0, [0.25, 0.5]), (2, [0.5, 0.25])]))
    write(tmp_path / "b.lineage.jsonl",
          [lineage_record(s, [[0.0, 0.0], [0.5, 0.5]]) for s in range(3)] +
          [lineage_record(3, [[0.5, 0.5], [0.25, 0.25]])])
    return a, b


def run_sweep(capsys, *argv):
    code = sweep.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_table_holds_the_hand_computed_numbers(runs, capsys):
    a, b = runs
    code, out, err = run_sweep(capsys, f"raw λ=0.5={a}", f"λ=0={b}")
    assert code == 0, err
    lines = out.splitlines()
    assert cells(lines[0])[:4] == ["arm", "probe r_1 after 0 steps", "probe r_1 after 2 steps",
                                   "probe r_1 − r_0 after 2"]
    row_a, row_b = cells(lines[2]), cells(lines[3])
    # the NAME is split on the last '=', so it keeps its own
    assert row_a[:4] == ["raw λ=0.5", "0.500", "0.750", "+0.500"]
    assert row_a[4].startswith("+0.250 (")
    assert row_a[5] == "0.0312 (6, exact)"      # six equal positive D: p = 2 / 2^6
    assert row_a[6] == "0.100"
    # B: D mean (3·0.5 − 0.25) / 4; of the 16 sign patterns, 2 reach +1.25 and 2 reach −1.25
    assert row_b[:4] == ["λ=0", "0.500", "0.250", "-0.250"]
    assert row_b[4].startswith("+0.312 (")
    assert row_b[5] == "0.2500 (4, exact)"
    assert row_b[6] == "—"      # its records hold no advantages


def test_svg_draws_one_curve_per_arm_and_keeps_what_exists(runs, tmp_path, capsys):
    a, b = runs
    svg = tmp_path / "figs" / "sweep.svg"
    assert run_sweep(capsys, f"first={a}", f"second={b}", "--svg", svg)[0] == 0
    text = svg.read_text()
    assert text.count("<polyline") == 2 and "first" in text and "second" in text
    code, _, err = run_sweep(capsys, f"only={a}", "--svg", svg)
    assert code == 2 and "exists: add --overwrite" in err and "second" in svg.read_text()
    assert run_sweep(capsys, f"only={a}", "--svg", svg, "--overwrite")[0] == 0
    assert svg.read_text().count("<polyline") == 1
    target, link = tmp_path / "target.svg", tmp_path / "link.svg"
    target.write_text("keep")
    link.symlink_to(target)
    code, _, err = run_sweep(capsys, f"only={a}", "--svg", link, "--overwrite")
    assert code == 2 and "symbolic link" in err and target.read_text() == "keep"


def test_arms_probed_at_different_steps_are_refused_naming_both_lists(runs, tmp_path, capsys):
    a, _ = runs
    c = tmp_path / "run-c"
    c.mkdir()
    write(c / "metrics.jsonl", metrics_rows([(0, [0.25, 0.5]), (3, [0.25, 0.5])]))
    (c / "lineage.jsonl").write_text((a / "lineage.jsonl").read_text())
    code, out, err = run_sweep(capsys, f"A={a}", f"C={c}")
    assert code == 2 and out == ""
    assert "arm 'C' was probed after steps [0, 3], arm 'A' after [0, 2]" in err


@pytest.mark.parametrize("case, message", [
    ("no equals sign", "expected NAME=RUN"),
    ("empty name", "expected NAME=RUN"),
    ("no such run", "is neither a run folder nor the prefix of"),
    ("no lineage", "lineage.jsonl is missing"),
    ("no probes", "metrics.jsonl: no held-out probe recorded"),
    ("bad probe", "metrics.jsonl:1: field probes[0].reward_per_generation"),
    ("one generation", "a record holds one generation"),
    ("same name twice", "two arms are named 'A'"),
])
def test_bad_input_is_an_error_naming_it(runs, tmp_path, capsys, case, message):
    a, _ = runs
    d = tmp_path / "bad"
    d.mkdir()
    lineage = (a / "lineage.jsonl").read_text()
    args = {"no equals sign": [str(a)], "empty name": [f"={a}"],
            "no such run": [f"A={tmp_path / 'nothing'}"], "same name twice": [f"A={a}", f"A={a}"]}
    if case == "no lineage":
        write(d / "metrics.jsonl", metrics_rows([(0, [0.25, 0.5])]))
    elif case == "no probes":
        write(d / "metrics.jsonl", [{"step": 0, "probes": []}, {"step": 1}])
        (d / "lineage.jsonl").write_text(lineage)
    elif case == "bad probe":
        write(d / "metrics.jsonl", metrics_rows([(0, [0.25])]))
        (d / "lineage.jsonl").write_text(lineage)
    elif case == "one generation":
        write(d / "metrics.jsonl", metrics_rows([(0, [0.25, 0.5])]))
        write(d / "lineage.jsonl", [lineage_record(0, [[0.0, 0.5]])])
    code, out, err = run_sweep(capsys, *args.get(case, [f"A={d}"]))
    assert code == 2 and message in err and "Traceback" not in err and out == ""
