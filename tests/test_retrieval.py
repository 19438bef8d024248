"""Retrieval as MASA does it: per task, the top-k general and task-specific skills by keyword
(BM25) or embedding (cosine, from a /v1/embeddings endpoint), always with the common mistakes."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from minskill import rollout
from minskill.retrieval import RetrievalError, RetrievedSkills, Retriever, retriever_from_args, with_retrieval
from minskill.tasks.bm25 import bm25_scores, tokens
from minskill.serve.client import ChatClient
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from minskill.tasks import Task


def skill(name, description, body=""):
    return Skill(name=name, description=description, body=body)


def library() -> SkillSet:
    """Eight general skills and two task types; each skill's words are chosen so the expected picks are clear."""
    general = [
        skill("answer-format", "Write the final answer on the last line.", "End with 'Answer: X'."),
        skill("unit-conversion", "Convert between units such as km and miles.", "1 km = 0.621 miles; 1 kilogram is about 2.2 pounds."),
        skill("count-from-facts", "Count items listed in the facts.", "Count how many items match, one by one."),
        skill("entity-lookup", "Find the fact about a named person or place.", "Quote the sentence naming it."),
        skill("arithmetic-steps", "Add and subtract numbers step by step.", "Write each sum."),
        skill("dates", "Work with calendar dates and weekdays.", "Count days forward."),
        skill("currency", "Convert prices between currencies.", "Use the given exchange rate."),
        skill("spelling", "Spell words letter by letter.", "Write each letter."),
    ]
    conversion = [
        skill("length-table", "Lengths: km, miles, feet.", "1 mile = 1.609 km."),
        skill("mass-table", "Masses: kilograms and pounds.", "1 kg = 2.205 pounds."),
        skill("temperature", "Celsius and Fahrenheit.", "F = C * 9/5 + 32."),
    ]
    return SkillSet(general=general, task_specific={"conversion": conversion,
                                                    "arithmetic": [skill("carry-digits", "Carry tens.", "")]},
                    common_mistakes=["Answering with the unit missing.", "Rounding too early."])


def names(skill_set: SkillSet, task_type: str) -> tuple[list[str], list[str]]:
    return [s.name for s in skill_set.general], [s.name for s in skill_set.task_specific.get(task_type, [])]


# ---------------------------------------------------------------------------------------------- keyword

def test_tokens_and_bm25_follow_the_docstring():
    assert tokens("How many Miles are 10 km? Über-fast") == ["many", "miles", "10", "km", "über", "fast"]
    # one pool of 3: 'km' in two documents, 'miles' in one; BM25 by hand (k1 = 1.2, b = 0.75)
    import math
    docs = ["km miles", "km", "other words here"]
    scores = bm25_scores("miles km", docs)
    avgdl = 6 / 3
    idf = lambda n: math.log(1 + (3 - n + 0.5) / (n + 0.5))  # noqa: E731
    term = lambda f, dl: f * 2.2 / (f + 1.2 * (0.25 + 0.75 * dl / avgdl))  # noqa: E731
    assert scores == pytest.approx([idf(2) * term(1, 2) + idf(1) * term(1, 2), idf(2) * term(1, 1), 0.0])


def test_keyword_retrieval_picks_the_expected_skills():
    r = Retriever("keyword", top_k_general=2, top_k_task=1)
    picked = r.pick(library(), "conversion", "How many miles are 10 km?")
    # 'miles' and 'km': unit-conversion; 'many': count-from-facts; the type's best: length-table
    assert names(picked, "conversion") == (["unit-conversion", "count-from-facts"], ["length-table"])
    assert picked.common_mistakes == library().common_mistakes
    # 'pounds' only (no stemming: 'kilograms' is not 'kilogram'); the second slot goes to the first zero score
    picked = r.pick(library(), "conversion", "What is 20 kilograms in pounds?")
    assert names(picked, "conversion") == (["unit-conversion", "answer-format"], ["mass-table"])
    picked = r.pick(library(), "arithmetic", "Add 17 and 25, step by step.")
    assert names(picked, "arithmetic") == (["arithmetic-steps", "answer-format"], ["carry-digits"])


def test_ties_keep_library_order_and_the_defaults_are_masas():
    r = Retriever("keyword")
    assert (r.top_k_general, r.top_k_task) == (6, 5)
    picked = r.pick(library(), "conversion", "zzz")        # no word in common: every score 0
    assert names(picked, "conversion") == ([s.name for s in library().general[:6]],
                                           ["length-table", "mass-table", "temperature"])


