"""`web:` suites (tasks/webagent.py) on the generated website (tests/website.py): a scripted agent
that follows each task's oracle path over HTTP reaches every answer, through the environment and
through the agent loop with a model server; link numbers, tool errors the agent sees and that are
counted, the observation budget, "Nothing happens.", EM/F1 and the judge; GAIA's metadata.jsonl with
tools (search, visit, its file) scored by GAIA's scorer; bad lines named FILE:LINE; rollout's
flags."""
import json
import socket

import pytest

from minskill import rollout
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.tasks import (NOTHING_HAPPENS, TaskWarning, load_suite, make_env, oracle_actions,
                            suite_types)
from minskill.tasks.webagent import MAX_STEPS, tool_call_counts
from website import Website


@pytest.fixture(scope="module")
def site():
    website = Website(n_sites=4).start()
    yield website
    website.close()


@pytest.fixture
def web_env(site, monkeypatch):
    """The settings a run against the site has: loopback allowed, the site's search endpoint."""
    for variable in ("MINSKILL_WEB_TOOLS", "MINSKILL_OBSERVATION_CHARS", "MINSKILL_JUDGE_URL",
                     "MINSKILL_WEB_ALLOW", "MINSKILL_SEARCH_URL", "MINSKILL_WEB_ALLOW_ONLY",
                     "MINSKILL_WEB_TIMEOUT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("MINSKILL_WEB_ALLOW", "127.0.0.1")
    monkeypatch.setenv("MINSKILL_SEARCH_URL", site.url)
    return monkeypatch


@pytest.fixture
def suite(site, tmp_path):
    return site.write_tasks(tmp_path / "webwalkerqa.jsonl")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def next_oracle_action(tasks, messages) -> str:
    """The next action of the oracle plan of the task (of `tasks`) whose episode `messages` are (all
    of them: the prompt must keep every past exchange)."""
    first = next(m["content"] for m in messages if m["role"] == "user")
    task = next(t for t in tasks
                if f"Question: {t.question}\nFind the answer on the website that starts at "
                f"{t.metadata['root_url']} " in first)
    return oracle_actions(task)[sum(m["role"] == "assistant" for m in messages)]


def start(task):
    env = make_env(task)
    return env, env.reset()


# --------------------------------------------------------------------------- WebWalkerQA's format

def test_the_suite_has_webwalkerqas_fields_and_types(suite):
    lines = [json.loads(line) for line in suite.read_text().splitlines()]
    assert all({"question", "answer", "root_url", "info"} <= set(line) for line in lines)
    # found by its root_url, no "web:" needed
    tasks = load_suite(str(suite), split="all")
    assert [t.id for t in tasks] == [t.id for t in load_suite(f"web:{suite}", split="all")]
    assert {t.type for t in tasks} <= {"single_source_easy", "single_source_medium",
                                       "single_source_hard", "multi_source_hard"}
    assert len(tasks) == 16
    assert set(suite_types(str(suite))) == {t.type for t in tasks}
    train, heldout = load_suite(str(suite), "train"), load_suite(str(suite), "heldout")
    assert len(train) + len(heldout) == 16 and not {t.id for t in train} & {t.id for t in heldout}


def test_the_scripted_agent_reaches_every_answer_by_following_links(suite, web_env):
    hops = set()
    for task in load_suite(str(suite), split="all"):
        env, observation = start(task)
        assert observation.startswith(f"Question: {task.question}")
        assert "Links:\n[1] Home" in observation
        plan = oracle_actions(task)
        hops.add(len(plan) - 1)
        for action in plan[:-1]:
            url = action[len("visit["):-1]
            # a link of the page shown last
            assert f": {url}\n" in observation + "\n"
            observation, done, success = env.step(action)
            assert observation.startswith("Title: ") and not done
        if task.metadata["source_type"] == "single_source":
            assert task.answer in observation   # the last page states it
        observation, done, success = env.step(plan[-1])
        assert done and success and env.em and env.f1 == 1.0
        assert env.tool_errors == env.nothing_happens == 0
        assert env.tool_calls["visit"] == len(plan) - 1
        assert observation.endswith("(exact match 1, F1 1.00)")
    assert {2, 3, 4} <= hops                                # facts 2 to 4 hops deep


def test_the_agent_loop_reaches_every_answer_over_http(suite, web_env):
    tasks = load_suite(f"web:{suite}", split="all")

    def agent(messages, request):   # a ReAct-style model: a thought, then the action
        action = next_oracle_action(tasks, messages)
        if action.startswith("answer["):
            return f"Thought: I found it.\nFINAL ANSWER: {action[len('answer['):-1]}"
        return f"Thought: follow the link.\nAction: {action}"
    # (every step in its prompt)
    with start_server(ScriptedBackend(agent, max_context=100000)) as server:
        trajs = rollout.run_rollouts(server.client(max_retries=0), tasks, None, history=None)
    assert [t.success for t in trajs] == [True] * len(tasks) and all(t.error is None for t in trajs)
    counts = tool_call_counts(trajs)
    assert (counts["visit"]["calls"] == sum(len(oracle_actions(t)) - 1 for t in tasks)
            == sum(t.steps - 1 for t in trajs))
    assert counts["visit"]["errors"] == 0
    assert counts["search"] == counts["read_file"] == {"calls": 0, "errors": 0}
    # the syntax shown
    assert trajs[0].messages[0]["content"].count("visit [URL or link number]") == 1


def test_link_numbers_follow_the_page_shown_last(suite, web_env):
    task = load_suite(str(suite), split="all")[0]
    env, observation = start(task)
    departments = next(line for line in observation.splitlines() if "] Departments: " in line)
    number = departments[1:departments.index("]")]
    observation = env.step(f"visit [{number}]")[0]
    assert observation.startswith("Title: Departments\n")
    observation = env.step("Visit link 99")[0]
    assert observation.startswith("Tool error (visit): no link [99] on the page shown last")
    assert env.tool_errors == 1 and env.tool_calls["visit"] == 2


def test_a_tool_error_is_shown_counted_and_the_episode_goes_on(suite, site, web_env):
    task = load_suite(str(suite), split="all")[0]
    env, _ = start(task)
    cases = [(f"visit[http://127.0.0.1:{closed_port()}/]", "did not answer"),
             ("visit[http://10.0.0.1/admin]", "is refused: not a public address"),
             ("visit[file:///etc/passwd]", "only http and https"),
             (f"visit[{site.url}test/loop]", "a redirect loop"),
             (f"visit[{site.url}test/binary]", "not a text page")]
    for k, (action, why) in enumerate(cases, start=1):
        observation, done, _ = env.step(action)
        assert observation.startswith("Tool error (visit): ") and why in observation and not done
        assert env.tool_errors == k and env.nothing_happens == 0


def test_a_root_that_does_not_answer_is_the_first_observation_not_a_crash(tmp_path, web_env):
    line = {"question": "Q?", "answer": "A", "root_url": f"http://127.0.0.1:{closed_port()}/",
            "info": {"type": "single_source", "difficulty_level": "easy"}}
    (tmp_path / "t.jsonl").write_text(json.dumps(line) + "\n")
    env, observation = start(load_suite(str(tmp_path / "t.jsonl"), "all")[0])
    assert "Tool error (visit): " in observation and "did not answer" in observation
    assert env.tool_errors == 1


def test_observations_are_cut_to_the_budget(suite, site, web_env):
    web_env.setenv("MINSKILL_OBSERVATION_CHARS", "300")
    task = load_suite(str(suite), split="all")[0]
    env, _ = start(task)
    observation = env.step(f"visit[{site.url}test/big]")[0]
    assert len(observation) <= 300 and "more characters of this page not shown" in observation


def test_actions_that_are_no_tool_of_the_task_change_nothing(suite, web_env):
    task = load_suite(str(suite), split="all")[0]
    env, _ = start(task)
    # WebWalker: browse only
    assert env.action_syntax == ("visit [URL or link number]", "answer [text]")
    actions = ["search[departments]", "read_file[x.csv]", "click Home", "visit[]", "answer"]
    for k, action in enumerate(actions, 1):
        assert env.step(action)[0] == NOTHING_HAPPENS and env.nothing_happens == k
    web_env.setenv("MINSKILL_WEB_TOOLS", "search,visit")   # --tools widens it
    env, _ = start(task)
    assert env.action_syntax[0] == "search [query]"
    assert env.step("search[Department founded]")[0].startswith(
        "Search results for 'Department founded':\n1. ")


def test_a_wrong_answer_scores_f1_and_fails_and_the_step_limit_ends_it(suite, web_env):
    # a lab's name: two words
    task = next(t for t in load_suite(str(suite), split="all") if " " in t.answer)
    env, _ = start(task)
    observation, done, success = env.step(f"answer[{task.answer.split()[0]}]")
    assert done and not success and not env.em and env.f1 == pytest.approx(2 / 3)
    env, _ = start(task)
    for _ in range(MAX_STEPS - 1):
        assert env.step("visit[1]")[1] is False
    assert env.step("visit[1]")[1] is True and not env.success


def test_the_judge_decides_where_set_and_its_failure_fails_the_episode(suite, web_env):
    task = load_suite(str(suite), split="all")[0]
    with start_server(ScriptedBackend(
            lambda messages, request: "EXPLANATION: same.\nGRADE: CORRECT")) as judge:
        web_env.setenv("MINSKILL_JUDGE_URL", judge.url)
        env, _ = start(task)
        observation, done, success = env.step(f"answer[It is {task.answer}, I think]")
    # the judge's verdict, EM kept
    assert success and env.verdict is True and not env.em
    assert "judge: CORRECT (EXPLANATION: same. GRADE: CORRECT)" in observation
    web_env.setenv("MINSKILL_JUDGE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    with start_server(ScriptedBackend(
            lambda messages, request: f"answer[{task.answer}]")) as server:
        [traj] = rollout.run_rollouts(server.client(max_retries=0), [task], None)
    assert traj.error.startswith("environment failed at step 1: ToolError: the judge at")
    assert not traj.success


