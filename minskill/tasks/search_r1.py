"""Search-R1's retriever protocol, the client side: the `searchqa` suite's search[query] asks a
retriever over HTTP where one is set (--retriever-url URL, $MINSKILL_RETRIEVER_URL), instead of
BM25 over the task's own documents.

The protocol is what Search-R1's retrieval server answers (PeterGriffinJin/Search-R1, commit
a14dc3a, search_r1/search/retrieval_server.py: QueryRequest and retrieve_endpoint) and what its
agent sends (search_r1/llm_agent/generation.py: _batch_search, _passages2string):

    POST URL   {"queries": [q1, q2, ...], "topk": k, "return_scores": true}
    answer     {"result": [[{"document": {"id": ..., "contents": "\\"Title\\"\\ntext"},
                             "score": s}, ...],      # the hits of q1, best first
                           ...]}                     # one list a query, in order

(with "return_scores": false each hit is the document itself; both are read). A document's
"contents" is its title on the first line, in double quotes, and its text on the rest; the title
shown is that line without its quotes (as the server's BM25 retriever makes "title"; Search-R1's
agent shows the quotes), so that the agent sees `Doc 1(Title: T) text` exactly as in-process. A
document without "contents" is read from "title" and "text". The URL is the endpoint itself, as
Search-R1's retriever.url is (http://127.0.0.1:8000/retrieve); a URL with no path gets /retrieve.

retrieve() sends all the queries of one call in one request (the env sends one a search; a caller
with many sends them together). Whatever goes wrong — no answer within TIMEOUT_S, a reply over
MAX_REPLY_BYTES, an HTTP error status, a reply that is not JSON, a missing or mistyped field, a
result whose length is not the number of queries, more hits than topk — is a RetrieverError naming
the URL and the field (`result[0][1].document.contents`), which the env shows the agent as a failed
search ("Tool error (search): ...", counted in env.tool_errors); the run goes on. Proxies from the
environment are not used (the retriever is the user's own, usually on this machine).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import time
from urllib.parse import urlsplit

__all__ = ["RETRIEVER_URL_ENV", "RetrieverError", "add_retriever_url_arg", "retriever_url",
           "endpoint", "retrieve", "parse_reply", "contents_of", "title_and_text", "TIMEOUT_S",
           "MAX_REPLY_BYTES"]

RETRIEVER_URL_ENV = "MINSKILL_RETRIEVER_URL"
TIMEOUT_S = 30.0                   # one request in all: connecting, sending, reading the reply
MAX_REPLY_BYTES = 16 * 2**20       # far above k short passages for a few queries
MAX_SHOWN = 200                    # characters of a bad value quoted in an error


class RetrieverError(ValueError):
    """The retriever cannot answer a search: its URL, the request or its reply (module
    docstring)."""


# --------------------------------------------------------------------------- the flag

def add_retriever_url_arg(group) -> None:
    """--retriever-url URL: searchqa's search[query] asks a Search-R1 retriever (set as the flag is
    parsed, as $MINSKILL_RETRIEVER_URL, which the env reads: the processes a run starts see it
    too)."""
    group.add_argument("--retriever-url", action=_SetRetrieverUrl, default=None, metavar="URL",
                       help="--suite searchqa (or a Search-R1 question file): search[query] asks "
                       "this retriever in Search-R1's protocol (POST {queries, topk, "
                       "return_scores}), e.g. http://127.0.0.1:8000/retrieve; `python -m "
                       "minskill.tasks.retriever_server` serves one (default: BM25 over each "
                       "task's own documents; docs/tasks.md)")


class _SetRetrieverUrl(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        try:
            url = endpoint(values)
        except RetrieverError as error:
            raise argparse.ArgumentError(self, str(error)) from None
        os.environ[RETRIEVER_URL_ENV] = url
        setattr(namespace, self.dest, url)


def retriever_url(environ=None) -> str | None:
    """The retriever the run asks ($MINSKILL_RETRIEVER_URL, as given: a bad one is reported at each
    search), or None: none is set."""
    environ = os.environ if environ is None else environ
    return (environ.get(RETRIEVER_URL_ENV) or "").strip() or None


def endpoint(url) -> str:
    """`url` as requests go to it (/retrieve added to a URL with no path); RetrieverError when it is
    not an http(s) URL with a host."""
    text = str(url).strip()
    try:
        parts = urlsplit(text)
        parts.port   # (raises on a port that is not a number)
    except ValueError as error:
        raise RetrieverError(f"not a retriever URL: {text[:MAX_SHOWN]!r} ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c in text for c in
                                                                          "\r\n\x00 "):
        raise RetrieverError(f"not a retriever URL (http:// or https:// and a host): "
                             f"{text[:MAX_SHOWN]!r}")
    return text if parts.path not in ("", "/") else text.rstrip("/") + "/retrieve"


# --------------------------------------------------------------------------- the request

def retrieve(url: str, queries: list[str], topk: int, *, timeout: float = TIMEOUT_S,
             max_bytes: int = MAX_REPLY_BYTES) -> list[list[dict]]:
    """The hits of each query, in order: each a list of at most `topk` {"title", "text"}, best
    first; one request for all the queries. RetrieverError on any failure (module docstring)."""
    url = endpoint(url)
    body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
    status, reason, data = _post(url, body, timeout, max_bytes)
    if status != 200:
        said = data[:MAX_SHOWN].decode("utf-8", "replace").strip()
        raise RetrieverError(f"the retriever {url}: HTTP {status} {reason}".strip()
                             + (f": {said}" if said else ""))
    return parse_reply(data, len(queries), topk, f"the retriever {url}")


def _post(url: str, body: bytes, timeout: float, max_bytes: int) -> tuple[int, str, bytes]:
    """(status, reason, body) of POST url, the body read within `timeout` seconds in all and at
    most `max_bytes` long."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + timeout
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = kind(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={
            "Content-Type": "application/json", "Accept": "application/json",
            "Accept-Encoding": "identity"})
        response = connection.getresponse()
        chunks, size = [], 0
        while True:
            if time.monotonic() > deadline:
                raise RetrieverError(f"the retriever {url}: no whole reply within {timeout:g} s")
            chunk = response.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise RetrieverError(f"the retriever {url}: a reply over {max_bytes:,} bytes")
            chunks.append(chunk)
        return response.status, response.reason or "", b"".join(chunks)
    except (OSError, http.client.HTTPException) as error:   # (refused, timed out, bad HTTP)
        why = "timed out" if isinstance(error, TimeoutError) else f"{type(error).__name__}: {error}"
        raise RetrieverError(f"the retriever {url} did not answer ({why[:MAX_SHOWN]})") from None
    finally:
        connection.close()


