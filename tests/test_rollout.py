"""Rollouts against scripted task models behind the real HTTP server (loopback): skills reach the system
prompt and move success, garbage and HTTP failures become failed tasks, the agent loop plays household and
webwalk episodes, trajectories are appended as JSONL and read back, summaries match hand-computed numbers."""
import json
import re
import threading
import warnings

import pytest

from minskill import rollout
from minskill.files import append_jsonl, read_jsonl
from minskill.paired import wilson_interval
from minskill.rollout import run_rollouts, skill_text, summarize
from minskill.tasks.base import parse_action
from minskill.trajectories import Trajectory, load_trajectories
from minskill.serve.errors import BackendError
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from minskill.tasks import HouseholdEnv, TaskWarning, WebWalkEnv, load_suite, oracle_actions
from minskill.tasks.base import Task

SKILL = "To add two numbers, count up from the first one. End with: The answer is <number>."


def sum_tasks(k=6):
    return [Task(id=f"sum-{a}", type="arithmetic" if a % 2 else "other", question=f"What is {a} + {a + 1}?",
                 answer=str(2 * a + 1), verifier="final") for a in range(k)]


class Recorder:
    """A scripted task model: records every request's messages and answers through `answer`."""

    def __init__(self, answer):
        self.answer, self.seen, self.lock = answer, [], threading.Lock()

    def __call__(self, messages, request):
        with self.lock:
            self.seen.append([dict(m) for m in messages])
        return self.answer(messages, request)


def skilled_model(messages, request):
    """Right only when the skill text is in the system prompt; otherwise a plausible wrong answer."""
    a, b = map(int, re.findall(r"(\d+) \+ (\d+)", messages[-1]["content"])[0])
    has_skill = messages[0]["role"] == "system" and SKILL in messages[0]["content"]
    return f"The answer is {a + b}." if has_skill else f"The answer is {a + b + 1}."


@pytest.fixture
def serve():
    servers = []

    def start(fn, **client_kwargs):
        server = start_server(ScriptedBackend(fn))
        servers.append(server)
        client_kwargs.setdefault("max_retries", 0)
        return server.client(**client_kwargs)

    yield start
    for server in servers:
        server.close()


# ---------------------------------------------------------------------------------------- single-turn

def test_success_moves_with_the_skill(serve):

    model = Recorder(skilled_model)
    client = serve(model)
    tasks = sum_tasks()

    without = run_rollouts(client, tasks, None)
    assert [t.success for t in without] == [False] * 6 and all(t.error is None for t in without)
    # no skill -> no system message at all (the chat template's default system prompt applies)
    assert all(m[0]["role"] == "user" for m in model.seen)
    assert without[0].messages == [{"role": "user", "content": "What is 0 + 1?"},
                                   {"role": "assistant", "content": "The answer is 2."}]

    with_text = run_rollouts(client, tasks, SKILL)
    assert [t.success for t in with_text] == [True] * 6 and [t.reward for t in with_text] == [1.0] * 6
    assert with_text[0].messages[0] == {"role": "system", "content": SKILL}

    # a SkillSet: a task-specific skill reaches only tasks of its type
    skill = Skill(name="add-by-counting", description="How to add two small numbers.", body=SKILL, metadata={})
    skills = SkillSet(general=[], task_specific={"arithmetic": [skill]}, common_mistakes=[])
    assert SKILL in skill_text(skills, "arithmetic") and SKILL not in skill_text(skills, "other")
    typed = run_rollouts(client, tasks, skills)
    assert {t.task_id: t.success for t in typed} == {t.id: t.type == "arithmetic" for t in tasks}
    # a single Skill applies to every type
    assert all(t.success for t in run_rollouts(client, tasks, skill))
    s = summarize(typed)
    assert s["success_rate"] == 0.5 and s["per_type"]["arithmetic"]["success_rate"] == 1.0
    assert s["per_type"]["other"]["success_rate"] == 0.0


