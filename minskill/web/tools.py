"""The web agent's tools over HTTP: web_search (SearXNG's JSON API, or the Brave Search API's),
visit (a page as readable text with numbered links), read_file (a task's own attachment), and the
LLM judge of WebWalker's answers.

Every failure is a ToolError naming what and why (the agent sees it as "Tool error (verb): ..."),
never a traceback: a backend or page that does not answer, an HTTP error status, a page over the
size cap (cut, and said), a redirect loop, a binary file, HTML that does not parse (read as far as
it goes, the rest with tags stripped), a refused host.

URLs a model writes are untrusted. `visit` fetches only http and https URLs without a user name or
password; it resolves the host and refuses it when any of its addresses is not a public one
(loopback, private, link-local, shared, multicast, reserved: ipaddress's is_global) unless the
allow-list names the host, the address or a network holding it (--web-allow
127.0.0.1,10.0.0.0/8,intranet.example; MINSKILL_WEB_ALLOW); with --web-allow-only only the
allow-list's hosts are fetched at all (a WebWalker site and nothing else). The connection goes to
the very address that was checked (no second DNS answer can move it), each redirect is checked the
same way, and at most --web-max-redirects are followed. A page is read for at most --web-timeout
seconds in all and at most --web-max-bytes bytes (the rest is left unread and the page says it was
cut); its charset is the Content-Type's, else an HTML <meta charset>, else UTF-8, and bytes that are
not in it read as U+FFFD. Proxies from the environment are not used. The search backend is the
user's own (--search-url; with --search-api brave, Brave's host unless --search-url names another),
so its host needs no allow-list; the URLs it returns are untrusted like any other. The Brave Search
API's key is read from $BRAVE_SEARCH_API_KEY only (a flag's value would land in the run's recorded
command), sent in its header and to no other origin (a redirect elsewhere drops it), and written in
no message.

Settings are read from the environment of the process at each episode (WebSettings.from_environ), so
that every script runs web suites unchanged; rollout's flags (add_web_args) set the same variables
as they are parsed.
"""
from __future__ import annotations

import argparse
import codecs
import csv
import http.client
import io
import ipaddress
import json
import os
import re
import socket
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urljoin, urlsplit

from minskill.serve.client import ChatClient, ChatError
from minskill.tasks.webagent import TOOLS, ToolError

from .page_text import Page, html_to_text, strip_tags

USER_AGENT = "minskill-web-agent/1.0 (research agent)"
HEADERS = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity",
           "Accept": "text/html,text/plain;q=0.9,*/*;q=0.5"}
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml",
              "application/javascript", "application/ld+json", "application/rss+xml",
              "application/atom+xml")
SUPPORTED_FILES = "text, CSV/TSV, JSON, HTML, XML and ZIP archives (their listing)"
BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"
BRAVE_PATH = "/res/v1/web/search"
BRAVE_KEY_ENV = "BRAVE_SEARCH_API_KEY"   # the name Brave's own examples use
# WebWalker's judge: LangChain's "cot_qa" evaluator (WebWalker's evaluate.py loads it), whose prompt
# is this; QUESTION is the question, CONTEXT the reference, STUDENT ANSWER the agent's answer.
JUDGE_PROMPT = (
    "You are a teacher grading a quiz.\n"
    "You are given a question, the context the question is about, and the student's answer. "
    "You are asked to score the student's answer as either CORRECT or INCORRECT, based on the "
    "context.\n"
    "Write out in a step by step manner your reasoning to be sure that your conclusion is correct. "
    "Avoid simply stating the correct answer at the outset.\n\n"
    "Example Format:\nQUESTION: question here\nCONTEXT: context the question is about here\n"
    "STUDENT ANSWER: student's answer here\nEXPLANATION: step by step reasoning here\n"
    "GRADE: CORRECT or INCORRECT here\n\n"
    "Grade the student answers based ONLY on their factual accuracy. Ignore differences in "
    "punctuation and phrasing between the student answer and true answer. It is OK if the student "
    "answer contains more information than the true answer, as long as it does not contain any "
    "conflicting statements. Begin! \n\n"
    "QUESTION: {query}\nCONTEXT: {context}\nSTUDENT ANSWER: {result}\nEXPLANATION:")
