"""A generated website served on 127.0.0.1, and a search endpoint in SearXNG's JSON format over it:
the web agent's world for tests and for measuring a task model offline.

Each site (/site<k>/) is one of tasks/webwalk.py's fictional institutes (home, about and news pages
as distractors, departments, people, labs, projects), written as HTML with a navigation bar, scripts
and styles to skip, and links to follow. `tasks()` gives four WebWalkerQA lines a site: a fact two
hops from the root (easy: a department's founding year or building), three (medium: a workshop room
on a department's labs page), four (hard: a person's office, a lab's founding year) and a comparison
of two pages (multi_source, hard); each with question, answer, root_url, info {type: single_source |
multi_source, difficulty_level}, and "oracle": the visits along the shortest link path to each page
the answer needs, then the answer. /search?q=...&format=json answers as SearXNG does ({"query",
"number_of_results", "results": [{"url", "title", "content"}]}, by BM25 over every page); without
format=json it answers 403, as SearXNG does when JSON is off. /res/v1/web/search answers as the
Brave Search API does (its key in the X-Subscription-Token header, else 401 with Brave's error body;
{"type": "search", "query", "web": {"results": [{"title", "url", "description"}]}}, <strong> marks
in the text, no `web` where nothing matched); `requests` records each request's host, path and key
header. Under /test/ are the bad cases the tools must survive: a 50 MB page, a redirect loop, a
redirect chain, redirects to a private address, binary files, HTML that does not parse, a page in
Latin-1, a 404, a slow page, a search backend that answers HTML, and Brave's API answering 429, 503,
bad JSON, no web.results, a result without a URL or with a javascript: one, results too long, a
redirect to another origin.

As a script it serves the site, writes the tasks, and runs a command against it with
MINSKILL_SEARCH_URL and MINSKILL_WEB_ALLOW set (with --search-api brave, MINSKILL_SEARCH_API and
BRAVE_SEARCH_API_KEY too; then, with --count-in, prints the tool calls of the run's trajectories):

    python tests/website.py --tasks /tmp/web/tasks.jsonl \\
        --count-in /tmp/web/run/trajectories.jsonl -- \\
        python -m minskill.rollout --suite web:/tmp/web/tasks.jsonl --split all --out /tmp/web/run
"""
from __future__ import annotations

import argparse
import html
import json
import os
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minskill.tasks.bm25 import top_documents  # noqa: E402
from minskill.tasks.webwalk import _make_site, _path, _question  # noqa: E402

BIG_PAGE_BYTES = 50 * 2**20
SEARCH_RESULTS = 5
BRAVE_PATH = "/res/v1/web/search"
API_KEY = "test-brave-key-5f0c2a9e"   # the key the fake Brave Search API takes


def brave_error(status: int, code: str, detail: str) -> dict:
    """An error body as the Brave Search API writes it."""
    return {"type": "ErrorResponse", "time": 0, "error": {
        "id": "00000000-0000-0000-0000-000000000000", "status": status, "code": code,
        "detail": detail, "meta": {"component": "api"}}}


