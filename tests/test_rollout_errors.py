"""What a run must not hide: rollouts that ended with an error are counted apart from the tasks the
model got wrong, a run whose every rollout errored (the task model unreachable) exits non-zero
naming the first error, in the evaluation command, the transfer matrix, evolve_masa.py's held-out
table and rewrite.py's comparison; and an agent prompt that outgrows the task model's context is
trimmed (oldest exchanges first, the system prompt and the task kept) and counted, never a silent 0.
Scripted task models behind the real HTTP server (loopback)."""
import io
import json
import socket
import threading
from contextlib import redirect_stderr, redirect_stdout

import pytest

import evolve_masa
from helpers import argv as masa_argv, read, run_rewrite_compare, skill, target_fn
from minskill import rollout
from minskill.measure import transfer
from minskill.report.masa import heldout_section
from minskill.report.provenance import load_transfer
from minskill.report.transfer import render_transfer
from minskill.rollout import Trajectory, all_failed, load_trajectories, run_rollouts, summarize
from minskill.serve.client import ChatClient, ChatError
from minskill.serve.errors import BackendError
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet
from minskill.tasks import load_suite, oracle_actions


@pytest.fixture
def no_backoff(monkeypatch):
    """The client's retries of a refused connection, without their waits."""
    monkeypatch.setattr(ChatClient, "backoff_delay", lambda self, attempt, retry_after=0.0: 0.0)


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def run_main(main, argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- the evaluation command

def test_an_unreachable_task_model_exits_non_zero_naming_the_first_error(tmp_path, no_backoff):
    url, out = closed_port_url(), tmp_path / "run"
    code, stdout, stderr = run_main(rollout.main, ["--suite", "qa", "--n-tasks", 3,
                                                   "--task-url", url, "--task-model", "m",
                                                   "--out", out])
    assert code == 1
    assert ("every one of the 3 rollouts ended with an error" in stderr
            and url.removesuffix("/v1") in stderr)
    assert "connection failed" in stderr and "--resume" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 3 and summary["errors"] == 3  # written, so the failure can be read back
    assert all(t.error for t in load_trajectories(out / "trajectories.jsonl"))


def test_some_failed_requests_are_counted_apart_and_resume_runs_them_again(tmp_path):
    tasks = load_suite("qa", split="heldout", n=6)
    doomed = {tasks[1].question, tasks[4].question}
    seen, lock = [], threading.Lock()

    def flaky(messages, request):
        with lock:
            seen.append(messages[-1]["content"])
        if messages[-1]["content"] in doomed and flaky.down:
            raise BackendError(400, "the model is being reloaded")
        task = next(t for t in tasks if t.question == messages[-1]["content"])
        return f"The answer is {task.answer}." if task.type == "arithmetic" else "no idea"
    flaky.down = True

    out = tmp_path / "run"
    with start_server(ScriptedBackend(flaky)) as server:
        flags = ["--suite", "qa", "--n-tasks", 6, "--task-url", server.url,
                 "--task-model", "scripted", "--out", out]
        code, stdout, _ = run_main(rollout.main, flags)
        assert code == 0      # some scored: a result, with its errors counted apart
        summary = json.loads((out / "summary.json").read_text())
        wrong = sum(t.error is None and not t.success
                    for t in load_trajectories(out / "trajectories.jsonl"))
        assert (summary["errors"] == 2 and summary["n"] == 6
                and wrong == 6 - 2 - round(6 * summary["success_rate"]))
        all_row = next(line for line in stdout.splitlines() if line.startswith("| **all** |"))
        assert (all_row.startswith(f"| **all** | 6 | {summary['success_rate']:.2f} |")
                and all_row.endswith("| 2 |"))
        assert "2 of the 6 trajectories ended with an error and were not scored" in stdout
        # --resume runs the two failed tasks again, and only them
        flaky.down, before = False, len(seen)
        code, stdout, _ = run_main(rollout.main, flags + ["--resume"])
    assert code == 0 and sorted(seen[before:]) == sorted(doomed)
    resumed = load_trajectories(out / "trajectories.jsonl")
    assert len(resumed) == 6 and all(t.error is None for t in resumed)
    assert json.loads((out / "summary.json").read_text())["errors"] == 0


def test_all_failed_says_so_only_when_nothing_was_scored():
    bad = Trajectory(task_id="a", task_type="t", messages=[], error="ChatError: connection refused")
    good = Trajectory(task_id="b", task_type="t", messages=[])
    assert all_failed([]) is None and all_failed([bad, good]) is None and all_failed([good]) is None
    assert ("every one of the 2 rollouts" in all_failed([bad, bad])
            and "connection refused" in all_failed([bad, bad]))


# ------------------------------------------------------------------------------ the agent's context

def serve_agent(tasks, max_context: int, wander: int, log: list):
    """A server of `max_context` words per prompt whose agent looks around `wander` times, then
    plays the task's oracle plan; `log` gets every prompt it answers. Steps are counted per task as
    they are answered (a refused prompt never reaches the agent), so the plan survives trimmed
    prompts."""
    plans = {t.question: ["look"] * wander + oracle_actions(t) for t in tasks}
    step, lock = {q: 0 for q in plans}, threading.Lock()

    def agent(messages, request):
        first = next(m["content"] for m in messages if m["role"] == "user")
        question = next(q for q in plans if q in first)
        with lock:
            log.append([dict(m) for m in messages])
            action, step[question] = plans[question][step[question]], step[question] + 1
        return action
    return start_server(ScriptedBackend(agent, max_context=max_context))


def words(messages) -> int:
    return sum(len(m["content"].split()) for m in messages)


def test_a_prompt_outgrowing_the_context_is_trimmed_oldest_first_and_counted():
    tasks, system = load_suite("household", split="heldout", n=2), "Be systematic."
    full = []
    with serve_agent(tasks, 100000, 6, full) as server:
        untrimmed = run_rollouts(server.client(max_retries=0), tasks, system)
    assert all(t.success and t.trimmed == 0 and t.history_kept is None for t in untrimmed)
    first, longest = min(map(words, full)), max(map(words, full))
    # the first steps fit; the later ones, with all 8 exchanges, do not
    limit = (first + longest) // 2
    # one past exchange always fits
    assert longest >= limit > max(words(p) for p in full if len(p) <= 4)

    answered = []
    with serve_agent(tasks, limit, 6, answered) as server:
        trajs = run_rollouts(server.client(max_retries=0), tasks, system)
    # on the old code: HTTP 400 at the step that outgrew it, reward 0
    for task, t in zip(tasks, trajs):
        assert t.error is None and t.success and t.reward == 1.0, t.error
        assert t.trimmed >= 1 and 1 <= t.history_kept < 8
        assert t.steps == len(oracle_actions(task)) + 6
    assert summarize(trajs)["trimmed"] == 2 and summarize(trajs)["errors"] == 0
    # what reached the model: within its context, head kept, newest last
    for prompt in answered:
        assert words(prompt) < limit
        assert prompt[0] == {"role": "system", "content": system}
        # the task's turn
        assert any(prompt[1]["content"].startswith(t.messages[1]["content"]) for t in trajs)
    # the trimmed prompts kept the newest exchanges: their last observation is the episode's latest
    for t in trajs:
        last = [p for p in answered if t.messages[1]["content"] == p[1]["content"]][-1]
        # (+ the admissible actions)
        assert last[-1]["content"].startswith(t.messages[-3]["content"])
        assert last[-2]["content"] == t.messages[-4]["content"]
        assert len(last) == 2 + 2 * t.history_kept


def test_a_prompt_that_cannot_fit_is_an_error_saying_so():
    tasks = load_suite("household", split="heldout", n=2)
    with serve_agent(tasks, 100, 0, []) as server:   # the task alone outgrows 100 words
        trajs = run_rollouts(server.client(max_retries=0), tasks, "Be systematic.")
    for t in trajs:
        assert not t.success and t.steps == 0 and t.trimmed == 0
        assert "prompt too long for the task model's context" in t.error
        assert ("the system prompt and the task alone do not fit" in t.error
                and "HTTP 400" in t.error)
    assert summarize(trajs)["errors"] == 2


def test_another_400_is_not_taken_for_a_prompt_to_trim():
    tasks = load_suite("household", split="heldout", n=1)
    calls = []

    def refuse(messages, request):
        calls.append(1)
        if len(messages) > 3:
            raise BackendError(400, "'temperature' must be a number")
        return "look"
    with start_server(ScriptedBackend(refuse)) as server:
        [t] = run_rollouts(server.client(max_retries=0), tasks, "Be systematic.")
    assert t.trimmed == 0 and "'temperature' must be a number" in t.error and len(calls) == 2


def test_the_task_sides_and_the_teachers_refusal_are_the_same_check():
    from minskill import agent_loop
    from minskill.masa import teacher
    assert teacher.is_context_refusal is agent_loop.is_context_refusal
    refusal = ChatError("the request exceeds the available context size, try increasing it", 400,
                        "http://x/v1")
    assert agent_loop.is_context_refusal(refusal) and not agent_loop.is_context_refusal(RuntimeError("x"))


# ------------------------------------------------------------------------------ the transfer matrix

def test_a_transfer_cell_whose_target_never_answers_stops_the_run_and_resume_scores_it(tmp_path):
    suite = tmp_path / "codes.jsonl"
    suite.write_text("".join(json.dumps({"id": f"c{i}", "type": "code", "split": "heldout",
                                         "answer": str(i), "question": f"What is code {i}?"})
                             + "\n" for i in range(4)))
    SkillSet(general=[skill("tip", "Answer with the number.")]).save_json(tmp_path / "tip.json")

    def answers(messages, request):
        return messages[-1]["content"].split()[-1].rstrip("?")

    def down(messages, request):
        raise BackendError(400, "no model is loaded")

    def half(messages, request):
        if messages[-1]["content"].endswith("3?"):
            raise BackendError(400, "no model is loaded")
        return answers(messages, request)

    out = tmp_path / "matrix"
    up, dead, flaky = (start_server(ScriptedBackend(fn, name="m")) for fn in (answers, down, half))
    with up, dead, flaky:
        flags = ["--suite", suite, "--n-heldout", 4, "--libraries", f"tip={tmp_path / 'tip.json'}",
                 "--target-model", "up=m", "down=m", "--out", out, "--targets", f"up={up.url}"]
        code, stdout, stderr = run_main(transfer.main, flags + [f"down={dead.url}"])
        assert code == 1       # on the old code: 0, the cell saved as a success of 0.00
        assert ("every one of the 4 rollouts ended with an error" in stderr
                and "no model is loaded" in stderr)
        assert "tip on target down" in stderr and "--resume" in stderr
        run = json.loads((out / "transfer.json").read_text())
        assert (not run["complete"]
                and [(c["library"], c["target"]) for c in run["cells"]] == [("tip", "up")])
        code, stdout, stderr = run_main(transfer.main, ["--resume", "--out", out, "--targets",
                                                        f"up={up.url}", f"down={flaky.url}"])
    assert code == 0, stderr
    cells = {c["target"]: c for c in json.loads((out / "transfer.json").read_text())["cells"]}
    assert (cells["up"]["errors"] == 0 and cells["down"]["errors"] == 1
            and cells["down"]["success"] == 0.75)
    assert "[1 errors]" in stdout
    page = render_transfer(load_transfer(out))
    assert "1 errors" in page and "1 rollouts ended with an error" in page


# ----------------------------------------------------------------------------------- evolve_masa.py

def test_a_held_out_split_the_target_never_answers_is_no_table_and_exits_non_zero(env, tmp_path):
    heldout = {json.loads(line)["question"] for line in env["suite"].read_text().splitlines()
               if json.loads(line)["split"] == "heldout"}

    def target(messages, request):
        if messages[-1]["content"] in heldout:
            raise BackendError(400, "the target went away")
        return target_fn(messages, request)

    out = tmp_path / "masa"
    with start_server(ScriptedBackend(target, name="target-a")) as server:
        env = {**env, "a": server.url}
        code = evolve_masa.main(masa_argv(env, out, "--no-cache"))
    assert code == 1       # on the old code: 0, with a held-out table of 0.00s
    results = read(out, "results.json")
    assert "heldout" not in results and "the target went away" in results["heldout_error"]
    assert "every one of the 12 rollouts ended with an error" in results["heldout_error"]
    assert not (out / "heldout.md").exists() and (out / "library.json").exists()
    assert "the target went away" in str(heldout_section(results))


def test_the_held_out_table_and_report_count_errors_apart():
    def trajs(errors):
        return [Trajectory(task_id=f"t{i}", task_type="sum", messages=[], success=i == 0,
                           reward=float(i == 0), steps=1,
                           error="HTTP 503" if i < errors + 1 and i else None) for i in range(4)]
    base, evolved = summarize(trajs(0)), summarize(trajs(2))
    table = evolve_masa.heldout_table(base, evolved, {})
    assert table.splitlines()[0].endswith("| errors base | errors evolved |")
    assert (table.splitlines()[2].endswith("| 0 / 0 | 0 | 2 |")
            and table.splitlines()[3].endswith("| 0 / 0 | 0 | 2 |"))
    page = str(heldout_section({"heldout": {"base": base, "evolved": evolved, "gained_lost": {}}}))
    assert "errors evolved" in page and '<td class="num">2</td>' in page


# ------------------------------------------------------------------------------- rewrite.py, --eval

def test_rewrite_compare_stops_non_zero_when_the_task_model_never_answers(trained, files):
    tasks = files["root"] / "errors-tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"What is {i} + {i}?",
                                         "answer": str(2 * i), "type": "sum"}) + "\n"
                             for i in range(3)))
    teacher_set = {"general_skills": [{"skill_id": "tip", "title": "Tip", "principle": "Sum tip.",
                                       "when_to_apply": "Always."}]}

    def script(messages, request):
        if "one shot" in messages[-1]["content"].lower() or "## Task:" in messages[-1]["content"]:
            return json.dumps(teacher_set)  # the teacher answers; the task model never
        raise BackendError(400, "the task model is not loaded")

    with start_server(ScriptedBackend(script)) as server:
        out = files["root"] / "errors-compared"
        code, stdout, stderr = run_rewrite_compare(trained[0], files, tasks, out, server.url)
    assert code == 1        # on the old code: 0, a table of 0.00s
    assert "'input' skills were not scored" in stderr and "the task model is not loaded" in stderr
    assert not (files["root"] / "errors-compared-compare" / "compare.json").exists()


def test_eval_rows_stop_when_every_rollout_errored():
    from types import SimpleNamespace
    from minskill.skill_r1.evaluate import TaskModelFailed, success
    tasks = load_suite("qa", split="heldout", n=4)
    args = SimpleNamespace(rollouts=1, task_temperature=0.0, task_max_tokens=8, seed=0)

    def some(messages, request):
        if messages[-1]["content"] == tasks[0].question:
            raise BackendError(400, "no slot")
        return "no idea"
    with start_server(ScriptedBackend(some)) as server:
        # some errors: scored
        rate, _, scores = success(server.client(max_retries=0), [""], [tasks], args)
        assert rate == 0.0 and scores == [[0.0] * 4]
    def none(messages, request):
        raise BackendError(400, "no slot")
    with start_server(ScriptedBackend(none)) as server:
        with pytest.raises(TaskModelFailed, match="every one of the 4 rollouts.*no slot"):
            success(server.client(max_retries=0), [""], [tasks], args)