@pytest.mark.parametrize("line, message", [
    ('{"question": "Q", "answer": "A", "root_url": "ftp://x/"}',
     "field 'root_url' must be an http"),
    ('{"question": "Q", "answer": "", "root_url": "http://x/"}',
     "field 'answer' must be a non-empty string"),
    ('{"question": "Q", "answer": "A", "root_url": "http://x/", "info": []}',
     "field 'info' must be a JSON"),
    ('{"question": "Q", "answer": "A", "root_url": "http://x/", "info": {"type": "a/b"}}',
     "cannot name a skill"),
    ('{"question": "Q", "answer": "A", "root_url": "http://x/", "oracle": "visit"}',
     "'oracle' must be a list"),
    ('{"question": "Q", "answer": "A", "root_url": "http://x/", "split": "test"}',
     "'split' must be 'train'"),
    ('{"question": "Q", "answer": "A", "root_url": "http://x/"', "not valid JSON")])
def test_a_bad_line_is_an_error_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "Q0", "answer": "A", "root_url": "http://x/"}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: .*{message}"):
        load_suite(f"web:{path}", "all")


# --------------------------------------------------------------------------- GAIA with tools

@pytest.fixture
def gaia(site, tmp_path):
    """GAIA's metadata.jsonl: a question the site answers (found by search), one with a CSV file,
    one whose file is missing."""
    entry = site.sites[1]
    project, facts = next(iter(entry["site"]["facts"]["projects"].items()))
    page = site.url + site.path(entry, facts["page"]).lstrip("/")
    (tmp_path / "counts.csv").write_text("bird,count\nkestrel,3\nfalcon,14\n", encoding="utf-8")
    lines = [{"task_id": "g-search",
              "Question": f"In which year did {project} of the {facts['lab']} start?",
              "Level": 1, "Final answer": str(facts["start"]), "file_name": "",
              "oracle": [f"search[{project} {facts['lab']}]", f"visit[{page}]",
                         f"answer[{facts['start']}]"]},
             {"task_id": "g-file", "Question": "How many falcons were counted?", "Level": "2",
              "Final answer": "14", "file_name": "counts.csv",
              "oracle": ["read_file[counts.csv]", "answer[FINAL ANSWER: 14]"]},
             {"task_id": "g-missing", "Question": "What does the file say?", "Level": 3,
              "Final answer": "x", "file_name": "gone.pdf"}]
    path = tmp_path / "metadata.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_gaia_with_tools_is_solved_by_search_visit_and_its_file(gaia, web_env):
    with pytest.warns(TaskWarning, match="g-missing: its file 'gone.pdf' is not in"):
        tasks = {t.id: t for t in load_suite(f"web:{gaia}", "all")}
    assert ([tasks[i].type for i in ("g-search", "g-file", "g-missing")]
            == ["level1", "level2", "level3"])
    for task_id in ("g-search", "g-file"):
        task = tasks[task_id]
        env, observation = start(task)
        assert observation.startswith("You are a general AI assistant.")
        assert task.question in observation
        for action in oracle_actions(task)[:-1]:
            observation = env.step(action)[0]
            assert "Tool error" not in observation
        assert task.answer in observation   # the search result's page, or the file
        observation, done, success = env.step(oracle_actions(task)[-1])
        assert done and success and "(scored by GAIA's scorer: right)" in observation
    env, observation = start(tasks["g-file"])
    assert "read_file[counts.csv]" in observation
    assert env.action_syntax[-2] == "read_file [file name]"
    assert env.step("read_file[/etc/passwd]")[0].startswith(
        "Tool error (read_file): no file '/etc/passwd'")
    assert env.step("answer[fourteen]")[2] is False   # GAIA's scorer: a number is a number
    env, observation = start(tasks["g-missing"])
    assert "read_file" not in " ".join(env.action_syntax) and "search [query]" in env.action_syntax


