"""The web agent's tools through OpenAI's `tools` field (minskill/web/agent_calls.py) on the
generated website (tests/website.py): a scripted model that calls the tools along each task's
oracle path (Hermes <tool_call>s, which the server parses) reaches every answer, each result back
as a `tool` turn with its call's id; where the server refuses `tools`, auto mode goes on in the
ReAct format for the rest of the run and says so once; a malformed call is a tool error the agent
sees and the run counts; --tool-calls and --tool-choice are checked flags."""
import json

import pytest

from minskill import rollout
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.tasks import load_suite, make_env, oracle_actions
from minskill.tasks.webagent import tool_call_counts
from website import Website


@pytest.fixture(scope="module")
def site():
    website = Website(n_sites=2).start()
    yield website
    website.close()


@pytest.fixture
def web_env(site, monkeypatch):
    """A run against the site: loopback allowed, its search endpoint, the tool-call defaults (set,
    so that what a flag sets is undone after the test)."""
    for variable in ("MINSKILL_WEB_TOOLS", "MINSKILL_OBSERVATION_CHARS", "MINSKILL_JUDGE_URL",
                     "MINSKILL_WEB_ALLOW_ONLY", "MINSKILL_WEB_TIMEOUT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("MINSKILL_WEB_ALLOW", "127.0.0.1")
    monkeypatch.setenv("MINSKILL_SEARCH_URL", site.url)
    monkeypatch.setenv("MINSKILL_TOOL_CALLS", "auto")
    monkeypatch.setenv("MINSKILL_TOOL_CHOICE", "required")
    return monkeypatch


@pytest.fixture
def suite(site, tmp_path):
    return site.write_tasks(tmp_path / "webwalkerqa.jsonl")


@pytest.fixture
def tasks(suite):
    return load_suite(f"web:{suite}", split="all")


def task_of(tasks, messages):
    first = next(m["content"] for m in messages if m["role"] == "user")
    return next(t for t in tasks if f"Question: {t.question}\n" in first)


def as_call(action: str) -> str:
    """An oracle action (visit[URL], answer[text]) as a Qwen model writes the call."""
    verb, argument = action[:-1].split("[", 1)
    call = {"name": verb, "arguments": {{"visit": "url", "answer": "answer"}[verb]: argument}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def calling_model(tasks, seen: list):
    """A scripted model that calls the tools along its task's oracle path (every step in its prompt:
    history=None) and records what each request held."""
    def reply(messages, request):
        seen.append((messages, request.tool_use))
        plan = oracle_actions(task_of(tasks, messages))
        return "Let me look.\n" + as_call(plan[sum(m["role"] == "assistant" for m in messages)])
    return reply


def test_the_oracle_path_through_tool_calls_reaches_every_answer(tasks, web_env):
    web_env.setenv("MINSKILL_TOOL_CALLS", "openai")
    web_env.setenv("MINSKILL_TOOL_CHOICE", "auto")      # (a scripted model cannot be constrained)
    web_env.setenv("MINSKILL_OBSERVATION_CHARS", "700")
    seen = []
    with start_server(ScriptedBackend(calling_model(tasks, seen), max_context=100000)) as server:
        trajs = rollout.run_rollouts(server.client(max_retries=0), tasks, None, history=None)
    assert [t.success for t in trajs] == [True] * len(tasks) and all(t.error is None for t in trajs)
    # every request offered the task's tools by their schemas
    for _, use in seen:
        assert use.choice == "auto" and [t["function"]["name"] for t in use.tools] == [
            "visit", "answer"]
        assert use.tools[0]["function"]["parameters"]["required"] == ["url"]
    # the calls are the trajectory's actions, their results its observations, counted as ReAct's
    for task, traj in zip(tasks, trajs):
        assert traj.actions == oracle_actions(task) and traj.nothing_happens == 0
        calls, results = traj.messages[1::2], traj.messages[2::2]
        assert all(m["role"] == "assistant" and m["content"] == "Let me look." for m in calls)
        assert [m["tool_call_id"] for m in results] == [m["tool_calls"][0]["id"] for m in calls]
        assert [m["content"] for m in results] == [o.strip() for o in traj.observations[1:]]
        assert all(len(m["content"]) <= 800 for m in results[:-1])      # the observation budget
        assert traj.observations[-1].endswith("(exact match 1, F1 1.00)")
    assert tool_call_counts(trajs)["visit"] == {
        "calls": sum(len(oracle_actions(t)) - 1 for t in tasks), "errors": 0}
    # the server got each result as a tool turn answering the call before it, by the server's id
    later = [messages for messages, _ in seen if len(messages) > 1]
    assert later and all(m[-1]["role"] == "tool" and m[-1]["tool_call_id"].startswith("call_")
                         and m[-1]["tool_call_id"] == m[-2]["tool_calls"][0]["id"] for m in later)


def test_auto_goes_on_as_react_where_the_server_refuses_tools(tasks, web_env, capsys):
    """A ScriptedBackend refuses tool_choice "required" (the default) with a 400 naming 'tools', as
    llama.cpp without --jinja refuses any `tools`."""
    seen = []

    def react_model(messages, request):     # a ReAct-style model: a thought, then the action
        seen.append(request.tool_use)
        plan = oracle_actions(task_of(tasks, messages))
        return f"Thought: go on.\nAction: {plan[sum(m['role'] == 'assistant' for m in messages)]}"
    with start_server(ScriptedBackend(react_model, max_context=100000)) as server:
        client = server.client(max_retries=0)
        first = rollout.run_rollouts(client, tasks[:3], None, history=None)
        again = rollout.run_rollouts(client, tasks[3:5], None, history=None)   # the same run
    assert all(t.success and t.error is None for t in first + again)
    assert seen and all(use is None for use in seen)
    assert [m["role"] for m in first[0].messages[:3]] == ["user", "assistant", "user"]
    # only the first round's requests were refused, and said so once
    assert client.stats["failures"] == 3
    assert capsys.readouterr().err.count("refuses OpenAI's `tools` field") == 1


def test_openai_mode_does_not_fall_back(tasks, web_env):
    web_env.setenv("MINSKILL_TOOL_CALLS", "openai")
    with start_server(ScriptedBackend(lambda messages, request: "answer[x]")) as server:
        [traj] = rollout.run_rollouts(server.client(max_retries=0), tasks[:1], None)
    assert "HTTP 400" in traj.error and "'tools'" in traj.error and traj.steps == 0


def test_a_malformed_call_is_a_counted_tool_error_the_agent_sees(tasks, web_env):
    web_env.setenv("MINSKILL_TOOL_CALLS", "openai")
    web_env.setenv("MINSKILL_TOOL_CHOICE", "auto")
    task, seen = tasks[0], []
    bad = ['<tool_call>{"name": "visit", "arguments": {"link": 3}}</tool_call>',
           '<tool_call>{"name": "web_search", "arguments": {"query": "lab"}}</tool_call>',
           '<tool_call>{"name": "browse", "arguments": {}}</tool_call>']

    def model(messages, request):
        seen.append(messages)
        done = sum(m["role"] == "assistant" for m in messages)
        return bad[done] if done < len(bad) else as_call(oracle_actions(task)[done - len(bad)])
    with start_server(ScriptedBackend(model, max_context=100000)) as server:
        [traj] = rollout.run_rollouts(server.client(max_retries=0), [task], None, history=None)
    assert traj.success and traj.error is None and traj.nothing_happens == 0
    errors = [m["content"] for m in traj.messages if m["role"] == "tool"][:3]
    assert errors[0].startswith("Tool error (visit): its arguments must be a JSON object with a "
                                "non-empty string 'url', got {\"link\": 3}")
    assert errors[1] == ("Tool error (web_search): no such tool here; this task's tools: visit, "
                         "answer")
    assert errors[2].startswith("Tool error (browse): no such tool here")
    assert [m[-1]["content"].startswith(e) for m, e in zip(seen[1:4], errors)] == [True] * 3
    assert traj.actions[:3] == ['visit[{"link": 3}]', 'search[{"query": "lab"}]', "browse[{}]"]
    counts = tool_call_counts([traj])
    assert counts["visit"] == {"calls": len(oracle_actions(task)) - 1 + 1, "errors": 1}
    assert counts["search"] == {"calls": 1, "errors": 1}


def test_the_environment_reads_a_call_as_the_action_it_is(tasks, web_env):
    web_env.setenv("MINSKILL_WEB_TOOLS", "search,visit")
    env = make_env(tasks[0])
    env.reset()
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["web_search", "visit", "answer"]
    action, observation, done, _ = env.call("visit", '{"url": 1}')   # link 1, a number
    assert action == "visit[1]" and observation.startswith("Title: ") and not done
    action, observation, done, _ = env.call("web_search", json.dumps({"query": "founded"}))
    assert action == "search[founded]" and observation.startswith("Search results for 'founded'")
    action, observation, done, _ = env.call("visit", "{not json")
    assert action == "visit[{not json]" and not done
    assert observation == "Tool error (visit): its arguments are not JSON: '{not json'"
    assert env.tool_errors == 1 and env.tool_calls == {"search": 1, "visit": 2, "read_file": 0}
    _, observation, done, success = env.call("answer", json.dumps({"answer": tasks[0].answer}))
    assert done and success and env.em


def test_rollout_takes_the_tool_call_flags(suite, tasks, tmp_path, web_env, capsys):
    seen = []
    with start_server(ScriptedBackend(calling_model(tasks, seen), max_context=100000)) as server:
        code = rollout.main(["--suite", f"web:{suite}", "--split", "all", "--task-url", server.url,
                             "--out", str(tmp_path / "run"), "--history", "20",
                             "--tool-calls", "openai", "--tool-choice", "auto"])
    assert code == 0 and seen and all(use is not None for _, use in seen)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["n"] == len(tasks)
    for flag, value, variable in [("--tool-calls", "sometimes", "MINSKILL_TOOL_CALLS"),
                                  ("--tool-choice", "none", "MINSKILL_TOOL_CHOICE")]:
        with pytest.raises(SystemExit):
            rollout.main(["--suite", f"web:{suite}", "--out", str(tmp_path / "bad"), flag, value])
        assert f"{variable}={value!r}: must be one of" in capsys.readouterr().err


def test_minskills_own_server_serves_what_an_episode_sends(tasks, web_env, tmp_path):
    """An episode's request in the openai format (its tools' schemas, tool_choice "required", a
    tool turn answering a call) is one minskill's server serves, on a tiny random Qwen: the schemas
    are in the subset it constrains to, the turns go through the model's chat template."""
    from minskill.nn.tokenizer import Tokenizer
    from minskill.nn.weights import load_pretrained
    from minskill.serve.server import ModelBackend
    from minskill.web.agent_calls import call_step
    from tiny import make_tiny_model_dir
    web_env.setenv("MINSKILL_OBSERVATION_CHARS", "400")
    env = make_env(tasks[0])
    first = env.reset()
    call = {"id": "call_1", "type": "function",
            "function": {"name": "visit", "arguments": '{"url": "1"}'}}
    action, _, exchange = call_step(env, "", [call], 1)
    assert action == "visit[1]" and exchange[1]["tool_call_id"] == "call_1"
    path = make_tiny_model_dir(tmp_path / "tiny", family="qwen2", chat_format="qwen2.5",
                               max_position_embeddings=4096)
    backend = ModelBackend(load_pretrained(path).eval(), Tokenizer.from_pretrained(path), "tiny")
    with start_server(backend) as server:
        reply = server.client(max_retries=0).chat(
            [{"role": "user", "content": first}, *exchange], max_tokens=3,
            tools=env.tool_schemas(), tool_choice="required", parallel_tool_calls=False)
    assert reply.finish_reasons[0] in ("length", "tool_calls")