class Website:
    """`n_sites` generated sites (`seed`), served by start() on 127.0.0.1 until close()."""

    def __init__(self, n_sites: int = 4, seed: int = 0, api_key: str = API_KEY):
        self.api_key, self.requests = api_key, []   # requests: (Host, path, X-Subscription-Token)
        self.sites = []
        for k in range(n_sites):
            rng = random.Random(f"website|{seed}|{k}")
            site = _make_site(rng)
            questions = [("easy", *_question(rng, "easy", site)),
                         ("medium", *_workshop(rng, site)),
                         ("hard", *_question(rng, "medium", site)),
                         ("hard", *_two_sources(rng, site))]
            self.sites.append({"prefix": f"/site{k}/", "site": site, "questions": questions})
        self.pages = {}   # path -> (title, text, html)
        for entry in self.sites:
            for page_id, page in entry["site"]["pages"].items():
                self.pages[self.path(entry, page_id)] = (page["title"], page["text"],
                                                         self._html(entry, page))
        self.server, self.url = None, None

    @staticmethod
    def path(entry: dict, page_id: str) -> str:
        return entry["prefix"] + ("" if page_id == "home" else f"{page_id}.html")

    def _html(self, entry: dict, page: dict) -> str:
        links = "".join(f'<li><a href="{self.path(entry, target)}">{html.escape(label)}</a></li>'
                        for label, target in page["links"] if target != "home")
        institute = html.escape(entry["site"]["institute"])
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
                f"<title>{html.escape(page['title'])}</title>"
                f"<style>body {{ font-family: serif; }}</style>"
                f"<script>var tracking = 'ignore me';</script></head>"
                f"<body><nav><a href='{entry['prefix']}'>Home</a> | <a href='#top'>Top</a> | "
                f"<a href='javascript:void(0)'>Menu</a></nav>"
                f"<main><h1>{html.escape(page['title'])}</h1>"
                f"<p>{html.escape(page['text'])}</p><ul>{links}</ul></main>"
                f"<footer>&copy; {institute}</footer></body></html>")

    def tasks(self) -> list[dict]:
        """WebWalkerQA lines (module docstring), one a level and site; root URLs need start()
        first."""
        lines = []
        for entry in self.sites:
            pages = entry["site"]["pages"]
            for level, question, answer, sources in entry["questions"]:
                plan, page = [], "home"
                for source in sources:
                    for label in _path(pages, page, source):
                        page = next(t for l, t in pages[page]["links"] if l == label)
                        plan.append(f"visit[{self.url}{self.path(entry, page).lstrip('/')}]")
                lines.append({"question": question, "answer": answer,
                              "root_url": self.url + entry["prefix"][1:],
                              "info": {"type": ("single_source" if len(sources) == 1
                                                else "multi_source"),
                                       "difficulty_level": level, "domain": "institute"},
                              "oracle": plan + [f"answer[{answer}]"]})
        return lines

    def write_tasks(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in self.tasks()), encoding="utf-8")
        return path

    def search(self, query: str) -> list[dict]:
        paths = list(self.pages)
        hits = top_documents(query, [f"{self.pages[p][0]} {self.pages[p][1]}" for p in paths],
                             SEARCH_RESULTS)
        return [{"url": self.url + paths[i].lstrip("/"), "title": self.pages[paths[i]][0],
                 "content": self.pages[paths[i]][1][:200], "engine": "local"} for i in hits]

    def start(self) -> "Website":
        website = self

        class Handler(_Handler):
            site = website
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _workshop(rng, site: dict) -> tuple[str, str, list[str]]:
    """A fact three hops from the root (home, departments, a department, its labs), written on its
    labs page."""
    field = rng.choice(sorted(site["facts"]["departments"]))
    labs = site["facts"]["departments"][field]["page"] + "-labs"
    room = f"W{rng.randint(100, 999)}"
    site["pages"][labs]["text"] += f" The labs share a workshop in room {room}."
    return (f"In which room is the shared workshop of the labs of the Department of {field}?",
            room, [labs])


def _two_sources(rng, site: dict) -> tuple[str, str, list[str]]:
    """A webwalk "hard" question whose answer needs two pages (a comparison)."""
    while True:
        question, answer, sources = _question(rng, "hard", site)
        if len(sources) == 2:
            return question, answer, sources


