"""Training and search count the rollouts that ended with an error apart from the tasks the model
got wrong, and stop non-zero naming the first error when every rollout of a step, a probe or an
evaluation errored (the task model unreachable), rather than train or search on rewards of 0:
train_grpo.py (its metrics.jsonl rows, its held-out probe) and MASA's search (MasaSearch,
evolve_masa.py). Scripted task models behind the real HTTP server (loopback)."""
import io
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import evolve_masa
from helpers import argv as masa_argv, common_flags, keyword_task_model, read_rows, skill
from minskill.masa import search as masa
from minskill.masa.model_card import ModelCard
from minskill.serve.errors import BackendError
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet
from minskill.tasks import Task

import train_grpo

ROOT = Path(__file__).resolve().parents[1]


def failing(answer, fails):
    """A scripted task model that raises BackendError (HTTP 400, not retried) for the requests
    `fails(messages)` picks and answers the others with `answer`; `.raised` counts the refusals."""
    lock = threading.Lock()

    def model(messages, request):
        if fails(messages):
            with lock:
                model.raised += 1
            raise BackendError(400, "the task model is being reloaded")
        return answer(messages, request)
    model.raised = 0
    return model


def test_a_training_run_counts_its_errored_rollouts_in_each_row_and_probe(editor_dir, suite_file,
                                                                          tmp_path):
    # the seed skill "" is no system prompt: its rollouts fail, on every instance of every step
    model = failing(keyword_task_model, lambda messages: messages[0]["role"] != "system")
    extra = ["--steps", "2", "--probe-every", "2", "--probe-instances", "1",
             "--eval-instances", "1", "--eval-tasks", "2"]
    printed = io.StringIO()
    with start_server(ScriptedBackend(model, name="flaky")) as server, redirect_stdout(printed):
        flags = common_flags(editor_dir, suite_file, server.url, tmp_path) + extra
        assert train_grpo.main(flags) == 0
    rows = read_rows(tmp_path)
    probes = [pr for r in rows for pr in r["probes"]]
    assert [pr["after_steps"] for pr in probes] == [0, 2]
    # every refused request is one rollout counted, in the step's row or in a probe
    assert all(r["errors"] > 0 for r in rows)       # on the old code: no "errors" field
    assert sum(r["errors"] for r in rows) + sum(pr["errors"] for pr in probes) == model.raised
    step_lines = [line for line in printed.getvalue().splitlines() if line.startswith("step ")]
    notes = [f"({r['errors']} rollouts ended with an error, scored 0)" for r in rows]
    assert len(step_lines) == 2 and all(n in line for n, line in zip(notes, step_lines))


def test_a_step_whose_every_rollout_errored_stops_the_run_naming_the_error(editor_dir, suite_file,
                                                                           tmp_path):
    with start_server(ScriptedBackend(failing(keyword_task_model, lambda m: True))) as server:
        done = subprocess.run([sys.executable, "train_grpo.py",
                               *common_flags(editor_dir, suite_file, server.url, tmp_path / "run"),
                               "--steps", "2"], cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr   # on the old code: 0, trained on zeros
    assert "train_grpo.py: training step 1: every one of the" in done.stderr
    assert "the task model is being reloaded" in done.stderr and "Traceback" not in done.stderr
    # nothing recorded as a step of 0s, no checkpoint
    assert read_rows(tmp_path / "run") == [] and not (tmp_path / "run" / "checkpoint").exists()


def test_a_probe_whose_every_rollout_errored_stops_the_run(editor_dir, suite_file, tmp_path):
    """A fresh run probes before its first step: the probe meets the failing model first."""
    with start_server(ScriptedBackend(failing(keyword_task_model, lambda m: True))) as server:
        flags = common_flags(editor_dir, suite_file, server.url, tmp_path) + [
            "--steps", "1", "--probe-every", "1", "--probe-instances", "1", "--eval-instances", "1",
            "--eval-tasks", "2"]
        with pytest.raises(train_grpo.TaskModelFailed,
                           match="the held-out probe: every one of the .*being reloaded"), \
                redirect_stdout(io.StringIO()):
            train_grpo.main(flags)
    assert read_rows(tmp_path) == []


def test_a_masa_evaluation_whose_every_rollout_errored_stops_the_search():
    tasks = [Task(id=f"t{i}", type="sum", question=f"What is {i} plus {i}?", answer=str(2 * i))
             for i in range(3)]
    with start_server(ScriptedBackend(failing(lambda m, r: "4", lambda m: True))) as server:
        search = masa.MasaSearch(server.client(max_retries=0), None, ModelCard(name="m"), tasks,
                                 SkillSet([skill("tip", "Add.")], {}, []), masa.MasaConfig())
        with pytest.raises(masa.TargetFailed, match="every one of the 3 rollouts.*being reloaded"):
            next(search.run())     # the base skills: on the old code R = 0 and the climb went on
    assert search.climb is None


def test_evolve_masa_stops_non_zero_when_the_target_answers_nothing(env, tmp_path):
    out = tmp_path / "masa"
    code, err = evolve_masa_on_a_dead_target(env, out)
    assert code == 1                                 # on the old code: 0, a library of R = 0
    assert "FAILED: the preliminary rollouts: every one of the 2 rollouts" in err
    assert "being reloaded" in err and "--resume" in err
    assert not (out / "results.json").exists() and not (out / "model_card.json").exists()


def test_evolve_masa_stops_when_the_base_skills_evaluation_all_errored(env, tmp_path):
    """No preliminary tasks: the first evaluation is the base skills' (on the old code: R = 0)."""
    out = tmp_path / "masa"
    code, err = evolve_masa_on_a_dead_target(env, out, "--n-prelim", "0")
    assert code == 1 and "FAILED: every one of the" in err
    assert not (out / "results.json").exists()


def evolve_masa_on_a_dead_target(env, out, *flags) -> tuple[int, str]:
    """(exit code, stderr) of evolve_masa.py against a target that refuses every request (HTTP 400)."""
    target = failing(lambda m, r: "1", lambda m: True)
    with start_server(ScriptedBackend(target, name="target-a")) as server:
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            code = evolve_masa.main(masa_argv({**env, "a": server.url}, out, "--no-cache", *flags))
    return code, err.getvalue()