def test_n_samples_per_task(serve):
    client = serve(lambda messages, request: "The answer is 1." if request.sample_index == 1 else "no idea")
    trajs = run_rollouts(client, sum_tasks(2), None, n=3, temperature=1.0, seed=7)
    assert [(t.task_id, t.sample, t.success) for t in trajs] == [
        ("sum-0", 0, False), ("sum-0", 1, True), ("sum-0", 2, False),
        ("sum-1", 0, False), ("sum-1", 1, False), ("sum-1", 2, False)]


GARBAGE = ["", "\x00\x01\ufffd", "}{][", "🙂" * 50, "Action: Action: Action:", "\n\n\n", "<|im_end|>"]


def test_garbage_model_fails_tasks_without_crashing(serve):
    client = serve(lambda messages, request: GARBAGE[len(messages[-1]["content"]) % len(GARBAGE)])
    trajs = run_rollouts(client, sum_tasks(), None)
    assert len(trajs) == 6 and not any(t.success for t in trajs)
    assert all(t.error is None and t.reward == 0.0 and t.steps == 1 for t in trajs)


def test_http_error_for_one_task_is_a_failed_task(serve):
    def flaky(messages, request):
        if "3 + 4" in messages[-1]["content"]:
            raise BackendError(503, "overloaded, try later")
        return skilled_model(messages, request)

    trajs = run_rollouts(serve(flaky), sum_tasks(), SKILL)
    failed = [t for t in trajs if t.error]
    assert [t.task_id for t in failed] == ["sum-3"]
    assert "503" in failed[0].error and "overloaded" in failed[0].error
    assert not failed[0].success and failed[0].reward == 0.0
    assert sum(t.success for t in trajs) == 5
    assert summarize(trajs)["errors"] == 1


def test_server_down_fails_every_task(serve):
    server = start_server(ScriptedBackend(lambda m, r: "x"))
    client = server.client(max_retries=0)
    server.close()
    trajs = run_rollouts(client, sum_tasks(2), None)
    assert len(trajs) == 2 and all(t.error and not t.success for t in trajs)


def test_verifier_crash_is_a_failed_task(serve):
    tasks = sum_tasks(2)
    tasks[0].verifier = "no-such-verifier"
    trajs = run_rollouts(serve(skilled_model), tasks, SKILL)
    assert trajs[0].error and "verifier failed" in trajs[0].error and not trajs[0].success
    assert trajs[1].success and trajs[1].error is None


# ---------------------------------------------------------------------------------------- JSONL

def test_jsonl_append_and_reload(serve, tmp_path):
    path = tmp_path / "traj.jsonl"
    seen_on_disk = []

    def progress(done, total, traj):  # each trajectory is on disk before progress hears of it
        seen_on_disk.append(len(path.read_text().splitlines()))

    client = serve(skilled_model)
    first = run_rollouts(client, sum_tasks(3), SKILL, out_path=path, progress=progress)
    assert seen_on_disk == [1, 2, 3]
    second = run_rollouts(client, sum_tasks(2), None, out_path=path)  # appends, never truncates
    loaded = load_trajectories(path)  # in the order they finished; the returned lists are in task order
    assert [t.task_id for t in first] == ["sum-0", "sum-1", "sum-2"]
    key = lambda t: (t.task_id, t.success)
    assert sorted(loaded[:3], key=key) == sorted(first, key=key)
    assert sorted(loaded[3:], key=key) == sorted(second, key=key)
    assert [t.success for t in loaded] == [True] * 3 + [False] * 2
    # a run killed mid-write leaves a torn last line: everything before it is kept
    with open(path, "a") as f:
        f.write('{"task_id": "sum-9", "task_ty')
    assert load_trajectories(path) == loaded
    # a bad line elsewhere is an error naming the file and line
    path.write_text("not json\n" + json.dumps(first[0].to_json()) + "\n")
    with pytest.raises(ValueError, match=r"traj.jsonl:1"):
        load_trajectories(path)


def _one_traj(task_id, reply="The answer is 3."):
    return Trajectory(task_id=task_id, task_type="qa", messages=[{"role": "assistant", "content": reply}],
                      reply=reply)