class _Handler(BaseHTTPRequestHandler):
    site: Website

    def log_message(self, *args):   # (quiet)
        pass

    def do_GET(self):
        parts = urlsplit(self.path)
        self.site.requests.append((self.headers.get("Host"), self.path,
                                   self.headers.get("X-Subscription-Token")))
        if parts.path in self.site.pages:
            return self.send(200, self.site.pages[parts.path][2].encode(),
                             "text/html; charset=utf-8")
        if parts.path == "/search":
            query = parse_qs(parts.query)
            if query.get("format") != ["json"]:
                return self.send(403, b"Forbidden", "text/plain")
            q = query.get("q", [""])[0]
            results = self.site.search(q)
            body = {"query": q, "number_of_results": len(results), "results": results}
            return self.send(200, json.dumps(body).encode(), "application/json")
        if parts.path == BRAVE_PATH:
            return self.brave_search(parse_qs(parts.query))
        test = parts.path[len("/test/"):] if parts.path.startswith("/test/") else None
        handler = (getattr(self, f"test_{test.split('/')[0].replace('-', '_')}", None) if test
                   else None)
        if handler is None:
            return self.send(404, b"<h1>Not found</h1>", "text/html")
        return handler(parts)

    def brave_search(self, query: dict):
        """The Brave Search API's web search (module docstring)."""
        if self.headers.get("X-Subscription-Token") != self.site.api_key:
            return self.send_json(401, brave_error(401, "SUBSCRIPTION_TOKEN_INVALID",
                                                   "The provided subscription token is invalid."))
        q, count = query.get("q", [""])[0], int(query.get("count", ["20"])[0])
        body = {"type": "search", "query": {"original": q, "more_results_available": False}}
        hits = self.site.search(q)[:count]
        if hits:
            body["web"] = {"type": "search", "family_friendly": True, "results": [
                {"type": "search_result", "title": hit["title"], "url": hit["url"],
                 "description": _marked(hit["content"], q), "language": "en"} for hit in hits]}
        self.send_json(200, body)

    def send_json(self, status: int, body):
        self.send(status, json.dumps(body).encode(), "application/json")

    def send(self, status: int, body: bytes, content_type: str | None, headers: dict | None = None):
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # the bad cases
    def test_big(self, parts):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(BIG_PAGE_BYTES))
        self.end_headers()
        chunk = b"<p>" + b"filler text " * 5000 + b"</p>\n"
        try:
            for _ in range(BIG_PAGE_BYTES // len(chunk)):
                self.wfile.write(chunk)
        except OSError:   # (the client stopped reading at its cap)
            pass

    def test_loop(self, parts):
        self.send(302, b"", None, {"Location": "/test/loop"})

    def test_chain(self, parts):
        left = int(parse_qs(parts.query).get("n", ["0"])[0])
        if left > 0:
            return self.send(302, b"", None, {"Location": f"/test/chain?n={left - 1}"})
        self.send(200, b"<title>End</title><p>end of the chain</p>", "text/html")

    def test_to_private(self, parts):
        self.send(302, b"", None, {"Location": "http://10.0.0.1/secret"})

    def test_binary(self, parts):
        self.send(200, b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "image/png")

    def test_binary_as_html(self, parts):
        self.send(200, b"\x00\x01\x02 not text" * 50, "text/html")

    def test_broken(self, parts):
        body = (b"<html><title>Broken page</title><p>Before the break, <a href='/site0/'>a link</a>"
                b"<div><span><![foo bar <p>After the break: the fact is 1234.</p><a href='nowhere")
        self.send(200, body, "text/html")

    def test_latin1(self, parts):
        self.send(200,
                  "<title>Caf\u00e9</title><p>Cr\u00e8me br\u00fbl\u00e9e</p>".encode("latin-1"),
                  "text/html; charset=iso-8859-1")

    def test_meta_charset(self, parts):
        body = ("<html><head><meta charset='windows-1252'></head>"
                "<p>na\u00efve \u20ac5</p>").encode("cp1252")
        self.send(200, body, "text/html")

    def test_plain(self, parts):
        self.send(200, b"just text, no HTML <b>here</b>", "text/plain")

    def test_slow(self, parts):
        time.sleep(3)
        try:
            self.send(200, b"<p>late</p>", "text/html")
        except OSError:   # (the client gave up)
            pass

    def test_forbidden(self, parts):   # (SearXNG's answer to format=json where JSON is off)
        self.send(403, b"Forbidden", "text/plain")

    def test_search_html(self, parts):
        self.send(200, b"<html><p>this is not JSON</p></html>", "text/html")

    # the Brave Search API's bad answers
    def test_brave_rate_limited(self, parts):
        self.send_json(429, brave_error(429, "RATE_LIMITED",
                                        "Request rate limit exceeded for plan."))

    def test_brave_unavailable(self, parts):
        self.send(503, b"upstream connect error", "text/plain")

    def test_brave_bad_json(self, parts):
        self.send(200, b'{"type": "search", "web": {"results": [', "application/json")

    def test_brave_no_results_list(self, parts):
        self.send_json(200, {"type": "search", "query": {"original": "x"},
                             "web": {"type": "search"}})

    def test_brave_not_search(self, parts):
        self.send_json(200, {"query": {"original": "x"}})

    def test_brave_no_url(self, parts):
        self.send_json(200, {"type": "search", "web": {"results": [
            {"title": "Fine", "url": "http://example.org/", "description": "a result"},
            {"title": "No URL", "description": "a result without its url"}]}})

    def test_brave_script_url(self, parts):
        self.send_json(200, {"type": "search", "web": {"results": [
            {"title": "Script", "url": "javascript:alert(1)", "description": "not a page"}]}})

    def test_brave_long(self, parts):
        self.send_json(200, {"type": "search", "web": {"results": [
            {"title": "Long <b>title</b>\n" * 100, "url": "http://example.org/" + "a" * 1000,
             "description": "a line\nof text " * 1000}]}})

    def test_brave_elsewhere(self, parts):   # (to another origin: localhost for 127.0.0.1)
        port = self.server.server_address[1]
        self.send(302, b"", None, {"Location": f"http://localhost:{port}{BRAVE_PATH}?q=x"})


def _marked(text: str, query: str) -> str:
    """`text` as Brave's descriptions are: HTML-escaped, the query's words in <strong>."""
    words = {w.lower() for w in query.split()}
    return " ".join(f"<strong>{html.escape(w)}</strong>" if w.lower().strip(".,") in words
                    else html.escape(w) for w in text.split())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", required=True, help="where to write the tasks (WebWalkerQA JSONL)")
    p.add_argument("--sites", type=int, default=12,
                   help="sites generated (4 tasks each; default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--search-api", choices=("searxng", "brave"), default="searxng",
                   help="the search endpoint the command is given: SearXNG's (default) or the "
                   "fake Brave Search API's (its key set in $BRAVE_SEARCH_API_KEY)")
    p.add_argument("--count-in", default=None,
                   help="after the command: tool calls of this trajectories.jsonl")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the command to run against the site")
    args = p.parse_args(argv)
    website = Website(args.sites, args.seed).start()
    try:
        path = website.write_tasks(Path(args.tasks))
        print(f"serving {website.url} ({len(website.pages)} pages); "
              f"{len(website.tasks())} tasks in {path}", file=sys.stderr, flush=True)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        env = {**os.environ, "MINSKILL_SEARCH_URL": website.url, "MINSKILL_WEB_ALLOW": "127.0.0.1"}
        if args.search_api == "brave":
            env.update(MINSKILL_SEARCH_API="brave", BRAVE_SEARCH_API_KEY=website.api_key)
        code = subprocess.call(command, env=env) if command else 0
    finally:
        website.close()
    if args.count_in:
        print_counts(Path(args.count_in))
    return code


def print_counts(path: Path) -> None:
    """Success, steps and tool calls (with tool errors) per tool of a run's trajectories."""
    from minskill.rollout import load_trajectories
    from minskill.tasks.webagent import tool_call_counts
    trajs = load_trajectories(path)
    n = max(1, len(trajs))
    answered = sum(bool(t.actions) and t.actions[-1].startswith("answer") for t in trajs)
    print(f"\n{len(trajs)} episodes: success {sum(t.success for t in trajs) / n:.2f}, mean steps "
          f"{sum(t.steps for t in trajs) / n:.1f}, answered {answered}, "
          f"errors {sum(bool(t.error) for t in trajs)}")
    print("| tool | calls | per episode | tool errors |\n|---|---|---|---|")
    for tool, c in tool_call_counts(trajs).items():
        print(f"| {tool} | {c['calls']} | {c['calls'] / n:.2f} | {c['errors']} |")


if __name__ == "__main__":
    sys.exit(main())
