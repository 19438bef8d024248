"""searchqa over a real retriever in Search-R1's protocol: minskill's BM25 server answers what BM25 answers
in-process, a rollout through it gets the in-process rewards, a retriever that fails or answers badly is a
failed search the agent sees (counted), and Search-R1's question files load as a suite."""
import argparse
import contextlib
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from minskill.tasks import bm25, load_suite, make_env, oracle_actions
from minskill.tasks import retriever_server, search_r1
from minskill.tasks.search_r1 import RETRIEVER_URL_ENV, RetrieverError, retrieve
from minskill.tasks.searchqa import TASK_TYPES, TOP_K
from helpers import rollouts_by_plan


def write_corpus(path, docs):
    """A corpus file in Search-R1's layout: {"id", "contents": "\\"Title\\"\\ntext"}."""
    path.write_text("".join(json.dumps({"id": f"d{i}", "contents": search_r1.contents_of(d["title"], d["text"])})
                            + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    return path


@contextlib.contextmanager
def serving(tmp_path, docs, corpus_hook=None):
    """minskill's retriever over `docs` (read back from a corpus file), on a free loopback port: its URL."""
    corpus = retriever_server.load_corpus(write_corpus(tmp_path / "corpus.jsonl", docs))
    if corpus_hook:
        corpus_hook(corpus)
    server = retriever_server.start_server(corpus)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    finally:
        server.shutdown()
        server.server_close()


def post(url, payload: bytes, method="POST"):
    request = urllib.request.Request(url, data=payload if method == "POST" else None, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def one_task_per_type():
    tasks = load_suite("searchqa", "heldout", n=8)
    return [next(t for t in tasks if t.type == kind) for kind in TASK_TYPES]


# --------------------------------------------------------------------------- the server is BM25

def test_the_server_answers_what_bm25_answers_in_process(tmp_path):
    for task in one_task_per_type():
        docs = task.env_spec["docs"]
        texts = [f"{d['title']} {d['text']}" for d in docs]
        queries = task.env_spec["searches"] + [task.question, docs[0]["text"], "nothing-in-the-corpus"]
        with serving(tmp_path, docs) as url:
            got = retrieve(url, queries, TOP_K)   # all the queries in one request
            status, raw = post(url, json.dumps({"queries": queries[:1], "topk": len(docs)}).encode())
        assert got == [[{"title": docs[i]["title"], "text": docs[i]["text"]}
                        for i in bm25.top_documents(q, texts, TOP_K)] for q in queries]
        assert got[-1] == [] and all(hits for hits in got[:-1]) and max(map(len, got)) == TOP_K
        # return_scores false (the default): the documents themselves, every matching one, best first
        expected = bm25.top_documents(queries[0], texts, len(docs))
        assert status == 200 and [d["id"] for d in raw["result"][0]] == [f"d{i}" for i in expected]
        assert raw["result"][0][0]["contents"] == f'"{docs[expected[0]]["title"]}"\n{docs[expected[0]]["text"]}'


def test_scores_are_bm25_s_and_the_request_fields_are_checked(tmp_path):
    docs = one_task_per_type()[0].env_spec["docs"]
    texts = [f"{d['title']} {d['text']}" for d in docs]
    query = f"{docs[3]['title']} born city founded"   # (many documents match)
    with serving(tmp_path, docs) as url:
        status, raw = post(url, json.dumps({"queries": [query], "topk": 2, "return_scores": True}).encode())
        assert status == 200 and len(raw["result"][0]) == 2
        scores = bm25.bm25_scores(query, texts)
        assert [hit["score"] for hit in raw["result"][0]] == sorted(scores, reverse=True)[:2]
        assert len(post(url, json.dumps({"queries": [query]}).encode())[1]["result"][0]) == 3   # --topk
        for body, status, named in [(b"{not json", 400, "not JSON"), (b'{"queries": "x"}', 400, "'queries'"),
                                    (b'{"queries": ["x"], "topk": -1}', 400, "'topk'"),
                                    (b'{"queries": ["x"], "return_scores": "yes"}', 400, "'return_scores'")]:
            got_status, reply = post(url, body)
            assert got_status == status and named in reply["detail"]
        assert post(url.replace("/retrieve", "/other"), b"{}")[0] == 404
        assert post(url, b"", method="GET")[0] == 405


# --------------------------------------------------------------------------- a rollout through it

def test_a_rollout_through_the_http_retriever_gets_the_in_process_rewards(tmp_path, monkeypatch):
    tasks = one_task_per_type()
    wrong = tasks[1].env_spec["golden_answers"][0]   # one task answered wrong: a reward of 0 must match too

    def reply(action):
        return "answer[nobody at all]" if action == f"answer[{wrong}]" else action

    monkeypatch.delenv(RETRIEVER_URL_ENV, raising=False)
    in_process = rollouts_by_plan(tasks, reply)
    asked = []

    def count_searches(corpus):
        search = corpus.search
        corpus.search = lambda query, k: asked.append(query) or search(query, k)

    for task, local in zip(tasks, in_process):
        with serving(tmp_path, task.env_spec["docs"], count_searches) as url:
            monkeypatch.setenv(RETRIEVER_URL_ENV, url)
            [remote] = rollouts_by_plan([task], reply)
        assert remote.reward == local.reward and remote.success == local.success
        assert remote.observations == local.observations   # the same documents, shown the same way
    assert [t.success for t in in_process] == [True, False, True, True]
    assert len(asked) == sum(len(t.env_spec["searches"]) for t in tasks)


# --------------------------------------------------------------------------- a retriever that fails

class Replies(BaseHTTPRequestHandler):
    reply = (200, b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        status, body = self.reply
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def answering(status, body):
    server = HTTPServer(("127.0.0.1", 0), type("Fixed", (Replies,), {"reply": (status, body)}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    finally:
        server.shutdown()
        server.server_close()


DOC = {"document": {"id": "1", "contents": '"T"\ntext'}, "score": 1.0}


@pytest.mark.parametrize("status,body,named", [
    (200, b"<html>busy</html>", "not JSON"),
    (200, b'{"results": []}', "no field 'result'"),
    (200, json.dumps({"result": [[DOC], [DOC]]}).encode(), "2 lists for 1 queries"),
    (200, json.dumps({"result": [[DOC] * 4]}).encode(), "result[0] holds 4 documents for topk 3"),
    (200, json.dumps({"result": [[{"document": {"id": "1"}, "score": 1}]]}).encode(),
     "result[0][0].document.contents is missing"),
    (200, json.dumps({"result": [[{"document": {"contents": 7}}]]}).encode(),
     "result[0][0].document.contents must be a string"),
    (200, json.dumps({"result": "none"}).encode(), "result must be a list"),
    (500, b"Internal Server Error", "HTTP 500"),
])
def test_a_bad_reply_is_a_failed_search_naming_the_field(status, body, named, monkeypatch):
    task = one_task_per_type()[0]
    with answering(status, body) as url:
        with pytest.raises(RetrieverError, match="the retriever http://127.0.0.1:") as error:
            retrieve(url, ["q"], TOP_K)
        assert named in str(error.value)
        monkeypatch.setenv(RETRIEVER_URL_ENV, url)
        env = make_env(task)
        env.reset()
        observation, done, _ = env.step("search[anything]")
    assert observation.startswith("Tool error (search): ") and named in observation and not done
    assert env.tool_errors == 1 and env.tool_calls == {"search": 1}
    # the episode goes on: the answer is still scored
    assert env.step(oracle_actions(task)[-1])[2] is True


def test_no_answer_a_reply_over_the_cap_and_a_bad_url_are_errors_too(tmp_path):
    with answering(200, json.dumps({"result": [[DOC]]}).encode()) as url:
        assert retrieve(url, ["q"], TOP_K) == [[{"title": "T", "text": "text"}]]
        with pytest.raises(RetrieverError, match="a reply over 10 bytes"):
            retrieve(url, ["q"], TOP_K, max_bytes=10)
    with pytest.raises(RetrieverError, match="did not answer"):
        retrieve(url, ["q"], TOP_K, timeout=5)   # (the server is closed now)
    with pytest.raises(RetrieverError, match="not a retriever URL"):
        retrieve("ftp://example.org/x", ["q"], TOP_K)
    assert search_r1.endpoint("http://127.0.0.1:8000") == "http://127.0.0.1:8000/retrieve"
    assert search_r1.endpoint("http://h:1/api/search") == "http://h:1/api/search"


def test_the_flag_sets_the_variable_and_refuses_a_bad_url(monkeypatch):
    monkeypatch.setenv(RETRIEVER_URL_ENV, " ")   # (set, so that monkeypatch restores what the flag sets)
    assert search_r1.retriever_url() is None     # blank: none
    parser = argparse.ArgumentParser(exit_on_error=False)
    search_r1.add_retriever_url_arg(parser)
    assert parser.parse_args(["--retriever-url", "http://127.0.0.1:8000"]).retriever_url \
        == "http://127.0.0.1:8000/retrieve"
    assert search_r1.retriever_url() == "http://127.0.0.1:8000/retrieve"
    with pytest.raises(argparse.ArgumentError, match="not a retriever URL"):
        parser.parse_args(["--retriever-url", "127.0.0.1:8000"])


# --------------------------------------------------------------------------- Search-R1's question files

def test_a_search_r1_question_file_loads_as_a_suite_and_is_searched_through_the_retriever(tmp_path, monkeypatch):
    task = one_task_per_type()[1]   # multi-hop: two searches
    golden = task.env_spec["golden_answers"][0]
    lines = [{"id": "test_0", "question": task.question.rstrip("?"), "golden_answers": ["someone else", golden],
              "data_source": "hotpotqa", "metadata": {"level": "hard"}},
             {"id": "test_1", "question": "Who wrote it?", "golden_answers": ["Nobody"], "type": "comparison",
              "split": "train"}]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    monkeypatch.delenv(RETRIEVER_URL_ENV, raising=False)
    with pytest.raises(ValueError, match="--retriever-url"):
        load_suite(str(path), split="all")
    with serving(tmp_path, task.env_spec["docs"]) as url:
        monkeypatch.setenv(RETRIEVER_URL_ENV, url)
        tasks = load_suite(f"searchqa:{path}", split="all")
        assert [t.to_dict() for t in load_suite(str(path), split="all")] == [t.to_dict() for t in tasks]
        first, second = tasks
        assert first.question == task.question and first.env_spec["golden_answers"] == ["someone else", golden]
        assert first.type == "direct_retrieval" and second.type == "comparison"
        assert first.metadata["source"] == {"id": "test_0", "data_source": "hotpotqa",
                                            "metadata": {"level": "hard"}}
        assert second.metadata["split"] == "train" and [t.id for t in load_suite(str(path), "train")] == [second.id]
        env = make_env(first)
        env.reset()
        for name, action in zip(task.env_spec["searches"], oracle_actions(task)):
            assert f"(Title: {name})" in env.step(action)[0]
        env.step(f"answer[{golden}]")   # EM against any golden answer
    assert env.success and env.em and env.f1 == 1.0 and env.tool_errors == 0
    with pytest.raises(ValueError, match="no scripted solution"):
        oracle_actions(first)


@pytest.mark.parametrize("line,named", [
    ('{"question": "q?"}', "'golden_answers'"),
    ('{"question": "q?", "golden_answers": []}', "'golden_answers'"),
    ('{"question": "", "golden_answers": ["a"]}', "'question'"),
    ('{"question": "q?", "golden_answers": ["a"], "split": "test"}', "'split'"),
    ("[1, 2]", "expected a JSON object"),
])
def test_a_bad_question_line_is_an_error_naming_file_and_line(tmp_path, monkeypatch, line, named):
    monkeypatch.setenv(RETRIEVER_URL_ENV, "http://127.0.0.1:9/retrieve")
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "ok?", "golden_answers": ["a"]}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:2: .*{named}"):
        load_suite(f"searchqa:{path}")


# --------------------------------------------------------------------------- the server's command line

def test_the_server_s_command_line(tmp_path, capsys):
    done = subprocess.run([sys.executable, "-m", "minskill.tasks.retriever_server", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--corpus" in done.stdout and "127.0.0.1" in done.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "\\"T\\"\\nx"}\n{"id": 2}\n', encoding="utf-8")
    assert retriever_server.main(["--corpus", str(bad), "--port", "0"]) == 2
    assert f"{bad}:2: field 'contents' is missing" in capsys.readouterr().err