_GRADE = re.compile(r"grade:\s*(correct|incorrect)", re.I)
_META_CHARSET = re.compile(rb"<meta[^>]{0,200}?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]{1,40})",
                           re.I)

# (flag, environment variable, WebSettings field, help)
WEB_FLAGS = [
    ("--search-url", "MINSKILL_SEARCH_URL", "search_url",
     "web suites: base URL of a SearXNG instance (its /search?format=json; JSON must be on in "
     "its settings.yml); with --search-api brave, where Brave's API is (default "
     f"{BRAVE_URL})"),
    ("--search-api", "MINSKILL_SEARCH_API", "search_api",
     "web suites: the search backend's API: searxng (default; needs --search-url) or brave (the "
     f"Brave Search API; its key from ${BRAVE_KEY_ENV}, never a flag)"),
    ("--web-allow", "MINSKILL_WEB_ALLOW", "allow",
     "web suites: comma-separated hosts, addresses or networks (CIDR) fetched although not "
     "public, e.g. 127.0.0.1"),
    ("--web-allow-only", "MINSKILL_WEB_ALLOW_ONLY", "allow_only",
     "web suites: 1 = fetch only the --web-allow hosts (refuse every other, public ones too)"),
    ("--web-timeout", "MINSKILL_WEB_TIMEOUT", "timeout",
     "web suites: seconds one fetch may take in all (default 15)"),
    ("--web-max-bytes", "MINSKILL_WEB_MAX_BYTES", "max_bytes",
     "web suites: bytes of a page or file read at most; the rest is cut (default 2000000)"),
    ("--web-max-redirects", "MINSKILL_WEB_MAX_REDIRECTS", "max_redirects",
     "web suites: redirects followed at most (default 5)"),
    ("--observation-chars", "MINSKILL_OBSERVATION_CHARS", "observation_chars",
     "web suites: characters of a tool's result shown to the agent at most (default 4000)"),
    ("--tools", "MINSKILL_WEB_TOOLS", "tools",
     "web suites: the tools every task offers, comma-separated of search,visit,read_file "
     "(default: each task's own: WebWalkerQA visit; GAIA search, visit and read_file when it has "
     "a file)"),
    ("--judge-url", "MINSKILL_JUDGE_URL", "judge_url",
     "web suites: OpenAI-compatible base URL of an LLM judge: WebWalkerQA answers scored by its "
     "verdict on WebWalker's judging prompt (exact match and F1 are kept beside it)"),
    ("--judge-model", "MINSKILL_JUDGE_MODEL", "judge_model",
     "web suites: model name sent to --judge-url"),
    ("--tool-calls", "MINSKILL_TOOL_CALLS", "tool_calls",
     "web suites: how the agent calls its tools: openai = OpenAI's `tools` field (the server "
     "parses the calls: vLLM, minskill's own); react = a text format minskill parses; auto "
     "(default) = openai, and react for the rest of the run where the server refuses `tools`"),
    ("--tool-choice", "MINSKILL_TOOL_CHOICE", "tool_choice",
     "web suites: tool_choice sent with the openai format: required (default: every reply is "
     "one call, which the server constrains) or auto (the model may write text: read as ReAct)"),
]
CHOICES = {"tool_calls": ("auto", "openai", "react"), "tool_choice": ("required", "auto"),
           "search_api": ("searxng", "brave")}