@pytest.mark.parametrize("lines", [1, 2])
def test_read_jsonl_accepts_a_byte_order_mark(tmp_path, lines):
    path = tmp_path / "traj.jsonl"
    records = [_one_traj(f"t{i}").to_json() for i in range(lines)]
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\r\n" for r in records).encode())
    assert [r for _, r in read_jsonl(path)] == records
    assert [t.task_id for t in load_trajectories(path)] == [f"t{i}" for i in range(lines)]


def test_read_jsonl_reports_invalid_utf8_with_file_and_line(tmp_path):
    path = tmp_path / "traj.jsonl"
    good = json.dumps(_one_traj("t0").to_json()).encode()
    path.write_bytes(good + b"\n" + good.replace(b"t0", b"t\xff") + b"\n" + good + b"\n")
    with pytest.raises(ValueError, match=r"traj.jsonl:2: not UTF-8"):
        read_jsonl(path)
    # a run killed mid-write may cut the last line inside a multi-byte character: dropped like any torn line
    path.write_bytes(good + b"\n" + '{"task_id": "caf\u00e9'.encode()[:-1])
    assert [r["task_id"] for _, r in read_jsonl(path)] == ["t0"]


def test_read_jsonl_keeps_line_separators_inside_json_strings(tmp_path):
    """ensure_ascii=False writes U+2028/U+2029/U+0085 raw; only "\\n" ends a JSONL line."""
    path = tmp_path / "traj.jsonl"
    trajs = [_one_traj("t0", "one\u2028two\u2029three\x85four\x1cfive"), _one_traj("t1")]
    for t in trajs:
        append_jsonl(path, t.to_json())
    assert load_trajectories(path) == trajs


# ---------------------------------------------------------------------------------------- summaries

def traj(task_type, success, steps, nh, error=None):
    return Trajectory(task_id=f"t{steps}{nh}", task_type=task_type, messages=[], success=success,
                      reward=float(success), steps=steps, nothing_happens=nh, error=error)


def test_summarize_hand_checked():
    trajs = [traj("a", True, 4, 1), traj("a", False, 10, 5), traj("a", True, 2, 0),
             traj("b", False, 5, 5, error="HTTP 500"), traj("b", True, 1, 0)]
    s = summarize(trajs, lam_nh=0.5)
    # SR = 3/5; NHR = mean(1/4, 5/10, 0, 5/5, 0) = 1.75/5 = 0.35; R = 0.6 - 0.5*0.35 = 0.425
    assert s["n"] == 5 and s["success_rate"] == pytest.approx(0.6)
    assert s["nhr"] == pytest.approx(0.35) and s["adjusted_reward"] == pytest.approx(0.425)
    assert s["mean_steps"] == pytest.approx(22 / 5) and s["errors"] == 1 and s["lam_nh"] == 0.5
    a, b = s["per_type"]["a"], s["per_type"]["b"]
    assert a["n"] == 3 and a["success_rate"] == pytest.approx(2 / 3)
    assert a["nhr"] == pytest.approx(0.25) and a["adjusted_reward"] == pytest.approx(2 / 3 - 0.125)
    assert a["mean_steps"] == pytest.approx(16 / 3)
    assert b["n"] == 2 and b["success_rate"] == 0.5 and b["nhr"] == 0.5 and b["errors"] == 1
    assert list(s["per_type"]) == ["a", "b"]
    # Wilson 95% for 3/5: center (0.6 + 0.38415)/1.76829 = 0.55667, half 0.37552 (computed by hand)
    lo, hi = s["success_ci95"]
    assert lo == pytest.approx(0.2307, abs=1e-3) and hi == pytest.approx(0.8824, abs=1e-3)
    assert summarize([], lam_nh=0.5) == {"n": 0, "success_rate": 0.0, "success_ci95": [0.0, 1.0], "nhr": 0.0,
                                         "adjusted_reward": 0.0, "mean_reward": 0.0, "mean_steps": 0.0, "errors": 0,
                                         "trimmed": 0, "reasoning_cut": 0, "lam_nh": 0.5, "per_type": {}}


