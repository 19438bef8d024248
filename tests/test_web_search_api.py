"""web_search against a hosted search API, the Brave Search API's shape (--search-api brave), on the
generated website's fake of it (tests/website.py): the same results as its SearXNG endpoint, the key
sent in its header only (to no other origin, in no message, in no run file), every bad answer a
ToolError naming it that the agent sees and the run counts, and the scripted oracle agent reaching
its answers through it in a rollout; SearXNG stays the default."""
import json
import socket

import pytest

from minskill import rollout
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.tasks import load_suite, make_env, oracle_actions
from minskill.tasks.webagent import ToolError
from minskill.web import tools
from minskill.web.tools import BRAVE_KEY_ENV, BRAVE_URL, WEB_FLAGS, WebSettings, WebTools
from website import API_KEY, BRAVE_PATH, Website


@pytest.fixture(scope="module")
def site():
    website = Website(n_sites=2).start()
    yield website
    website.close()


@pytest.fixture
def clean_env(monkeypatch):
    """No web variable set, and each restored after the test (rollout's flags set them; setenv
    first, as delenv of an unset variable records nothing to restore)."""
    for variable in [v for _, v, _, _ in WEB_FLAGS] + [BRAVE_KEY_ENV]:
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    return monkeypatch


def brave(url: str, key: str | None = API_KEY, **variables) -> WebSettings:
    """Settings of --search-api brave at `url`, the key in its variable, the loopback allowed."""
    variables = {"MINSKILL_SEARCH_API": "brave", "MINSKILL_SEARCH_URL": url,
                 "MINSKILL_WEB_ALLOW": "127.0.0.1", **variables}
    return WebSettings.from_environ({**variables, **({BRAVE_KEY_ENV: key} if key else {})})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the API's shape

def test_brave_answers_what_searxng_answers_with_the_key_in_its_header(site):
    searxng = tools.web_search("Project start", WebSettings.from_environ(
        {"MINSKILL_SEARCH_URL": site.url}))
    results = tools.web_search("Project start", brave(site.url))
    assert results and results == searxng   # (<strong> marks and entities read as the text)
    assert all(r["url"].startswith(site.url) for r in results)
    host, path, token = site.requests[-1]
    assert path.startswith(BRAVE_PATH + "?") and "count=5" in path and "q=Project+start" in path
    assert token == API_KEY and API_KEY not in path
    shown = WebTools(brave(site.url)).search("Project start")
    assert shown.startswith(f"1. {results[0]['title']}\n   {results[0]['url']}\n")


def test_titles_urls_and_snippets_are_cut_to_their_budget(site):
    [result] = tools.web_search("x", brave(site.url + "test/brave-long"))
    assert result["title"].startswith("Long title Long title") and len(result["title"]) == 200
    assert len(result["url"]) == 500 and len(result["snippet"]) == 400
    assert "\n" not in result["title"] + result["snippet"] and "<b>" not in result["title"]


def test_an_answer_without_web_results_is_no_results(site):
    assert tools.web_search("zyzzyva", brave(site.url)) == []
    assert WebTools(brave(site.url)).search("zyzzyva") == "No results."


def test_searxng_stays_the_default_and_brave_has_its_own_url():
    assert WebSettings.from_environ({}).search_api == "searxng"
    assert not WebTools(WebSettings.from_environ({})).can_search
    assert WebTools(WebSettings.from_environ({"MINSKILL_SEARCH_API": "brave"})).can_search
    assert tools._brave_url(None) == BRAVE_URL
    assert tools._brave_url("http://127.0.0.1:9/") == "http://127.0.0.1:9" + BRAVE_PATH
    assert tools._brave_url("http://proxy/brave/search") == "http://proxy/brave/search"
    with pytest.raises(ValueError, match="MINSKILL_SEARCH_API='bing': must be one of searxng, "
                                         "brave"):
        WebSettings.from_environ({"MINSKILL_SEARCH_API": "bing"})
    assert API_KEY not in repr(WebSettings.from_environ({BRAVE_KEY_ENV: API_KEY}))


# --------------------------------------------------------------------------- its bad answers

@pytest.mark.parametrize("where, key, message", [
    ("", "not-the-key", r"the Brave Search API: HTTP 401 Unauthorized: The provided subscription "
                        r"token is invalid\. \(SUBSCRIPTION_TOKEN_INVALID\); is "
                        r"\$BRAVE_SEARCH_API_KEY the key of a subscribed plan\?"),
    ("", None, r"the Brave Search API needs its key in \$BRAVE_SEARCH_API_KEY \(not set\)"),
    ("test/brave-rate-limited", API_KEY, r"HTTP 429 Too Many Requests: Request rate limit exceeded "
                                         r"for plan\. \(RATE_LIMITED\); the plan's rate limit"),
    ("test/brave-unavailable", API_KEY, r"HTTP 503 Service Unavailable: upstream connect error; "
                                        r"the API failed on its side"),
    ("test/brave-bad-json", API_KEY, r"the Brave Search API answered no JSON \(Expecting value"),
    ("test/brave-no-results-list", API_KEY, r"answered without a list at web\.results: "),
    ("test/brave-not-search", API_KEY, r"answered without a list at web\.results: "),
    ("test/brave-no-url", API_KEY, r"the Brave Search API's web\.results\[1\]\.url is missing "
                                   r"\(the result has \['description', 'title'\]\)"),
    ("test/brave-script-url", API_KEY, r"web\.results\[0\]\.url is not an http\(s\) URL: "
                                       r"'javascript:alert\(1\)'"),
])
def test_each_bad_answer_is_a_tool_error_naming_it(site, where, key, message):
    with pytest.raises(ToolError, match=message) as caught:
        tools.web_search("x", brave(site.url + where, key))
    assert API_KEY not in str(caught.value)