@pytest.mark.parametrize("k_general, k_task, expected", [(0, 0, (0, 0)), (1, 2, (1, 2)), (100, 100, (8, 3))])
def test_top_k_bounds_and_mistakes_always_included(k_general, k_task, expected):
    picked = Retriever("keyword", k_general, k_task).pick(library(), "conversion", "km to miles")
    assert (len(picked.general), len(picked.task_specific["conversion"])) == expected
    text = RetrievedSkills(library(), Retriever("keyword", k_general, k_task)).render("conversion", 4096,
                                                                                       query="km to miles")
    assert "Answering with the unit missing." in text and "Rounding too early." in text


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="bm25"), r"mode must be one of"),
    (dict(mode="keyword", top_k_general=-1), r"--top-k-general: must be an integer >= 0, got -1"),
    (dict(mode="keyword", top_k_task=1.5), r"--top-k-task: must be an integer >= 0"),
    (dict(mode="embedding"), r"needs an embeddings endpoint \(--embed-url URL\)"),
])
def test_bad_settings_are_refused_clearly(kwargs, message):
    with pytest.raises(RetrievalError, match=message):
        Retriever(**kwargs)


def test_a_skill_set_is_required_and_none_changes_nothing():
    lib = library()
    assert with_retrieval(lib, None) is lib and with_retrieval(None, Retriever()) is None
    with pytest.raises(RetrievalError, match="retrieval needs a skill set"):
        with_retrieval("plain text skill", Retriever())
    assert isinstance(with_retrieval(lib.general[0], Retriever()), RetrievedSkills)


# ---------------------------------------------------------------------------------------------- embedding

VOCAB = ("km", "mile", "kilogram", "pound", "add", "count", "celsius")     # prefixes: a crude stemmer


def bag_of_words(text: str) -> list[float]:
    """A scripted embedding: counts of a few words, plus a small constant so no vector is zero."""
    words = tokens(text)
    return [float(sum(w.startswith(v) for w in words)) for v in VOCAB] + [0.0625]   # exact in float32


@pytest.fixture
def embed_server():
    requests = []

    def embed_fn(text):
        requests.append(text)
        return bag_of_words(text)

    with start_server(ScriptedBackend(lambda m, r: "42", name="emb", embed_fn=embed_fn)) as server:
        server.embedded_texts = requests
        yield server


def test_client_embed_returns_one_vector_per_text_in_order(embed_server):
    client = ChatClient(embed_server.url, model="emb")
    assert client.embed(["km km", "add"]) == [bag_of_words("km km"), bag_of_words("add")]
    assert client.embed([]) == []
    with pytest.raises(TypeError, match="list of strings"):
        client.embed("one string")


def test_embedding_retrieval_picks_the_expected_skills(embed_server):
    r = Retriever("embedding", top_k_general=2, top_k_task=1, client=ChatClient(embed_server.url, model="emb"))
    picked = r.pick(library(), "conversion", "How many pounds are 3 kilograms?")
    # unit-conversion and mass-table share 'kilogram' and 'pound' with the query; the other skills tie (only the
    # constant dimension in common) and keep library order
    assert names(picked, "conversion") == (["unit-conversion", "answer-format"], ["mass-table"])
    picked = r.pick(library(), "conversion", "10 km in miles")
    assert names(picked, "conversion") == (["unit-conversion", "answer-format"], ["length-table"])


def test_render_for_tasks_embeds_each_text_once_and_differs_per_task(embed_server):
    client = ChatClient(embed_server.url, model="emb")
    retrieved = RetrievedSkills(library(), Retriever("embedding", 1, 1, client))
    tasks = [Task(id="a", type="conversion", question="10 km in miles", answer="6.2"),
             Task(id="b", type="conversion", question="3 kilograms in pounds", answer="6.6"),
             Task(id="c", type="conversion", question="10 km in miles", answer="6.2")]
    prompts = rollout.skill_prompts(retrieved, tasks, 4096)
    assert "1 mile = 1.609 km." in prompts[0] and "1 kg = 2.205 pounds." in prompts[1] and prompts[0] == prompts[2]
    assert all("Rounding too early." in p for p in prompts)
    texts = embed_server.embedded_texts
    assert len(texts) == len(set(texts)) == 2 + len(library())       # 2 distinct tasks + every skill, once