def test_the_evaluation_command_scores_the_reward_the_search_optimises():
    """python -m minskill.rollout --lam-nh defaulted to 0 while evolve_masa.py's search used λ = 0.1."""
    from minskill.masa.search import MasaConfig
    args = rollout._parser().parse_args(["--suite", "qa"])
    assert args.lam_nh == rollout.LAM_NH == MasaConfig().lam_nh == summarize([])["lam_nh"] == 0.1


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(0, 12)
    assert lo == 0.0 and hi == pytest.approx(0.2425, abs=1e-3)  # "0 of 12" still allows up to ~24%
    lo, hi = wilson_interval(100, 100)
    assert hi == 1.0 and lo == pytest.approx(0.963, abs=1e-3)


# ---------------------------------------------------------------------------------------- action parsing

ADMISSIBLE = ["go to desk 1", "go to cabinet 1", "open cabinet 1", "take apple 1 from desk 1", "look",
              "inventory"]


@pytest.mark.parametrize("reply, action", [
    ("Action: go to desk 1.", "go to desk 1"),
    ("> open cabinet 1", "open cabinet 1"),
    ("`go to cabinet 1`", "go to cabinet 1"),
    ('"take apple 1 from desk 1"', "take apple 1 from desk 1"),
    ("Thought: the apple may be on the desk.\nAction: go to desk 1", "go to desk 1"),
    ("I think I should go to desk 1 to find the apple.", "go to desk 1"),
    ("1. go to cabinet 1\n2. open cabinet 1", "go to cabinet 1"),
    ("go to cabnet 1", "go to cabinet 1"),                      # typo, fuzzy-matched
    ("take apple from desk 1", "take apple 1 from desk 1"),     # missing number, fuzzy-matched
    ("Go To  Desk 1", "go to desk 1"),
    ("put apple 1 in cabinet 1", "put apple 1 in cabinet 1"),   # not admissible now: passed through
    ("hello there", "hello there"),                              # no action at all: the env says no
    ("", ""),
])
def test_parse_action_household(reply, action):
    assert parse_action(reply, ADMISSIBLE, HouseholdEnv.action_syntax) == action


@pytest.mark.parametrize("reply, action", [
    ("click About us", "click About us"),
    ("Action: click about us", "click About us"),
    ("answer: 42", "answer 42"),
    ("Answer 42.", "answer 42"),
    ("The answer is Paris", "answer Paris"),                     # free-text action: not fuzzy-matched
    ("back", "back"),
])
def test_parse_action_webwalk(reply, action):
    assert parse_action(reply, ["click About us", "click Home", "back"], WebWalkEnv.action_syntax) == action


def test_skill_text_cases():
    assert skill_text(None) == "" and skill_text("  plain text  ") == "plain text"
    with pytest.raises(TypeError, match="SkillSet, a Skill, a str or None"):
        skill_text(42)


def test_parse_action_misspelt_without_verb():
    assert parse_action("opne cabinet 1", ADMISSIBLE, HouseholdEnv.action_syntax) == "open cabinet 1"
    # a free-text action keeps priority over a later line that matches an admissible action
    assert parse_action("answer 1990\nclick Home", ["click Home"], WebWalkEnv.action_syntax) == "answer 1990"


# ---------------------------------------------------------------------------------------- multi-turn

JUNK = "Let me think about this. I will fly to the moon first!"
DRESS = ["Action: {}", "> {}.", "`{}`", "Thought: that is the next step.\nAction: {}", "I will {} now.", "{}"]