def test_gaia_without_a_search_backend_offers_no_search(gaia, web_env):
    web_env.delenv("MINSKILL_SEARCH_URL")
    with pytest.warns(TaskWarning):
        task = load_suite(f"web:{gaia}", "all")[0]
    assert make_env(task).action_syntax == ("visit [URL or link number]", "answer [text]")


@pytest.mark.parametrize("line, message", [
    ({"task_id": "h", "Question": "Q", "Level": 1, "Final answer": "?"}, "is hidden"),
    ({"task_id": "h", "Question": "Q", "Level": 1, "Final answer": "1", "file_name": "../x.txt"},
     "not a file inside"),
    ({"task_id": "h", "Question": "Q", "Level": "1/2", "Final answer": "1"},
     "cannot name a skill folder")])
def test_a_bad_gaia_line_is_an_error_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "metadata.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=f"{path}:1: .*{message}"):
        load_suite(f"web:{path}", "all")


# --------------------------------------------------------------------------- the evaluation command

def test_rollout_runs_a_web_suite_with_its_flags(suite, site, tmp_path, web_env, capsys):
    web_env.delenv("MINSKILL_WEB_ALLOW")
    tasks = load_suite(str(suite), "all")
    with start_server(ScriptedBackend(lambda messages, request: next_oracle_action(tasks, messages),
                                      max_context=100000)) as server:
        code = rollout.main(["--suite", f"web:{suite}", "--split", "all", "--task-url", server.url,
                             "--out", str(tmp_path / "run"), "--web-allow", "127.0.0.1",
                             "--observation-chars", "2000", "--history", "20"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["n"] == len(tasks)
    with pytest.raises(SystemExit):
        rollout.main(["--suite", f"web:{suite}", "--out", str(tmp_path / "bad"), "--web-timeout",
                      "never"])
    assert "MINSKILL_WEB_TIMEOUT='never'" in capsys.readouterr().err