def test_an_api_that_does_not_answer_is_a_tool_error():
    with pytest.raises(ToolError, match="the Brave Search API did not answer"):
        tools.web_search("x", brave(f"http://127.0.0.1:{closed_port()}"))


def test_the_key_goes_to_no_other_origin_and_into_no_message(site):
    with pytest.raises(ToolError, match="HTTP 401"):   # redirected to localhost: no key there
        tools.web_search("x", brave(site.url + "test/brave-elsewhere"))
    port = site.server.server_address[1]
    assert (f"localhost:{port}", f"{BRAVE_PATH}?q=x", None) in site.requests
    echoed = brave(site.url + "test/brave-unavailable", key="upstream")   # a key the body says
    with pytest.raises(ToolError) as caught:
        tools.web_search("x", echoed)
    assert "upstream" not in str(caught.value) and "<the key> connect error" in str(caught.value)


def test_a_failing_search_is_a_tool_error_the_agent_sees_and_the_run_counts(site, tmp_path,
                                                                            clean_env):
    suite = site.write_tasks(tmp_path / "tasks.jsonl")
    for name, value in [("MINSKILL_SEARCH_API", "brave"), ("MINSKILL_SEARCH_URL", site.url),
                        ("MINSKILL_WEB_ALLOW", "127.0.0.1"), ("MINSKILL_WEB_TOOLS", "search,visit"),
                        (BRAVE_KEY_ENV, "not-the-key")]:
        clean_env.setenv(name, value)
    env = make_env(load_suite(f"web:{suite}", "all")[0])
    env.reset()
    observation = env.step("search[Department founded]")[0]
    assert observation.startswith("Tool error (search): the Brave Search API: HTTP 401")
    assert env.tool_errors == 1 and env.tool_calls["search"] == 1
    clean_env.setenv(BRAVE_KEY_ENV, API_KEY)
    env = make_env(load_suite(f"web:{suite}", "all")[0])
    env.reset()
    assert "\n1. Department of " in env.step("search[Department founded]")[0]


# --------------------------------------------------------------------------- a run through it

@pytest.fixture
def gaia(site, tmp_path):
    """GAIA's metadata.jsonl: one question a site answers, a project's start year, per site; the
    oracle searches, visits the project's page among the results and answers."""
    lines = []
    for k, entry in enumerate(site.sites):
        project, facts = next(iter(entry["site"]["facts"]["projects"].items()))
        page = site.url + site.path(entry, facts["page"]).lstrip("/")
        lines.append({"task_id": f"g{k}", "Level": 1, "Final answer": str(facts["start"]),
                      "Question": f"In which year did {project} of the {facts['lab']} start?",
                      "file_name": "", "oracle": [f"search[{project} {facts['lab']}]",
                                                  f"visit[{page}]", f"answer[{facts['start']}]"]})
    path = tmp_path / "gaia" / "metadata.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_oracle_agent_answers_through_brave_and_no_run_file_holds_the_key(site, gaia, tmp_path,
                                                                             clean_env, capsys):
    tasks = load_suite(f"web:{gaia}", "all")

    def agent(messages, request):   # the oracle, visiting the page only where search showed it
        first = next(m["content"] for m in messages if m["role"] == "user")
        plan = oracle_actions(next(t for t in tasks if t.question in first))
        step = sum(m["role"] == "assistant" for m in messages)
        shown = str(messages[-1].get("content"))
        if step == 1 and plan[1][len("visit["):-1] not in shown:
            return "answer[the search did not show the page]"
        return plan[step]

    with pytest.raises(SystemExit):   # the key is asked for as the flag is parsed
        rollout.main(["--suite", f"web:{gaia}", "--out", str(tmp_path / "no"), "--search-api",
                      "brave"])
    assert "needs its key in $BRAVE_SEARCH_API_KEY" in capsys.readouterr().err
    clean_env.setenv(BRAVE_KEY_ENV, API_KEY)
    asked = len([r for r in site.requests if r[1].startswith(BRAVE_PATH)])
    out = tmp_path / "run"
    with start_server(ScriptedBackend(agent, max_context=100000)) as server:
        code = rollout.main(["--suite", f"web:{gaia}", "--split", "all", "--task-url", server.url,
                             "--out", str(out), "--search-api", "brave", "--search-url", site.url,
                             "--web-allow", "127.0.0.1", "--history", "20"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["n"] == len(tasks) == 2
    keyed = [r for r in site.requests if r[1].startswith(BRAVE_PATH)][asked:]
    assert len(keyed) == 2 and all(token == API_KEY for _, _, token in keyed)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and not [p for p in files if API_KEY.encode() in p.read_bytes()]
