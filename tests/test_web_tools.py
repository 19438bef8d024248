"""The web agent's tools (minskill.web) against the generated website on 127.0.0.1
(tests/website.py): a page as text with numbered links, SearXNG's JSON shape, and every bad case as
a ToolError naming it — a backend or page that does not answer, a 50 MB page (cut at the cap), a
redirect loop, binary files, HTML that does not parse, a refused host (private ranges, schemes,
credentials, the allow-list), a slow page; charsets; a task's file by kind; the settings' variables;
WebWalker's judge."""
import ipaddress
import json
import socket
import zipfile

import pytest

from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.tasks.webagent import ToolError
from minskill.web import page_text, tools
from minskill.web.tools import (WebSettings, WebTools, check_url, fetch, grade_of, judge_answer,
                                read_file, visit)
from website import BIG_PAGE_BYTES, Website


@pytest.fixture(scope="module")
def site():
    website = Website(n_sites=2).start()
    yield website
    website.close()


def settings(**variables) -> WebSettings:
    """Settings as the environment gives them; the loopback allowed unless said otherwise."""
    return WebSettings.from_environ({"MINSKILL_WEB_ALLOW": "127.0.0.1", **variables})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- pages and search

def test_a_page_reads_as_text_with_numbered_links_and_no_scripts(site):
    page = visit(site.url + "site0/departments.html", settings())
    assert page.title == "Departments" and "Our departments:" in page.text
    # script and style dropped
    assert "tracking" not in page.text and "body {" not in page.text
    urls = [url for _, url in page.links]
    assert urls[0] == site.url + "site0/"
    assert not any(u.startswith("javascript") or "#" in u for u in urls)
    for number, (label, url) in enumerate(page.links, start=1):
        # absolute, numbered in the text
        assert f"{label} [{number}]" in page.text and url.startswith(site.url)
    rendered = page.render(4000)
    assert rendered.startswith(f"Title: Departments\nURL: {site.url}site0/departments.html")
    assert f"[2] {page.links[1][0]}: {page.links[1][1]}" in rendered


def test_a_long_page_is_cut_to_the_budget_and_keeps_its_links():
    page = page_text.html_to_text("<p>" + "word " * 5000 + "</p>" + "<a href='/x'>x</a>",
                                  "http://h/")
    rendered = page.render(500)
    assert len(rendered) <= 500 and "more characters of this page not shown" in rendered
    assert rendered.endswith("Links:\n[1] x: http://h/x")


def test_search_answers_in_searxngs_shape(site):
    results = tools.web_search("Project start", settings(MINSKILL_SEARCH_URL=site.url))
    assert 0 < len(results) <= tools.WebSettings.search_results
    assert all(set(r) == {"title", "url", "snippet"} and r["url"].startswith(site.url)
               for r in results)
    assert any("started in" in r["snippet"] and r["title"].startswith("Project") for r in results)
    shown = WebTools(settings(MINSKILL_SEARCH_URL=site.url)).search("Project start")
    assert shown.startswith(f"1. {results[0]['title']}\n   {results[0]['url']}\n   "
                            f"{results[0]['snippet']}")


def test_a_search_backend_that_answers_no_json_is_a_tool_error(site):
    with pytest.raises(ToolError,
                       match="HTTP 403 Forbidden .*is format=json on in SearXNG's settings.yml"):
        tools.web_search("x", settings(MINSKILL_SEARCH_URL=site.url + "test/forbidden"))
    with pytest.raises(ToolError, match="without a JSON 'results' list"):
        tools.web_search("x", settings(MINSKILL_SEARCH_URL=site.url + "test/search-html"))
    with pytest.raises(ToolError, match="no search backend is set"):
        tools.web_search("x", settings())


def test_an_unreachable_backend_or_page_is_a_tool_error():
    port = closed_port()
    with pytest.raises(ToolError, match="the search backend did not answer"):
        tools.web_search("x", settings(MINSKILL_SEARCH_URL=f"http://127.0.0.1:{port}"))
    with pytest.raises(ToolError, match="did not answer .*Connection"):
        visit(f"http://127.0.0.1:{port}/page", settings())


def test_a_slow_page_is_a_tool_error_after_the_timeout(site):
    with pytest.raises(ToolError, match="did not answer \\(timed out\\)"):
        visit(site.url + "test/slow", settings(MINSKILL_WEB_TIMEOUT="0.3"))


# --------------------------------------------------------------------------- the bad cases