class OracleAgent:
    """A scripted agent behind HTTP. Per episode (told apart by its first user message) it first says
    something that is no action (the env must answer "Nothing happens."), then plays the oracle's
    actions, each dressed differently, checking on the way that the prompt shows what it should."""

    def __init__(self, tasks):
        self.plans = {t.question: oracle_actions(t) for t in tasks}
        self.state, self.calls, self.problems = {}, [], []
        self.lock = threading.Lock()

    def __call__(self, messages, request):
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        question = next(q for q in self.plans if q in first_user)
        plan = self.plans[question]
        with self.lock:
            step = self.state.get(question, 0)
            self.state[question] = step + 1
            self.calls.append((question, step))
        last = messages[-1]["content"]
        if "Allowed actions" not in first_user or "Reply with one action only." not in last:
            self.problems.append(f"prompt lacks the action syntax / instruction: {first_user[:200]!r}")
        if step == 0:
            return JUNK
        if step == 1 and not last.startswith("Observation: Nothing happens."):
            self.problems.append(f"junk was not answered 'Nothing happens.': {last[:200]!r}")
        action = plan[step - 1]
        if not action.startswith("answer") and f"Admissible actions: " not in last or \
                (not action.startswith("answer") and action not in last.split("Admissible actions: ")[1]):
            self.problems.append(f"{action!r} not among the admissible actions shown: {last[-300:]!r}")
        if action.startswith("answer"):  # free text is passed through as is: no trailing words
            return f"Action: {action}"
        return DRESS[step % len(DRESS)].format(action)


@pytest.mark.parametrize("suite", ["household", "webwalk"])
def test_agent_loop_with_an_oracle_agent(serve, suite, tmp_path):

    tasks = load_suite(suite, split="heldout", n=6 if suite == "household" else 3)
    agent = OracleAgent(tasks)
    path = tmp_path / "t.jsonl"
    trajs = run_rollouts(serve(agent), tasks, "Be systematic.", out_path=path, history=2)
    assert agent.problems == []
    assert len(trajs) == len(tasks) and sorted(load_trajectories(path), key=lambda t: t.task_id) == \
        sorted(trajs, key=lambda t: t.task_id)
    assert [t.task_id for t in trajs] == [t.id for t in tasks]
    by_id = {t.task_id: t for t in trajs}
    for task in tasks:
        t, plan = by_id[task.id], oracle_actions(task)
        assert t.error is None and t.success and t.reward == 1.0, (task.id, t.actions, t.observations[-1])
        assert t.steps == len(plan) + 1 and t.nothing_happens == 1
        assert t.actions[1:] == plan and t.observations[1] == "Nothing happens."
        assert len(t.observations) == t.steps + 1
        assert t.messages[0] == {"role": "system", "content": "Be systematic."}
        assert [m["role"] for m in t.messages[1:]] == ["user", "assistant"] * t.steps + ["user"]
    s = summarize(trajs, lam_nh=1.0)
    assert s["success_rate"] == 1.0
    expected_nhr = sum(1 / (len(oracle_actions(t)) + 1) for t in tasks) / len(tasks)
    assert s["nhr"] == pytest.approx(expected_nhr) and s["adjusted_reward"] == pytest.approx(1 - expected_nhr)
    assert set(s["per_type"]) == {t.type for t in tasks}
    # lock-step: every episode's step k is asked before any episode's step k+1
    steps_in_call_order = [step for _, step in agent.calls]
    assert steps_in_call_order == sorted(steps_in_call_order)


def test_agent_loop_step_budget_and_garbage(serve):

    tasks = load_suite("household", split="train", n=2) + load_suite("webwalk", split="train", n=2)
    client = serve(lambda messages, request: GARBAGE[len(messages) % len(GARBAGE)])
    steps = []
    trajs = run_rollouts(client, tasks, None, max_steps=4, on_step=lambda step, live: steps.append((step, live)))
    assert len(trajs) == 4 and steps == [(0, 4), (1, 4), (2, 4), (3, 4)]
    for t in trajs:
        assert t.error is None and not t.success and t.reward == 0.0
        assert t.steps == 4 and t.nothing_happens == 4 and len(t.actions) == 4
        assert t.messages[0]["role"] == "user"  # no skill -> no system prompt in the agent loop either
    s = summarize(trajs, lam_nh=0.5)
    assert s["success_rate"] == 0.0 and s["nhr"] == 1.0 and s["adjusted_reward"] == -0.5


