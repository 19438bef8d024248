"""A retriever in Search-R1's protocol (tasks/search_r1.py) over a corpus, by BM25 (tasks/bm25.py),
for `searchqa --retriever-url` (the offline tests, a small corpus); http.server only.

    python -m minskill.tasks.retriever_server --corpus corpus.jsonl --port 8000
    curl -s 127.0.0.1:8000/retrieve -d '{"queries": ["who founded X?"], "topk": 3,
                                         "return_scores": true}'

The corpus is JSONL, one document a line, as Search-R1's corpora are (wiki-18.jsonl): {"id",
"contents": "\\"Title\\"\\ntext"}, or {"title", "text"} (an id is then the line's number). A
document is scored on "Title text", as the searchqa env scores its own documents, so a task's
documents served here rank exactly as in-process (the same top-k, the same order). The index is
built in memory at start (up to some 10^5 short passages; for wiki-18, Search-R1's own server).

POST /retrieve takes {"queries": [str], "topk": int >= 1 (default --topk), "return_scores": bool
(default false)} and answers {"result": [...]}, one list a query: [{"document": {"id",
"contents"}, "score"}] with scores, else the documents themselves; documents scoring 0 are left
out (a query sharing no word with the corpus gets []). A request that is not that (a body that is
not JSON, over MAX_REQUEST_BYTES, a field of the wrong type, more than MAX_QUERIES queries) is
answered 400 (413 for the size) with {"detail": why}; another path is 404, another method 405. It
listens on 127.0.0.1 unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .bm25 import BM25Index
from .qa import _lines
from .search_r1 import contents_of, title_and_text

__all__ = ["Corpus", "load_corpus", "start_server", "main", "MAX_REQUEST_BYTES", "MAX_QUERIES",
           "MAX_TOPK"]

MAX_REQUEST_BYTES = 2**20
MAX_QUERIES = 1024
MAX_TOPK = 1000
DEFAULT_TOPK = 3            # Search-R1's retrieval_server.py --topk


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minskill.tasks.retriever_server",
        description="Serve a corpus by BM25 in Search-R1's retriever protocol (POST /retrieve "
        "{queries, topk, return_scores}), for searchqa's --retriever-url.")
    parser.add_argument("--corpus", required=True, metavar="FILE",
                        help="JSONL, one document a line: {id, contents: '\"Title\"\\ntext'} "
                        "(Search-R1's corpora) or {title, text}")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK,
                        help=f"documents a query gets when the request gives no topk (default "
                        f"{DEFAULT_TOPK})")
    args = parser.parse_args(argv)
    if not 1 <= args.topk <= MAX_TOPK:
        parser.error(f"--topk must be 1 to {MAX_TOPK}, got {args.topk}")
    try:
        corpus = load_corpus(args.corpus)
        server = start_server(corpus, args.host, args.port, args.topk, thread=False)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"serving {len(corpus.documents)} documents of {args.corpus} at "
          f"http://{host}:{port}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


class Corpus:
    """Documents ({"id", "title", "text"}) and their BM25 index, over "title text"."""

    def __init__(self, documents: list[dict]):
        self.documents = documents
        self.index = BM25Index([f"{d['title']} {d['text']}" for d in documents])

    def search(self, query: str, topk: int) -> list[tuple[dict, float]]:
        """(document, score) of the (at most) topk best, best first (BM25Index.top)."""
        return [(self.documents[i], score) for i, score in self.index.top(query, topk)]


def load_corpus(path) -> Corpus:
    """A corpus file (module docstring); ValueError naming FILE:LINE and the field for a bad
    line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    documents = []
    for line_number, line in _lines(path):
        where = f"{path}:{line_number}"
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as error:
            raise ValueError(f"{where}: not readable JSON ({str(error)[:200]})") from None
        documents.append(_corpus_document(record, line_number, where))
    if not documents:
        raise ValueError(f"{path}: no documents (the file is empty)")
    return Corpus(documents)


def _corpus_document(record, line_number: int, where: str) -> dict:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "contents" in record:
        if not isinstance(record["contents"], str):
            raise ValueError(f"{where}: field 'contents' must be a string")
        title, text = title_and_text(record["contents"])
    else:
        for key in ("title", "text"):
            if not isinstance(record.get(key), str):
                raise ValueError(f"{where}: field 'contents' is missing (and field {key!r} is not "
                                 "a string either)")
        title, text = record["title"], record["text"]
    doc_id = record.get("id", str(line_number))
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool):
        raise ValueError(f"{where}: field 'id' must be a string or an integer")
    return {"id": str(doc_id), "title": title, "text": text}


# --------------------------------------------------------------------------- the server

def start_server(corpus: Corpus, host: str = "127.0.0.1", port: int = 0, topk: int = DEFAULT_TOPK,
          thread: bool = True) -> ThreadingHTTPServer:
    """A server of `corpus` bound to host:port (0: a free port: server.server_address says which),
    serving in a daemon thread (thread=False: the caller runs serve_forever). Close it with
    shutdown() and server_close()."""
    handler = type("RetrieveHandler", (_Handler,), {"corpus": corpus, "default_topk": topk})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    if thread:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    corpus: Corpus
    default_topk: int
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        if self.path.split("?")[0] != "/retrieve":
            return self._send(404, {"detail": f"no such endpoint {self.path[:200]!r}; POST "
                                    "/retrieve"})
        try:
            request = self._request()
        except _BadRequest as error:
            return self._send(error.status, {"detail": str(error)})
        queries, topk, with_scores = request
        result = []
        for query in queries:
            hits = self.corpus.search(query, topk)
            documents = [{"id": d["id"], "contents": contents_of(d["title"], d["text"])}
                         for d, _ in hits]
            result.append([{"document": doc, "score": score}
                           for doc, (_, score) in zip(documents, hits)]
                          if with_scores else documents)
        self._send(200, {"result": result})

    def do_GET(self):
        status = 405 if self.path.split("?")[0] == "/retrieve" else 404
        self._send(status, {"detail": "POST /retrieve {queries, topk, return_scores}"})

    def _request(self) -> tuple[list[str], int, bool]:
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            raise _BadRequest(411, "a request body with a Content-Length is needed")
        if int(length) > MAX_REQUEST_BYTES:
            raise _BadRequest(413, f"a request body over {MAX_REQUEST_BYTES:,} bytes")
        try:
            body = json.loads(self.rfile.read(int(length)))
        except (ValueError, RecursionError) as error:
            raise _BadRequest(400, f"the body is not JSON ({str(error)[:200]})") from None
        if not isinstance(body, dict):
            raise _BadRequest(400, "the body must be a JSON object {queries, topk, return_scores}")
        queries = body.get("queries")
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise _BadRequest(400, "field 'queries' must be a list of strings")
        if len(queries) > MAX_QUERIES:
            raise _BadRequest(400, f"field 'queries': {len(queries)} queries, at most "
                              f"{MAX_QUERIES} a request")
        topk = body.get("topk") or self.default_topk   # (Search-R1: a missing or 0 topk: default)
        if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
            raise _BadRequest(400, f"field 'topk' must be an integer 1 to {MAX_TOPK}")
        with_scores = body.get("return_scores", False)
        if not isinstance(with_scores, bool):
            raise _BadRequest(400, "field 'return_scores' must be true or false")
        return queries, topk, with_scores

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status >= 400:
            self.send_header("Connection", "close")   # (a request body left unread)
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):   # (quiet: a rollout sends a request a search)
        pass


class _BadRequest(ValueError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


if __name__ == "__main__":
    sys.exit(main())