def test_a_50_mb_page_is_read_up_to_the_cap_and_says_so(site):
    fetched = fetch(site.url + "test/big", settings(MINSKILL_WEB_MAX_BYTES="100000"))
    assert len(fetched.body) == 100000
    assert fetched.note == (f"the page is {BIG_PAGE_BYTES:,} bytes; "
                            "only its first 100,000 bytes were read")
    page = visit(site.url + "test/big", settings(MINSKILL_WEB_MAX_BYTES="100000"))
    assert page.note == fetched.note and f"({fetched.note})" in page.render(1000)


def test_redirects_are_followed_up_to_the_limit_and_a_loop_is_an_error(site):
    assert visit(site.url + "test/chain?n=3", settings()).text == "end of the chain"
    assert visit(site.url + "test/chain?n=3", settings()).url == site.url + "test/chain?n=0"
    with pytest.raises(ToolError, match="more than 2 redirects"):
        visit(site.url + "test/chain?n=3", settings(MINSKILL_WEB_MAX_REDIRECTS="2"))
    with pytest.raises(ToolError, match="more than 5 redirects \\(a redirect loop\\?\\)"):
        visit(site.url + "test/loop", settings())


def test_binary_files_are_refused_by_name(site):
    with pytest.raises(ToolError, match="is not a text page \\(image/png, 2056 bytes\\)"):
        visit(site.url + "test/binary", settings())
    # NUL bytes, whatever it claims
    with pytest.raises(ToolError, match="is not a text page \\(text/html"):
        visit(site.url + "test/binary-as-html", settings())


def test_html_that_does_not_parse_is_read_as_far_as_it_goes_then_stripped(site):
    page = visit(site.url + "test/broken", settings())
    assert "did not parse to the end" in page.note
    assert "Before the break, a link [1]" in page.text
    assert "After the break: the fact is 1234." in page.text
    assert page.links == [("a link", site.url + "site0/")] and page.title == "Broken page"


def test_charsets_from_the_header_or_the_meta_tag(site):
    assert visit(site.url + "test/latin1", settings()).title == "Caf\u00e9"
    assert visit(site.url + "test/latin1", settings()).text == "Cr\u00e8me br\u00fbl\u00e9e"
    assert visit(site.url + "test/meta-charset", settings()).text == "na\u00efve \u20ac5"
    # not HTML
    assert visit(site.url + "test/plain", settings()).text == "just text, no HTML <b>here</b>"


@pytest.mark.parametrize("url, why", [
    ("file:///etc/passwd", "only http and https"), ("ftp://127.0.0.1/x", "only http and https"),
    ("javascript:alert(1)", "only http and https"),
    ("http://user:pw@127.0.0.1/", "user name or password"),
    ("http:///nohost", "no host"), ("http://127.0.0.1:99999/", "not a URL"),
    ("http://a b/", "not a URL"),
    ("http://10.0.0.1/", "not a public address"),
    ("http://169.254.169.254/latest/meta-data", "not a public"),
    ("http://[::1]/", "not a public address"),
    ("http://[::ffff:10.1.2.3]/", "not a public address"),
    ("http://0.0.0.0/", "not a public address"), ("http://192.168.1.1/", "not a public address")])
def test_refused_urls_name_why(url, why):
    with pytest.raises(ToolError, match=why):
        check_url(url, settings())


def test_the_allow_list_opens_private_hosts_and_allow_only_closes_the_rest(site):
    with pytest.raises(ToolError,
                       match="'127.0.0.1' \\(127.0.0.1\\) is refused: not a public address"):
        visit(site.url, WebSettings.from_environ({}))                   # loopback, not allowed
    allowed = settings(MINSKILL_WEB_ALLOW="10.0.0.0/8")
    assert check_url("http://10.1.2.3/", allowed).address == "10.1.2.3"
    # public: allowed
    assert check_url("http://93.184.216.34/", settings()).address == "93.184.216.34"
    only = settings(MINSKILL_WEB_ALLOW_ONLY="1")
    with pytest.raises(ToolError, match="not on the allow-list"):
        check_url("http://93.184.216.34/", only)
    assert visit(site.url + "site0/", only).title.endswith("- Home")
    # a redirect is checked
    with pytest.raises(ToolError, match="'10.0.0.1' \\(10.0.0.1\\) is refused"):
        visit(site.url + "test/to-private", settings())


def test_the_connection_goes_to_the_address_that_was_checked(site, monkeypatch):
    """A second DNS answer (rebinding to a private address) cannot move the connection."""
    real, answers = socket.getaddrinfo, iter(["127.0.0.1"] + ["10.9.9.9"] * 5)

    def rebinding(host, *args, **kwargs):
        if host == "site.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), 0))]
        return real(host, *args, **kwargs)
    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    url = site.url.replace("127.0.0.1", "site.example") + "site0/about.html"
    page = visit(url, settings(MINSKILL_WEB_ALLOW="site.example", MINSKILL_WEB_TIMEOUT="2"))
    assert page.title == "About"