class _BadEmbeddings(BaseHTTPRequestHandler):
    body = b'{"data": "not a list"}'

    def do_GET(self):
        self._send(b'{"data": [{"id": "bad"}]}')

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(self.body)

    def _send(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("body, message", [
    (b'{"data": "not a list"}', r"embeddings reply has no list of 2 numeric"),
    (b'{"data": [{"index": 0, "embedding": [1.0]}]}', r"embeddings reply has no list of 2"),
    (b'{"data": [{"index": 0, "embedding": [1, "x"]}, {"index": 1, "embedding": [1]}]}', r"numeric"),
    (b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [1]}]}', r"embeddings of 2 and 1 dim"),
    (b'{"data": [{"index": 0, "embedding": [0, 0]}, {"index": 1, "embedding": [1, 0]}]}', r"a zero embedding"),
])
def test_a_reply_that_does_not_parse_is_a_clear_error(body, message):
    handler = type("Handler", (_BadEmbeddings,), {"body": body})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/v1"
        r = Retriever("embedding", client=ChatClient(url, max_retries=0))
        with pytest.raises(RetrievalError, match=rf"--embed-url {url}: .*{message}"):
            r.embed(["one", "two"])
    finally:
        httpd.shutdown()


def test_client_embed_orders_vectors_by_index():
    body = b'{"data": [{"index": 1, "embedding": [0, 1]}, {"index": 0, "embedding": [1, 0]}], "model": "m"}'
    httpd = HTTPServer(("127.0.0.1", 0), type("Handler", (_BadEmbeddings,), {"body": body}))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        assert ChatClient(f"http://127.0.0.1:{httpd.server_port}", model="m").embed(["a", "b"]) == [[1.0, 0.0],
                                                                                                  [0.0, 1.0]]
    finally:
        httpd.shutdown()


def test_a_bad_embed_url_is_a_clear_error():
    args = lambda **kw: type("Args", (), {"retrieve": "embedding", "embed_model": None, "top_k_general": 6,  # noqa
                                          "top_k_task": 5, **kw})
    with pytest.raises(RetrievalError, match=r"--embed-url: base_url must look like http://host:port/v1"):
        retriever_from_args(args(embed_url="ftp://nowhere"))
    with pytest.raises(RetrievalError, match=r"--embed-url is only used with --retrieve embedding"):
        retriever_from_args(args(retrieve="none", embed_url="http://127.0.0.1:9/v1"))
    with pytest.raises(RetrievalError, match=r"needs an embeddings endpoint"):
        retriever_from_args(args(embed_url=None))
    closed = Retriever("embedding", client=ChatClient("http://127.0.0.1:9/v1", model="m", max_retries=0, timeout=5))
    with pytest.raises(RetrievalError, match=r"--embed-url http://127.0.0.1:9/v1: .*connection failed"):
        closed.embed(["text"])


# ---------------------------------------------------------------------------------------------- the command

@pytest.fixture
def suite_and_library(tmp_path):
    suite = tmp_path / "tasks.jsonl"
    suite.write_text("".join(json.dumps(t) + "\n" for t in [
        {"id": "q1", "type": "conversion", "question": "10 km in miles?", "answer": "6.2"},
        {"id": "q2", "type": "conversion", "question": "3 kilograms in pounds?", "answer": "6.6"}]))
    lib = library().save(tmp_path / "lib")
    return suite, lib


def run_cli(tmp_path, suite, lib, server, *extra):
    return rollout.main(["--suite", str(suite), "--split", "all", "--skills", str(lib), "--task-url", server.url,
                         "--task-model", "emb", "--out", str(tmp_path / "out"), *extra])


def system_prompts(tmp_path) -> dict:
    trajs = rollout.load_trajectories(tmp_path / "out" / "trajectories.jsonl")
    return {t.task_id: t.messages[0]["content"] for t in trajs}


def test_rollout_cli_keyword_retrieval_per_task(tmp_path, suite_and_library, embed_server):
    suite, lib = suite_and_library
    assert run_cli(tmp_path, suite, lib, embed_server, "--retrieve", "keyword", "--top-k-general", "1",
                   "--top-k-task", "1") == 0
    prompts = system_prompts(tmp_path)
    assert "1 mile = 1.609 km." in prompts["q1"] and "1 kg = 2.205 pounds." not in prompts["q1"]
    assert "1 kg = 2.205 pounds." in prompts["q2"] and "1.609" not in prompts["q2"]
    assert "Spell words" not in prompts["q1"] and all("Rounding too early." in p for p in prompts.values())