def test_agent_loop_http_error_ends_one_episode(serve):

    tasks = load_suite("webwalk", split="heldout", n=3)
    agent = OracleAgent(tasks)
    doomed = tasks[1].question

    def fn(messages, request):
        if doomed in messages[-1]["content"] or (doomed in messages[0]["content"] and len(messages) > 3):
            raise BackendError(500, "the model crashed")
        return agent(messages, request)

    trajs = {t.task_id: t for t in run_rollouts(serve(fn), tasks, None)}
    bad = trajs[tasks[1].id]
    assert bad.error and "500" in bad.error and "the model crashed" in bad.error and not bad.success
    assert all(trajs[t.id].success and trajs[t.id].error is None for t in (tasks[0], tasks[2]))


# ---------------------------------------------------------------------------------------- the command

def test_evaluation_command(serve, tmp_path, capsys):

    tasks = load_suite("qa", split="heldout", n=8)

    def answer(messages, request):  # right on arithmetic only when the skill is present
        task = next(t for t in tasks if t.question == messages[-1]["content"])
        good = messages[0]["role"] == "system" and "WORKED EXAMPLES" in messages[0]["content"] \
            and task.type == "arithmetic"
        return f"The answer is {task.answer}." if good else "I am not sure."

    client = serve(answer)
    skill_file = tmp_path / "skill.txt"
    skill_file.write_text("WORKED EXAMPLES: 3 + 4 = 7.")
    out = tmp_path / "run"
    argv = ["--suite", "qa", "--skills", str(skill_file), "--split", "heldout", "--n-tasks", "8",
            "--task-url", client.base_url, "--task-model", client.model, "--out", str(out)]
    assert rollout.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| arithmetic | 2 | 1.00 |" in printed and "| counting | 2 | 0.00 |" in printed
    assert "| **all** | 8 | 0.25 |" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 8 and summary["success_rate"] == 0.25
    assert summary["per_type"]["arithmetic"]["success_rate"] == 1.0
    assert summary["run"]["skills"] == str(skill_file) and summary["run"]["split"] == "heldout"
    assert len(load_trajectories(out / "trajectories.jsonl")) == 8

    # an existing run is not overwritten without --resume; --resume runs only what is missing
    with pytest.raises(SystemExit):
        rollout.main(argv)
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    (out / "trajectories.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:30])  # killed mid-line
    assert rollout.main(argv + ["--resume"]) == 0
    resumed = load_trajectories(out / "trajectories.jsonl")
    assert len(resumed) == 8 and len({t.task_id for t in resumed}) == 8
    assert json.loads((out / "summary.json").read_text())["success_rate"] == 0.25

    # --resume with fewer tasks is refused: writing back only its 4 would drop the other 4
    before = (out / "trajectories.jsonl").read_bytes()
    with pytest.raises(SystemExit):
        rollout.main([a if a != "8" else "4" for a in argv] + ["--resume"])
    assert "holds 4 task(s) that this run does not draw" in capsys.readouterr().err
    assert (out / "trajectories.jsonl").read_bytes() == before


def test_evaluation_command_with_replies_holding_lone_surrogates(serve, tmp_path):
    """The string "\\ud800" in a reply (valid JSON, no Unicode text) killed writing trajectories.jsonl."""
    client = serve(lambda messages, request: "The answer is 1.\ud800")
    out = tmp_path / "run"
    assert rollout.main(["--suite", "qa", "--split", "heldout", "--n-tasks", "3", "--task-url", client.base_url,
                         "--task-model", client.model, "--out", str(out)]) == 0
    replies = [t.messages[-1]["content"] for t in load_trajectories(out / "trajectories.jsonl")]
    assert replies == ["The answer is 1.\ufffd"] * 3


def test_evaluation_command_help_and_bad_input(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        rollout.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--suite" in text and "--skills" in text and "--task-url" in text and "Wilson" in text
    with pytest.raises(FileNotFoundError, match="no-such-skills"):
        rollout.load_skills(str(tmp_path / "no-such-skills"), "qa")
    with pytest.raises(SystemExit):
        rollout.main(["--suite", "no-such-suite", "--task-url", "http://127.0.0.1:9/v1", "--out", str(tmp_path)])
    assert "unknown suite" in capsys.readouterr().err


def test_evaluation_command_multi_turn_says_when_nothing_is_solved(serve, tmp_path, capsys):
    client = serve(lambda messages, request: "back")
    out = tmp_path / "ww"
    assert rollout.main(["--suite", "webwalk", "--skills", "base", "--n-tasks", "3", "--max-steps", "2",
                         "--task-url", client.base_url, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "every reward is 0" in captured.out and "| **all** | 3 | 0.00 |" in captured.out
    assert "agent step 2: 3 episodes live" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nhr"] == 1.0 and summary["mean_steps"] == 2.0 and set(summary["per_type"]) == {
        "easy", "medium", "hard"}


# ---------------------------------------------------------------------------------------- libraries for a suite

# MASA's ALFWorld library keys its task-specific skills by these names
MASA_ALFWORLD_KEYS = ["pick_and_place", "pick_two_obj_and_place", "look_at_obj_in_light", "clean", "heat", "cool",
                      "examine"]


def masa_alfworld_library(extra_keys=()):
    return SkillSet(general=[Skill("go-look-first", "Use at the start.", "Look around first.")],
                    task_specific={key: [Skill(f"{key.replace('_', '-')}-plan", f"Use for {key}.", f"Plan for {key}.")]
                                   for key in MASA_ALFWORLD_KEYS + list(extra_keys)})


def test_masa_s_alfworld_keys_reach_every_household_type(recwarn):
    """MASA's keys clean/heat/cool/pick_two_obj_and_place matched no household type: 4 of 6 types got none."""
    skills = rollout.fit_to_suite(masa_alfworld_library(), "household", "lib")
    assert not [w for w in recwarn if issubclass(w.category, TaskWarning)]
    types = load_suite("household", n=6)
    for task in types:
        assert len(skills.task_specific[task.type]) >= 1, task.type
    assert sorted(skills.task_specific) == sorted({t.type for t in types})
    # examine and look_at_obj_in_light both hold the lamp task's skills, in the library's order
    assert [s.name for s in skills.task_specific["look_at_obj_in_light"]] == ["look-at-obj-in-light-plan",
                                                                               "examine-plan"]
    assert "Plan for clean." in skill_text(skills, "pick_clean_then_place")
    assert "Plan for pick_two_obj_and_place." in skill_text(skills, "pick_two_obj")


def test_a_library_whose_keys_match_no_type_of_the_suite_is_a_warning_naming_them(tmp_path):
    library = masa_alfworld_library(extra_keys=["slice"])
    with pytest.warns(TaskWarning, match=r"lib: task-specific skills for 'slice' match no task type of "
                                                 r"suite household"):
        kept = rollout.fit_to_suite(library, "household", "lib")
    assert kept.task_specific["slice"] == library.task_specific["slice"]   # kept (saved again), never shown
    with pytest.warns(TaskWarning, match=r"'arithmetic'.*match no task type of suite webwalk"):
        rollout.fit_to_suite(SkillSet.load(rollout.BASE_SKILLS_DIR / "qa"), "webwalk", "qa-base")
    qa = SkillSet.load(rollout.BASE_SKILLS_DIR / "qa")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)
        assert rollout.fit_to_suite(qa, "qa", "qa-base") is qa   # a library for its suite: as it is


def test_every_loader_of_a_library_for_a_suite_reads_it_for_the_suite(tmp_path):
    """--skills (rollout, train_grpo, rewrite), --base-skills (evolve_masa), --libraries (transfer)."""
    import evolve_masa
    from minskill.measure import transfer
    folder = masa_alfworld_library(extra_keys=["slice"]).save(tmp_path / "masa-lib")
    with pytest.warns(TaskWarning, match="'slice'"):
        loaded = [rollout.load_skills(str(folder), "household"),
                  evolve_masa.load_base_skills(evolve_masa.build_parser().parse_args(
                      ["--suite", "household", "--base-skills", str(folder)])),
                  transfer.load_library(str(folder), "household").skills]
    for skills in loaded:
        assert "Plan for heat." in skill_text(skills, "pick_heat_then_place")
