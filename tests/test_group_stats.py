"""measure.group_stats: the K and G measurements on lineage.jsonl, against values computed by hand."""
import json

import pytest

from minskill.measure import group_stats


def record(seed, generations, carried_ids=None):
    skills = [{"id": "g0", "generation": 0, "reward": seed}]
    for g, rewards in enumerate(generations, 1):
        skills += [{"id": f"g{g}.{k}", "generation": g, "reward": r} for k, r in enumerate(rewards)]
    carried = carried_ids or ["g0"] + [f"g{g}.0" for g in range(1, len(generations) + 1)]
    return {"step": 0, "instance": "i", "skills": skills, "carried": carried}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_subset_stats_equal_the_enumeration_by_hand(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write(run / "lineage.jsonl", [record(0.0, [[0.0, 0.0, 1.0, 1.0]])])
    groups = group_stats.read_groups(run)
    # pairs of {0, 0, 1, 1}: 6 pairs, {0,0} and {1,1} have zero variance; the max is 1 in all but {0,0}
    assert group_stats.subset_stats(groups, 2) == pytest.approx((2 / 6, 5 / 6))
    # triples: none has zero variance, all hold a 1
    assert group_stats.subset_stats(groups, 3) == pytest.approx((0.0, 1.0))
    assert group_stats.subset_stats(groups, 4) == pytest.approx((0.0, 1.0))


def test_report_measures_what_the_second_generation_adds(tmp_path):
    # generation 2's candidates beat generation 1's by exactly +0.25 in each record
    records = [record(0.25, [[0.0, 0.5], [0.25, 0.75]], ["g0", "g1.1", "g2.1"]) for _ in range(6)]
    lines = group_stats.report(group_stats.read_groups(write(tmp_path / "lineage.jsonl", records)))
    assert lines[0] == "6 instances × G = 2 generations × K = 2 candidates"
    assert "generation 1: mean candidate − seed +0.000, best − seed +0.250, carried reward 0.500" in lines
    assert "generation 2: mean candidate − seed +0.250, best − seed +0.500, carried reward 0.750" in lines
    # six equal positive differences: the exact sign flip gives p = 2 / 2^6
    assert lines[-1].startswith("generation 2 − generation 1") and "+0.250" in lines[-1]
    assert "p 0.0312 (exact sign flip)" in lines[-1]


def test_a_record_without_rewards_is_an_error_naming_its_line(tmp_path, capsys):
    bad = {"step": 0, "skills": [{"id": "g0", "generation": 0}], "carried": ["g0"]}
    path = write(tmp_path / "lineage.jsonl", [record(0.0, [[0.0, 1.0]]), bad])
    with pytest.raises(ValueError, match=r"lineage.jsonl:2: not a lineage record with rewards"):
        group_stats.read_groups(path)
    assert group_stats.main([str(path)]) == 2
    assert "lineage.jsonl:2" in capsys.readouterr().err


def test_groups_of_unequal_size_are_refused(tmp_path):
    path = write(tmp_path / "lineage.jsonl", [record(0.0, [[0.0, 1.0]]), record(0.0, [[0.0, 1.0, 1.0]])])
    with pytest.raises(ValueError, match=r"K must be one value"):
        group_stats.report(group_stats.read_groups(path))


def test_the_share_of_lambda_a_inter_per_run_and_step(tmp_path):
    # step 0: group means 0.5 (generation 1) and 0.2 (generation 2) are λ·A_inter/S, so the share is
    # (2·0.5 + 2·0.2) / 2.4; step 1: λ = 0, every group mean is 0: share 0
    first = record(0.0, [[0.0, 1.0], [0.5, 0.5]])
    for skill, a in zip(first["skills"][1:], [1.5, -0.5, 0.2, 0.2]):
        skill["advantage"] = a
    second = {**record(0.0, [[0.0, 1.0], [0.0, 1.0]]), "step": 1}
    for skill, a in zip(second["skills"][1:], [-0.7, 0.7, -0.7, 0.7]):
        skill["advantage"] = a
    groups = group_stats.read_groups(write(tmp_path / "lineage.jsonl", [first, second]))
    assert groups[0]["advantages"] == [[1.5, -0.5], [0.2, 0.2]]
    line = group_stats.inter_share_line("run", groups)
    share = 1.4 / (2.4 + 2.8)
    assert line == (f"run: share of λ·A_inter in the advantage {share:.3f} over 8 candidates; "
                    f"per step: median {1.4 / 2.4 / 2:.3f}, 0.000 to {1.4 / 2.4:.3f} (2 steps)")


def test_records_without_advantages_say_the_share_cannot_be_computed(tmp_path, capsys):
    path = write(tmp_path / "lineage.jsonl", [record(0.0, [[0.0, 1.0]])])   # no "advantage" fields
    assert group_stats.read_groups(path)[0]["advantages"] is None
    assert group_stats.main([str(path)]) == 0
    assert f"{path}: its records hold no advantages" in capsys.readouterr().out
