"""measure.oracle_agent: each task's oracle plan played over HTTP through `python -m
minskill.rollout` wins every game; flags it sets itself and single-turn suites are refused."""
import json

import pytest

from minskill.measure import oracle_agent
from minskill.tasks import load_suite, oracle_actions


def test_the_oracle_wins_every_household_game_over_http(tmp_path, capsys):
    out = tmp_path / "run"
    code = oracle_agent.main(["--suite", "household", "--split", "heldout", "--n-tasks", "6",
                              "--out", str(out)])
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    tasks = load_suite("household", split="heldout", n=6)
    assert code == 0 and summary["n"] == 6 and summary["success_rate"] == 1.0
    assert summary["nhr"] == 0.0 and summary["run"]["skills"] == "none"
    mean_steps = sum(len(oracle_actions(t)) for t in tasks) / len(tasks)
    assert summary["mean_steps"] == pytest.approx(mean_steps)
    assert "oracle agent: 6 of 6 games won through HTTP" in printed


def test_a_lost_game_is_counted_and_the_exit_status_says_so(tmp_path, monkeypatch, capsys):
    """An oracle whose plan is cut short loses at the step limit: the status is 1."""
    monkeypatch.setattr(oracle_agent, "oracle_actions", lambda task: oracle_actions(task)[:-1])
    code = oracle_agent.main(["--suite", "household", "--split", "heldout", "--n-tasks", "2",
                              "--max-steps", "12", "--out", str(tmp_path / "run")])
    assert code == 1 and "oracle agent: 0 of 2 games won through HTTP" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--suite", "household", "--skills", "base"], "--skills is set by the oracle agent"),
    (["--suite", "household", "--task-url=http://127.0.0.1:1/v1"], "--task-url is set by"),
    (["--suite", "qa", "--n-tasks", "2"], "multi-turn suites"),
])
def test_what_it_refuses(argv, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        oracle_agent.main(argv + ["--out", str(tmp_path / "run")])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_the_oracle_wins_a_generated_alfworld_game_over_http(tmp_path, monkeypatch, capsys):
    for module in ("textworld", "alfworld", "fast_downward"):
        pytest.importorskip(module)
    monkeypatch.setenv("MINSKILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MINSKILL_ALFWORLD_DATA", raising=False)
    code = oracle_agent.main(["--suite", "alfworld", "--split", "heldout", "--n-tasks", "1",
                              "--out", str(tmp_path / "run")])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert code == 0 and summary["n"] == 1 and summary["success_rate"] == 1.0