@dataclass(frozen=True)
class WebSettings:
    """What the tools may do (module docstring); from_environ reads each from its variable."""
    search_url: str | None = None
    search_api: str = "searxng"
    allow: tuple[str, ...] = ()
    allow_only: bool = False
    timeout: float = 15.0
    max_bytes: int = 2_000_000
    max_redirects: int = 5
    observation_chars: int = 4000
    tools: tuple[str, ...] | None = None
    judge_url: str | None = None
    judge_model: str | None = None
    tool_calls: str = "auto"
    tool_choice: str = "required"
    search_results: int = 5
    networks: tuple = field(default=(), compare=False)   # the allow-list's networks, parsed
    api_key: str = field(default="", repr=False, compare=False)   # $BRAVE_SEARCH_API_KEY

    @classmethod
    def from_environ(cls, environ=None) -> "WebSettings":
        """The settings the MINSKILL_* variables give; a bad value is a ValueError naming it."""
        environ = os.environ if environ is None else environ
        values = {}
        for _, variable, name, _ in WEB_FLAGS:
            text = (environ.get(variable) or "").strip()
            if text:
                values[name] = _setting(name, text, variable)
        networks = tuple(_network(entry) for entry in values.get("allow", ()))
        return cls(**values, networks=tuple(n for n in networks if n is not None),
                   api_key=(environ.get(BRAVE_KEY_ENV) or "").strip())


def _setting(name: str, text: str, variable: str):
    kind = WebSettings.__dataclass_fields__[name].default
    try:
        if name in ("allow", "tools"):
            items = tuple(item.strip().lower() for item in text.split(",") if item.strip())
            unknown = [t for t in items if t not in TOOLS] if name == "tools" else []
            if unknown:
                raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(TOOLS)}")
            return items
        if name in CHOICES:
            if text.lower() not in CHOICES[name]:
                raise ValueError(f"must be one of {', '.join(CHOICES[name])}")
            return text.lower()
        if name == "allow_only":
            return text.lower() in ("1", "true", "yes")
        if isinstance(kind, (int, float)) and not isinstance(kind, bool):
            value = type(kind)(text)
            if not value > 0:
                raise ValueError("must be > 0")
            return value
        return text
    except ValueError as error:
        raise ValueError(f"{variable}={text!r}: {error}") from None


def _network(entry: str):
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None   # (a host name: matched by name)


def add_web_args(parser) -> None:
    """The web suites' flags (WEB_FLAGS) on a script's parser: each, once checked, sets its variable
    as it is parsed (episodes and child processes read it); a bad value is the parser's error naming
    the flag."""
    group = parser.add_argument_group("web suites (minskill.web; each sets a MINSKILL_* variable)")
    for flag, variable, name, text in WEB_FLAGS:
        group.add_argument(flag, action=_SetVariable, variable=variable, setting=name, default=None,
                           help=f"{text} [{variable}]")