def test_rollout_cli_embedding_retrieval_from_the_task_endpoint_by_default(tmp_path, suite_and_library, embed_server):
    suite, lib = suite_and_library
    assert run_cli(tmp_path, suite, lib, embed_server, "--retrieve", "embedding", "--top-k-general", "1",
                   "--top-k-task", "1") == 0
    prompts = system_prompts(tmp_path)
    assert "1 mile = 1.609 km." in prompts["q1"] and "1 kg = 2.205 pounds." in prompts["q2"]


def test_rollout_cli_default_is_the_whole_library(tmp_path, suite_and_library, embed_server):
    suite, lib = suite_and_library
    assert run_cli(tmp_path, suite, lib, embed_server) == 0
    prompts = system_prompts(tmp_path)
    assert prompts["q1"] == prompts["q2"] and "Spell words" in prompts["q1"] and "1.609" in prompts["q1"]


def test_rollout_cli_errors_name_the_flag(tmp_path, suite_and_library, capsys):
    suite, lib = suite_and_library
    with start_server(ScriptedBackend(lambda m, r: "x", name="emb")) as no_embeddings:
        with pytest.raises(SystemExit) as exit_info:
            run_cli(tmp_path, suite, lib, no_embeddings, "--retrieve", "embedding")
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "the task model's endpoint" in err and "no --embed-url given" in err and "serves no embeddings" in err
        with pytest.raises(SystemExit):
            run_cli(tmp_path, suite, lib, no_embeddings, "--retrieve", "keyword", "--top-k-task", "-2")
        assert "--top-k-task: must be an integer >= 0, got -2" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the scripts

def recording_target(seen: list):
    def reply(messages, request):
        seen.append((messages[0]["content"] if messages[0]["role"] == "system" else "", messages[-1]["content"]))
        return "I am not sure."
    return reply


def test_rewrite_apply_compare_retrieves_per_task(tmp_path, suite_and_library):
    import rewrite
    suite, lib = suite_and_library
    seen = []
    with start_server(ScriptedBackend(recording_target(seen), name="t")) as server:
        args = rewrite.build_parser().parse_args([
            "apply", "--rewriter", "unused", "--model-card", "unused", "--skills", str(lib), "--task", "Units.",
            "--out", str(tmp_path / "rw"), "--compare", "--suite", str(suite), "--split", "all", "--task-url",
            server.url, "--teacher-retries", "0", "--retrieve", "keyword", "--top-k-general", "1", "--top-k-task", "1"])
        skills = SkillSet.load(lib)
        assert rewrite.compare(args, {"name": "t"}, skills, skills) == 0
    prompts = {question: system for system, question in seen if question.endswith("?")}
    assert "1 mile = 1.609 km." in prompts["10 km in miles?"] and "Spell words" not in prompts["10 km in miles?"]
    assert "1 kg = 2.205 pounds." in prompts["3 kilograms in pounds?"]


def test_evolve_masa_held_out_evaluation_retrieves(tmp_path):
    import evolve_masa
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"id": f"{s}-{i}", "type": "conversion", "question": q, "answer": "1",
                                         "split": s}) + "\n"
                             for s in ("train", "heldout") for i, q in enumerate(["10 km in miles?",
                                                                                   "3 kilograms in pounds?"])))
    library().save_json(tmp_path / "base.json")
    seen = []
    with start_server(ScriptedBackend(recording_target(seen), name="t")) as target, \
            start_server(ScriptedBackend(lambda m, r: "?", name="teacher", max_context=100000)) as teacher:
        code = evolve_masa.main(["--suite", str(suite), "--base-skills", str(tmp_path / "base.json"), "--n-train", "2",
                                 "--n-prelim", "0", "--n-heldout", "2", "--task-url", target.url, "--task-model",
                                 "t", "--teacher-url", teacher.url, "--teacher-model", "teacher", "--iterations", "1",
                                 "--tree-iterations", "0", "--episodes", "2", "--task-concurrency", "2", "--no-cache",
                                 "--out", str(tmp_path / "run"), "--retrieve", "keyword", "--top-k-general", "1",
                                 "--top-k-task", "1"])
    assert code == 0
    retrieved = [system for system, _ in seen if "Spell words" not in system]      # the held-out rollouts
    searched = [system for system, _ in seen if "Spell words" in system]           # the search: whole library
    assert retrieved and searched
    assert any("1 mile = 1.609 km." in s and "1 kg = 2.205" not in s for s in retrieved)
    assert any("1 kg = 2.205 pounds." in s for s in retrieved)
    assert "heldout" in json.loads((tmp_path / "run" / "results.json").read_text())