# --------------------------------------------------------------------------- the reply

def parse_reply(data: bytes, n_queries: int, topk: int, where: str) -> list[list[dict]]:
    """The hits of each query in a reply body (retrieve's), or a RetrieverError naming `where` and
    the field."""
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise RetrieverError(f"{where}: the reply is not JSON ({str(error)[:MAX_SHOWN]})") from None
    if not isinstance(reply, dict) or "result" not in reply:
        raise RetrieverError(f"{where}: the reply has no field 'result' (got "
                             f"{json.dumps(reply)[:MAX_SHOWN]})")
    result = reply["result"]
    if not isinstance(result, list):
        raise RetrieverError(f"{where}: field result must be a list, got {type(result).__name__}")
    if len(result) != n_queries:
        raise RetrieverError(f"{where}: field result holds {len(result)} lists for {n_queries} "
                             "queries")
    hits = []
    for q, entries in enumerate(result):
        if not isinstance(entries, list):
            raise RetrieverError(f"{where}: field result[{q}] must be a list, got "
                                 f"{type(entries).__name__}")
        if len(entries) > topk:
            raise RetrieverError(f"{where}: field result[{q}] holds {len(entries)} documents for "
                                 f"topk {topk}")
        hits.append([_document(entry, f"result[{q}][{k}]", where)
                     for k, entry in enumerate(entries)])
    return hits


def _document(entry, field: str, where: str) -> dict:
    """{"title", "text"} of one hit: {"document": {...}, "score": s}, or the document itself."""
    if isinstance(entry, dict) and "document" in entry:
        entry, field = entry["document"], f"{field}.document"
    if not isinstance(entry, dict):
        raise RetrieverError(f"{where}: field {field} must be an object, got "
                             f"{type(entry).__name__}")
    if "contents" in entry:
        if not isinstance(entry["contents"], str):
            raise RetrieverError(f"{where}: field {field}.contents must be a string, got "
                                 f"{type(entry['contents']).__name__}")
        title, text = title_and_text(entry["contents"])
        return {"title": title, "text": text}
    for key in ("title", "text"):
        if not isinstance(entry.get(key), str):
            raise RetrieverError(f"{where}: field {field}.contents is missing (and {field}.{key} "
                                 "is not a string either)")
    return {"title": entry["title"], "text": entry["text"]}


def contents_of(title: str, text: str) -> str:
    """A document's "contents" in Search-R1's corpora: the title in double quotes, a newline, the
    text."""
    return f'"{title}"\n{text}'


def title_and_text(contents: str) -> tuple[str, str]:
    """(title, text) of a "contents": its first line without surrounding double quotes, the rest
    (as Search-R1's BM25 retriever splits it)."""
    first, _, rest = contents.partition("\n")
    return first.strip('"'), rest
