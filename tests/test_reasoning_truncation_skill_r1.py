"""A thinking task model cut off by the reply budget in Skill-R1 (issue 44): train_grpo.py's metrics.jsonl rows (and
probes, and --eval's rows) count the task model's reasoning tokens and the replies that ended inside their reasoning;
the run says so once with the count and both fixes, and its all-zero note names the budget, not a weak task model;
the report shows them. MASA stage 1 says it too."""
import io
import json
from contextlib import redirect_stdout

import pytest

import evolve_masa
import train_grpo
from helpers import argv, common_flags, read_rows
from minskill.report.__main__ import write_report
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server

CUT = "replies ended inside the task model's reasoning"
EXTRA_BODY = """--task-extra-body '{"chat_template_kwargs": {"enable_thinking": false}}'"""


def thinking(messages, request):   # never closes its <think>: the reply budget cuts every reply inside it
    return "<think> " + "let me think about this " * 20


@pytest.fixture(scope="module")
def task_url():
    with start_server(ScriptedBackend(thinking, name="thinker")) as server:
        yield server.url


@pytest.fixture(scope="module")
def thinking_run(editor_dir, suite_file, task_url, tmp_path_factory):
    """2 training steps, a held-out probe before the first and after the last; (out folder, printed text)."""
    out = tmp_path_factory.mktemp("run")
    flags = common_flags(editor_dir, suite_file, task_url, out) + [
        "--steps", "2", "--probe-every", "2", "--probe-instances", "1", "--probe-candidates", "2",
        "--eval-instances", "1", "--eval-tasks", "2"]
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        assert train_grpo.main(flags) == 0
    return out, buffer.getvalue()


def test_metrics_rows_and_probes_count_reasoning_tokens_and_replies_cut_inside_their_reasoning(thinking_run):
    out, _ = thinking_run
    rows = read_rows(out)
    for row in rows:
        assert row["task_reasoning_tokens"] > 0 and row["task_reasoning_tokens"] <= row["task_completion_tokens"]
        assert 0 < row["reasoning_cut"] == row["rollouts"]   # every reply was all thinking
    probes = [p for row in rows for p in row["probes"]]
    assert probes and all(0 < p["reasoning_cut"] == p["rollouts"] for p in probes)
    assert all(p["task_usage"]["reasoning_tokens"] > 0 for p in probes)


def test_the_run_says_once_with_the_count_and_both_fixes_and_does_not_blame_the_task_model(thinking_run):
    out, printed = thinking_run
    rows = read_rows(out)
    # the first step's line (not every step's), and the end note: all of the run's replies
    assert printed.count(CUT) == 2, printed
    total = sum(r["rollouts"] for r in rows)
    assert f"{total} of the {total} replies" in printed.split("done: ")[1]
    assert "larger --task-max-tokens" in printed and EXTRA_BODY in printed
    end = printed.split("done: ")[1]
    assert "every reward was 0, and" in end and "stronger task model" not in printed


def test_the_report_shows_the_reasoning_tokens_and_the_cut_replies(thinking_run):
    out, _ = thinking_run
    rows = read_rows(out)
    html = write_report(out).read_text()
    total = sum(r["rollouts"] for r in rows)
    assert f"{sum(r['task_reasoning_tokens'] for r in rows)} of the completion tokens were reasoning" in html
    assert f"{total} of {total} replies ended inside their reasoning" in html


def test_eval_rows_count_the_cut_replies_and_the_table_says_it_once(editor_dir, suite_file, task_url, tmp_path,
                                                                    capsys):
    out = tmp_path / "eval"
    flags = common_flags(editor_dir, suite_file, task_url, out) + ["--eval", "--eval-instances", "1",
                                                                   "--eval-tasks", "2"]
    assert train_grpo.main(flags) == 0
    printed = capsys.readouterr().out
    assert printed.count(CUT) == 2   # when first seen (the first row), and under the table
    assert "stronger task model" not in printed and EXTRA_BODY in printed
    rows = json.loads((out / "eval.json").read_text())["rows"]
    assert rows and all(0 < r["reasoning_cut"] == r["rollouts"] for r in rows if r["eval_calls"])
    assert rows[1]["rollouts"] == 0 and rows[1]["scores"] == rows[0]["scores"]   # the seed row: no skill's, not rerun


def test_masa_stage_1_says_once_that_the_targets_replies_were_cut_while_thinking(env, tmp_path, capsys):
    """Every skill set scored 0 and the run said nothing of why."""
    with start_server(ScriptedBackend(thinking, name="target-a")) as target:
        args = argv({**env, "a": target.url}, tmp_path / "run", "--iterations", "2", "--tree-iterations", "1",
                    "--n-heldout", "0")
        assert evolve_masa.main(args) == 0
    printed = capsys.readouterr()
    assert printed.err.count(CUT) == 1                     # during the search, once
    end = printed.out.split("MASA stage 1 on")[1]
    assert end.count(CUT) == 1 and "larger --task-max-tokens" in end and EXTRA_BODY in end