# --------------------------------------------------------------------------- read_file

def test_read_file_reads_what_the_standard_library_reads(tmp_path):
    (tmp_path / "t.csv").write_text("name,count\nkestrel,3\n", encoding="utf-8")
    assert read_file(tmp_path / "t.csv", 10000) == "name | count\nkestrel | 3"
    (tmp_path / "t.json").write_text('{"a": [1, 2]}', encoding="utf-8")
    assert json.loads(read_file(tmp_path / "t.json", 10000)) == {"a": [1, 2]}
    (tmp_path / "t.html").write_text("<h1>Hi</h1><script>x</script><p>there</p>", encoding="utf-8")
    assert read_file(tmp_path / "t.html", 10000) == "# Hi\n\nthere"
    (tmp_path / "t.txt").write_text("x" * 50, encoding="utf-8")
    assert read_file(tmp_path / "t.txt", 10) == "x" * 10 + "\n(the file is cut at 10 bytes)"
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        archive.writestr("inner.txt", "hello")
    assert (read_file(tmp_path / "a.zip", 10000)
            == "ZIP archive a.zip, 1 entries:\n- inner.txt (5 bytes)")


@pytest.mark.parametrize("name, data", [("scan.pdf", b"%PDF-1.4 ..."),
                                        ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00"),
                                        ("sheet.xlsx", b"PK\x03\x04rest")])
def test_read_file_names_what_it_cannot_read(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ToolError,
                       match=f"{name}: unsupported file type .* read_file reads text, CSV"):
        read_file(tmp_path / name, 10000)


# --------------------------------------------------------------------------- settings and the judge

@pytest.mark.parametrize("variables, message", [
    ({"MINSKILL_WEB_TIMEOUT": "soon"}, "MINSKILL_WEB_TIMEOUT='soon'"),
    ({"MINSKILL_WEB_MAX_BYTES": "0"}, "MINSKILL_WEB_MAX_BYTES='0': must be > 0"),
    ({"MINSKILL_WEB_TOOLS": "visit,browse"}, "unknown tool\\(s\\) browse")])
def test_a_bad_setting_is_an_error_naming_its_variable(variables, message):
    with pytest.raises(ValueError, match=message):
        WebSettings.from_environ(variables)


def test_settings_parse_lists_and_networks():
    s = WebSettings.from_environ({"MINSKILL_WEB_ALLOW": "127.0.0.1, 10.0.0.0/8,intranet",
                                  "MINSKILL_WEB_TOOLS": "Visit,search",
                                  "MINSKILL_OBSERVATION_CHARS": "500"})
    assert s.allow == ("127.0.0.1", "10.0.0.0/8", "intranet") and s.tools == ("visit", "search")
    assert s.networks == (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.0.0.0/8"))
    assert s.observation_chars == 500 and s.timeout == 15.0


def test_the_judge_grades_as_langchains_qa_evaluator_reads_it():
    assert grade_of("The answer matches.\nGRADE: CORRECT") is True
    assert grade_of("EXPLANATION: no.\ngrade: incorrect") is False
    assert grade_of("INCORRECT.") is False and grade_of("I cannot tell") is None


def test_the_judge_is_asked_webwalkers_prompt_and_its_failures_are_tool_errors():
    seen = []

    def judge(messages, request):
        seen.append(messages[-1]["content"])
        if "E6" in seen[-1]:
            return "EXPLANATION: the same building.\nGRADE: CORRECT"
        return "no grade here"
    with start_server(ScriptedBackend(judge, name="judge")) as server:
        s = settings(MINSKILL_JUDGE_URL=server.url)
        assert judge_answer("Which building?", "building E6", "E6", s) == (
            True, "EXPLANATION: the same building. GRADE: CORRECT")
        assert seen[0].startswith("You are a teacher grading a quiz.") and seen[0].endswith(
            "QUESTION: Which building?\nCONTEXT: E6\nSTUDENT ANSWER: building E6\nEXPLANATION:")
        with pytest.raises(ToolError, match="has no GRADE"):
            judge_answer("Which building?", "F1", "F2", s)
    with pytest.raises(ToolError, match="the judge at .* failed"):
        judge_answer("q", "a", "b",
                     settings(MINSKILL_JUDGE_URL=f"http://127.0.0.1:{closed_port()}/v1"))