class _SetVariable(argparse.Action):
    def __init__(self, option_strings, dest, variable: str, setting: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.variable, self.setting = variable, setting

    def __call__(self, parser, namespace, value, option_string=None):
        try:
            _setting(self.setting, value, self.variable)
        except ValueError as error:
            raise argparse.ArgumentError(self, str(error)) from None
        if self.setting == "search_api" and value.lower() == "brave" and not (
                os.environ.get(BRAVE_KEY_ENV) or "").strip():
            raise argparse.ArgumentError(self, f"the Brave Search API needs its key in "
                                               f"${BRAVE_KEY_ENV} (not set)")
        os.environ[self.variable] = value
        setattr(namespace, self.dest, value)


# -------------------------------------------------------------------------- an episode's toolbox

class WebTools:
    """The tools as tasks/webagent.WebAgentEnv calls them; each raises ToolError on a failure."""

    def __init__(self, settings: WebSettings):
        self.settings = settings
        self.tools, self.observation_chars = settings.tools, settings.observation_chars
        self.can_search = bool(settings.search_url) or settings.search_api != "searxng"
        self.judges = bool(settings.judge_url)

    @classmethod
    def from_environ(cls) -> "WebTools":
        return cls(WebSettings.from_environ())

    def search(self, query: str) -> str:
        results = web_search(query, self.settings)
        if not results:
            return "No results."
        return "\n".join(f"{k}. {r['title']}\n   {r['url']}\n   {r['snippet']}"
                         for k, r in enumerate(results, start=1))

    def visit(self, url: str) -> Page:
        return visit(url, self.settings)

    def read_file(self, path: Path) -> str:
        return read_file(path, self.settings.max_bytes)

    def judge(self, question: str, answer: str, reference: str) -> tuple[bool, str]:
        return judge_answer(question, answer, reference, self.settings)


# --------------------------------------------------------------------------- search

def web_search(query: str, settings: WebSettings) -> list[dict]:
    """The backend's top results for `query`: [{"title", "url", "snippet"}] (SearXNG's JSON API, or
    the Brave Search API's with --search-api brave)."""
    if settings.search_api == "brave":
        return brave_search(query, settings)
    if not settings.search_url:
        raise ToolError("no search backend is set (--search-url / MINSKILL_SEARCH_URL: SearXNG's)")
    base = settings.search_url.rstrip("/")
    base = base if base.endswith("/search") else base + "/search"
    url = base + "?" + urlencode({"q": query, "format": "json"})
    try:
        fetched = fetch(url, settings, trusted=True, what="the search backend")
    except ToolError as error:
        hint = " (is format=json on in SearXNG's settings.yml?)" if "HTTP 403" in str(error) else ""
        raise ToolError(f"{error}{hint}") from None
    try:
        results = json.loads(fetched.text())["results"]
        results = [r for r in results if isinstance(r, dict)]
    except (ValueError, KeyError, TypeError):
        raise ToolError(f"the search backend answered without a JSON 'results' list (is "
                        f"format=json on in SearXNG's settings.yml?): {fetched.text()[:200]!r}"
                        ) from None
    return [_search_result(r.get("title"), r.get("url"), r.get("content"))
            for r in results[:settings.search_results]]


def _search_result(title, url, snippet) -> dict:
    """One result, each field on one line and cut to its budget."""
    return {"title": " ".join(str(title or "").split())[:200], "url": str(url or "")[:500],
            "snippet": " ".join(str(snippet or "").split())[:400]}


def brave_search(query: str, settings: WebSettings) -> list[dict]:
    """The Brave Search API's web results, as its reference has them
    (api-dashboard.search.brave.com/api-reference/web/search/get): GET BRAVE_URL?q=...&count=N with
    the key in the X-Subscription-Token header; the answer's web.results[] are {title, url,
    description}, with <strong> marks in the text. A response of type "search" without `web` has no
    web results (the reference marks `web` optional). Every other shape is a ToolError naming the
    field's path; no message carries the key."""
    what = "the Brave Search API"
    if not settings.api_key:
        raise ToolError(f"{what} needs its key in ${BRAVE_KEY_ENV} (not set)")
    url = _brave_url(settings.search_url) + "?" + urlencode(
        {"q": query, "count": settings.search_results})
    headers = {"Accept": "application/json", "X-Subscription-Token": settings.api_key}
    try:
        try:
            fetched = fetch(url, settings, trusted=True, what=what, headers=headers)
        except HTTPStatusError as error:
            raise ToolError(f"{error}{_api_error_detail(error)}") from None
        return _brave_results(fetched, what, settings.search_results)
    except ToolError as error:
        raise ToolError(str(error).replace(settings.api_key, "<the key>")) from None


def _brave_url(search_url: str | None) -> str:
    """--search-url as Brave's endpoint: none is Brave's own, a bare origin gets Brave's path."""
    if not search_url:
        return BRAVE_URL
    return search_url.rstrip("/") + (BRAVE_PATH if urlsplit(search_url).path in ("", "/") else "")


def _api_error_detail(error: HTTPStatusError) -> str:
    """What the API said in its error body (Brave's {"error": {"code", "detail"}}, else its text),
    and what to do about it."""
    try:
        said = json.loads(error.body)["error"]
        said = " ".join(f"{said.get('detail') or ''} ({said.get('code') or '?'})".split())
    except (ValueError, KeyError, TypeError, AttributeError):
        said = " ".join(error.body.decode("utf-8", errors="replace").split())
    hint = ""
    if error.status in (401, 403) or "SUBSCRIPTION_TOKEN" in said:
        hint = f"; is ${BRAVE_KEY_ENV} the key of a subscribed plan?"
    elif error.status == 429:
        hint = "; the plan's rate limit or quota is spent: wait, or raise the plan"
    elif error.status >= 500:
        hint = "; the API failed on its side: try again later"
    return (f": {said[:300]}" if said else "") + hint


def _brave_results(fetched: Fetched, what: str, n: int) -> list[dict]:
    cut = f" (cut at the size cap: {fetched.note})" if fetched.note else ""
    try:
        answer = json.loads(fetched.text())
    except ValueError as error:
        raise ToolError(f"{what} answered no JSON ({error}){cut}: {fetched.text()[:200]!r}"
                        ) from None
    if not isinstance(answer, dict):
        raise ToolError(f"{what} answered JSON that is no object: {fetched.text()[:200]!r}")
    if "web" not in answer and answer.get("type") == "search":
        return []
    web = answer.get("web")
    results = web.get("results") if isinstance(web, dict) else None
    if not isinstance(results, list):
        raise ToolError(f"{what} answered without a list at web.results: "
                        f"{fetched.text()[:200]!r}")
    found = []
    for k, result in enumerate(results[:n]):
        where = f"{what}'s web.results[{k}]"
        if not isinstance(result, dict):
            raise ToolError(f"{where} is not an object: {str(result)[:100]!r}")
        url = result.get("url")
        if not isinstance(url, str) or not url.strip():
            raise ToolError(f"{where}.url is missing (the result has {sorted(result)[:8]})")
        if not _is_web_url(url.strip()):
            raise ToolError(f"{where}.url is not an http(s) URL: {url[:200]!r}")
        found.append(_search_result(strip_tags(str(result.get("title") or "")), url.strip(),
                                    strip_tags(str(result.get("description") or ""))))
    return found


def _is_web_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


# --------------------------------------------------------------------------- visit

def visit(url: str, settings: WebSettings) -> Page:
    """The page at `url` read for an agent: HTML as text with numbered links, other text as is."""
    fetched = fetch(url, settings)
    if fetched.kind == "html":
        page = html_to_text(fetched.text(), fetched.url)
    else:
        page = Page(url=fetched.url, text=fetched.text())
    notes = [n for n in (fetched.note, page.note) if n]
    page.note = "; ".join(notes)
    return page


@dataclass
class Fetched:
    url: str                  # after redirects
    kind: str                 # "html" or "text"
    body: bytes
    charset: str
    note: str = ""            # the page was cut at the size cap

    def text(self) -> str:
        return self.body.decode(self.charset, errors="replace")


class HTTPStatusError(ToolError):
    """An HTTP error status; `body`: the first 4 KB of the answer where fetch was asked for them."""

    def __init__(self, message: str, status: int, body: bytes = b""):
        super().__init__(message)
        self.status, self.body = status, body


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    path: str
    address: str              # the checked address the connection goes to


def fetch(url: str, settings: WebSettings, *, trusted: bool = False, what: str = "",
          headers: dict | None = None) -> Fetched:
    """GET `url` (module docstring: the allow-list, redirects, time and size caps, charset). An
    HTTP error status is an HTTPStatusError. `headers` are sent besides HEADERS to `url`'s origin
    only (a key in them goes to no other host a redirect names), and ask for an error's body."""
    first, deadline = url, time.monotonic() + settings.timeout
    what, origin = what or repr(url[:200]), None
    for _ in range(settings.max_redirects + 1):
        target = check_url(url, settings, trusted)
        origin = origin or (target.scheme, target.host, target.port)
        extra = headers if headers and (target.scheme, target.host, target.port) == origin else {}
        connection = _connection(target, max(0.1, deadline - time.monotonic()))
        try:
            connection.request("GET", target.path, headers={**HEADERS, **extra})
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location").strip())
                continue
            if response.status >= 400:
                raise HTTPStatusError(f"{what}: HTTP {response.status} {response.reason}".strip(),
                                      response.status, response.read(4096) if extra else b"")
            return _read_response(response, url, settings, deadline, what)
        except (OSError, http.client.HTTPException) as error:   # (timeouts, refused, TLS, bad HTTP)
            reason = ("timed out" if isinstance(error, TimeoutError)
                      else f"{type(error).__name__}: {error}")
            raise ToolError(f"{what} did not answer ({reason[:200]})") from None
        finally:
            connection.close()
    raise ToolError(f"{first[:200]!r}: more than {settings.max_redirects} redirects (a redirect "
                    f"loop?); the last to {url[:200]!r}")


def check_url(url: str, settings: WebSettings, trusted: bool = False) -> _Target:
    """Where `url` may be fetched from, or a ToolError saying why not (module docstring)."""
    if not isinstance(url, str) or len(url) > 4096 or any(c in url for c in "\r\n\x00 "):
        raise ToolError(f"not a URL: {str(url)[:200]!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ToolError(f"not a URL: {url[:200]!r} ({error})") from None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https"):
        raise ToolError(f"only http and https URLs can be visited, not {url[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise ToolError(f"a URL with a user name or password is refused: {url[:200]!r}")
    if not host:
        raise ToolError(f"no host in the URL {url[:200]!r}")
    port = port or (443 if scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = sorted({info[4][0] for info in infos})
    except (OSError, UnicodeError) as error:
        raise ToolError(f"the host {host!r} cannot be resolved ({error})") from None
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])   # (an IPv6 address may carry a %zone)
        if not trusted and not _allowed(host, ip, settings):
            why = ("it is not on the allow-list (--web-allow-only)" if settings.allow_only else
                   "not a public address (allow it with --web-allow / MINSKILL_WEB_ALLOW)")
            raise ToolError(f"the host {host!r} ({address}) is refused: {why}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(scheme, host, port, path, addresses[0])


def _allowed(host: str, address, settings: WebSettings) -> bool:
    mapped = getattr(address, "ipv4_mapped", None) or address
    listed = host in settings.allow or any(mapped in network for network in settings.networks
                                           if network.version == mapped.version)
    return listed or (not settings.allow_only and mapped.is_global and not mapped.is_multicast)


def _connection(target: _Target, timeout: float) -> http.client.HTTPConnection:
    """A connection to `target.address` (the checked one) that names `target.host` (Host header, TLS
    SNI and certificate check)."""
    if target.scheme == "https":
        connection = http.client.HTTPSConnection(target.host, target.port, timeout=timeout)
    else:
        connection = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
    # http.client connects through this attribute; pinned, no second DNS answer can move the address
    connection._create_connection = lambda address, *args, **kwargs: socket.create_connection(
        (target.address, target.port), *args, **kwargs)
    return connection


def _read_response(response, url: str, settings: WebSettings, deadline: float,
                   what: str) -> Fetched:
    """The body (at most max_bytes, within the deadline), its kind and charset; a binary body is a
    ToolError."""
    content_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
    chunks, size = [], 0
    while size < settings.max_bytes:
        if time.monotonic() > deadline:
            raise ToolError(f"{what}: not read within {settings.timeout:g} s")
        chunk = response.read1(min(65536, settings.max_bytes - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    body = b"".join(chunks)
    cut = size >= settings.max_bytes and bool(response.read1(1))
    declared = response.getheader("Content-Length")
    size = f"{int(declared):,} bytes" if (declared or "").isdigit() else "longer"
    note = f"the page is {size}; only its first {settings.max_bytes:,} bytes were read" * cut
    html = (content_type in ("text/html", "application/xhtml+xml")
            or (not content_type and _looks_like_html(body)))
    if b"\x00" in body[:4096] or (content_type and not content_type.startswith(TEXT_TYPES)):
        raise ToolError(f"{what} is not a text page ({content_type or 'binary content'}, "
                        f"{declared or len(body)} bytes); visit reads HTML and text")
    charset = (response.msg.get_content_charset() or (_meta_charset(body) if html else None)
               or "utf-8")
    try:
        codecs.lookup(charset)
    except LookupError:
        charset = "utf-8"
    return Fetched(url=url, kind="html" if html else "text", body=body, charset=charset, note=note)


def _looks_like_html(body: bytes) -> bool:
    return bool(re.match(rb"\s*(?:<!doctype html|<html|<head|<body)", body[:512], re.I))


def _meta_charset(body: bytes) -> str | None:
    m = _META_CHARSET.search(body[:4096])
    return m.group(1).decode("ascii") if m else None


# --------------------------------------------------------------------------- read_file

def read_file(path: Path, max_bytes: int) -> str:
    """A task's file as text: text (UTF-8), CSV/TSV rows with " | " between cells, JSON indented,
    HTML as readable text, a ZIP archive's listing; any other kind is a ToolError naming it as
    unsupported."""
    try:
        with open(path, "rb") as f:
            raw, cut = f.read(max_bytes), bool(f.read(1))
    except OSError as error:
        raise ToolError(f"{path.name} cannot be read ({error.strerror or error})") from None
    suffix, note = path.suffix.lower(), f"\n(the file is cut at {max_bytes:,} bytes)" if cut else ""
    if suffix == ".zip" or (raw[:4] == b"PK\x03\x04" and suffix not in (".docx", ".xlsx", ".pptx")):
        return _zip_listing(path) + note
    if b"\x00" in raw or raw[:4] == b"PK\x03\x04" or raw[:5] == b"%PDF-":
        raise ToolError(f"{path.name}: unsupported file type ({suffix or 'no extension'}, "
                        f"{path.stat().st_size:,} bytes); read_file reads {SUPPORTED_FILES}")
    text = raw.decode("utf-8-sig", errors="replace")
    if suffix in (".csv", ".tsv"):
        rows = csv.reader(io.StringIO(text), delimiter="\t" if suffix == ".tsv" else ",")
        return "\n".join(" | ".join(row) for row in rows) + note
    if suffix == ".json" and not cut:
        try:
            return json.dumps(json.loads(text), indent=1, ensure_ascii=False)
        except (ValueError, RecursionError):
            return text
    if suffix in (".html", ".htm"):
        return html_to_text(text, path.name).text + note
    return text + note


def _zip_listing(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        raise ToolError(f"{path.name}: not a readable ZIP archive ({error})") from None
    lines = [f"- {e.filename} ({e.file_size:,} bytes)" for e in entries[:200]]
    return f"ZIP archive {path.name}, {len(entries)} entries:\n" + "\n".join(lines)


# --------------------------------------------------------------------------- the judge

def judge_answer(question: str, answer: str, reference: str,
                 settings: WebSettings) -> tuple[bool, str]:
    """(CORRECT?, the judge's explanation) of the judge at settings.judge_url on JUDGE_PROMPT; a
    judge that does not answer, or answers without a grade, is a ToolError."""
    client = ChatClient(base_url=settings.judge_url, model=settings.judge_model, timeout=120.0,
                        max_retries=2)
    prompt = JUDGE_PROMPT.format(query=question, context=reference, result=answer)
    try:
        messages = [{"role": "user", "content": prompt}]
        reply = client.chat(messages, temperature=0.0, max_tokens=512).texts[0]
    except (ChatError, OSError, IndexError) as error:
        raise ToolError(f"the judge at {settings.judge_url} failed: {error}") from None
    verdict = grade_of(reply)
    if verdict is None:
        raise ToolError(f"the judge's reply has no GRADE: CORRECT or INCORRECT: {reply[-300:]!r}")
    return verdict, " ".join(reply.split())


def grade_of(reply: str) -> bool | None:
    """The verdict of a judge's reply as LangChain's QA evaluators read it: "GRADE:
    CORRECT|INCORRECT", else its first or last word; None when neither says."""
    m = _GRADE.search(reply)
    if m:
        return m.group(1).upper() == "CORRECT"
    words = [w.strip(".,:;!*'\"").upper() for w in reply.split()]
    for word in words[:1] + words[-1:]:
        if word in ("CORRECT", "INCORRECT"):
            return word == "CORRECT"
    return None
