"""A thinking task model cut off by the reply budget (issue 44): replies that end inside `<think>` (or with
reasoning and no answer) score 0, and the run says so once, with their count and the fix, instead of blaming
the task model; summary.json counts them (`reasoning_cut`, overall and per task type) beside the client's
reasoning tokens.
"""
import json

from minskill import rollout
from minskill.rollout import Trajectory, reasoning_cut_note, summarize
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server


def trajectory(reply: str, reasoning: str, error: str | None = None, task_type: str = "arithmetic"):
    return Trajectory(task_id="t", task_type=task_type, messages=[], reply=reply, reasoning=reasoning, error=error)


def test_the_summary_counts_replies_that_are_all_reasoning():
    trajs = [trajectory("", "hmm, 3 + 4 is"), trajectory("  \n", "maybe", task_type="counting"),
             trajectory("7", "3 + 4 is 7"),                       # thought, then answered: not cut
             trajectory("", ""),                                  # an empty reply without reasoning: not cut
             trajectory("", "thinking", error="ConnectionError: refused")]   # an error is counted apart
    summary = summarize(trajs)
    assert summary["reasoning_cut"] == 2 and summary["errors"] == 1
    assert summary["per_type"]["arithmetic"]["reasoning_cut"] == 1
    assert summary["per_type"]["counting"]["reasoning_cut"] == 1


def test_the_note_gives_the_count_and_both_fixes_and_is_silent_without_cuts():
    note = reasoning_cut_note({"reasoning_cut": 3, "n": 8})
    assert "3 of the 8 replies" in note and "--task-max-tokens" in note
    assert """--task-extra-body '{"chat_template_kwargs": {"enable_thinking": false}}'""" in note
    assert reasoning_cut_note({"reasoning_cut": 0, "n": 8}) is None
    assert reasoning_cut_note({"n": 8}) is None          # a summary written before the count existed


def test_the_evaluation_command_says_once_that_the_replies_were_cut_while_thinking(tmp_path, capsys):
    """It printed the table of 0s and exited 0 with nothing said; an agent suite's note blamed the model."""
    out = tmp_path / "run"
    with start_server(ScriptedBackend(lambda messages, request: "<think> " + "let me think " * 40)) as server:
        client = server.client()
        argv = ["--suite", "qa", "--split", "heldout", "--n-tasks", "4", "--task-max-tokens", "8",
                "--task-url", client.base_url, "--task-model", client.model, "--out", str(out)]
        assert rollout.main(argv) == 0
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert text.count("replies ended inside the task model's reasoning") == 1
    assert "4 of the 4 replies" in text and "larger --task-max-tokens" in text and "enable_thinking" in text
    assert "too weak" not in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reasoning_cut"] == 4 and summary["success_rate"] == 0.0
    assert summary["run"]["client_stats"]["reasoning_tokens"] > 0
