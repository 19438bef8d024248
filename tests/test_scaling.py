"""Scaling out through the URL (docs/gpu.md): the frozen models are many replicas behind a
load balancer, and the client's concurrency (`max_workers`) is what fills them.

Everything runs on loopback with the stdlib: E slow endpoints, each answering OpenAI's
`/v1/chat/completions` after a fixed latency with at most B requests served at once (its batch: a semaphore;
the rest wait in its queue), and a round-robin balancer in front of them. The endpoints count the requests
they serve at the same moment. The work in flight there must be min(max_workers, E·B): the client's bound
below E·B, the replicas' capacity above it (the extra requests queue and are served later). Counts are
asserted, never seconds (a loaded machine stretches every time, never a count): the latency only makes the
overlaps certain. Every request must be answered exactly once (no retry sent it twice), with its own reply.
"""
import http.client
import itertools
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

import evolve_masa
import rewrite
import train_grpo
from minskill.masa.search import MasaConfig
from minskill.rollout import run_rollouts
from minskill.serve.caching import CallBudget
from minskill.serve.client import ChatClient
from minskill.skill_r1 import evaluate as skill_r1_eval
from minskill.skill_r1.loop import EvolveConfig, Instance, score_skills
from minskill.tasks.base import Task

ENDPOINTS, BATCH = 3, 2     # E replicas, each serving B requests at once
LATENCY = 0.2               # seconds per request: long enough that a wave of requests surely overlaps
MODEL = "slow-replica"


class _Server(ThreadingHTTPServer):
    daemon_threads = True      # a handler still sleeping must not hold the test process at exit
    request_queue_size = 128   # the listen backlog: socketserver's default 5 would drop a burst's SYNs


def _serve(handler) -> _Server:
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args):  # no access log on stderr
        pass

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))


class Farm:
    """E slow endpoints and the round-robin balancer in front of them; `url` is the balancer's /v1."""

    def __init__(self, endpoints=ENDPOINTS, batch=BATCH, latency=LATENCY):
        self.lock = threading.Lock()
        self.reset()
        self.endpoints = [_serve(self._endpoint_handler(i, threading.BoundedSemaphore(batch), latency))
                          for i in range(endpoints)]
        targets = itertools.cycle([server.server_address for server in self.endpoints])
        self.balancer = _serve(self._balancer_handler(targets))
        self.url = f"http://127.0.0.1:{self.balancer.server_address[1]}/v1"

    def reset(self) -> None:
        with self.lock:
            self.serving = self.peak_serving = 0        # requests being served (inside a batch), all endpoints
            self.arrived = self.peak_arrived = 0        # requests inside the balancer (sent by the client)
            self.served: Counter = Counter()            # user message -> times it was served

    def close(self) -> None:
        for server in (self.balancer, *self.endpoints):
            server.shutdown()
            server.server_close()

    def _endpoint_handler(self, index: int, batch: threading.BoundedSemaphore, latency: float):
        farm = self

        class Endpoint(_Quiet):
            def do_GET(self):
                self.reply(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())

            def do_POST(self):
                request = json.loads(self.body())
                question = request["messages"][-1]["content"]
                with batch:                      # at most B at once; the others wait here, in the queue
                    with farm.lock:
                        farm.serving += 1
                        farm.peak_serving = max(farm.peak_serving, farm.serving)
                    time.sleep(latency)          # the replica "decoding" its batch
                    with farm.lock:
                        farm.serving -= 1
                        farm.served[question] += 1
                answer = f"The answer is {re.findall(r'[0-9]+', question)[-1]} (replica {index})."
                choices = [{"index": j, "message": {"role": "assistant", "content": answer},
                            "finish_reason": "stop"} for j in range(request.get("n", 1))]
                self.reply(200, json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                                            "choices": choices,
                                            "usage": {"prompt_tokens": 5, "completion_tokens": 7}}).encode())
        return Endpoint

    def _balancer_handler(self, targets):
        farm, pick = self, threading.Lock()

        class Balancer(_Quiet):
            def forward(self, method: str) -> None:
                with farm.lock:
                    farm.arrived += 1
                    farm.peak_arrived = max(farm.peak_arrived, farm.arrived)
                try:
                    with pick:                   # round robin: each request to the next replica
                        host, port = next(targets)
                    connection = http.client.HTTPConnection(host, port, timeout=60)
                    connection.request(method, self.path, self.body() if method == "POST" else None,
                                       {"Content-Type": "application/json"})
                    response = connection.getresponse()
                    status, body = response.status, response.read()
                    connection.close()
                finally:
                    with farm.lock:
                        farm.arrived -= 1
                self.reply(status, body)

            def do_GET(self):
                self.forward("GET")

            def do_POST(self):
                self.forward("POST")
        return Balancer


@pytest.fixture(scope="module")
def farm():
    farm = Farm()
    yield farm
    farm.close()


def echo_tasks(n: int, prefix: str = "") -> list[Task]:
    """Single-turn tasks whose right answer is the number in the question: the endpoints' echo gets it."""
    return [Task(id=f"{prefix}echo-{i}", type="echo", question=f"{prefix}Repeat the number {i}.", answer=str(i))
            for i in range(n)]


def client_for(farm: Farm, max_workers: int) -> ChatClient:
    # max_retries=0: a retry would send a request twice, and "exactly once" would no longer be checked
    return ChatClient(farm.url, model=MODEL, api_key="k", max_workers=max_workers, max_retries=0, timeout=60)


def capacity(max_workers: int) -> int:
    return min(max_workers, ENDPOINTS * BATCH)


# --------------------------------------------------------------------------- the client's concurrency

@pytest.mark.parametrize("max_workers", [1, 2, 4, 6, 12])
def test_work_in_flight_at_the_replicas_is_min_of_max_workers_and_their_capacity(farm, max_workers):
    """run_rollouts (what all three scripts use to reach the task model) through the balancer."""
    farm.reset()
    tasks = echo_tasks(max(4, 2 * max_workers))   # at least two full waves: the pool is refilled as replies come
    client = client_for(farm, max_workers)
    trajectories = run_rollouts(client, tasks)
    assert farm.peak_serving == capacity(max_workers)
    assert farm.peak_arrived == max_workers       # the client keeps max_workers in flight, queued ones included
    assert farm.served == Counter(t.question for t in tasks)          # each request served exactly once
    assert [t.task_id for t in trajectories] == [t.id for t in tasks]
    assert all(t.success and t.error is None for t in trajectories)   # each got its own answer
    assert client.stats["calls"] == len(tasks) and client.stats["retries"] == client.stats["failures"] == 0


@pytest.mark.parametrize("max_workers", [4, 12])
def test_chat_many_fills_the_replicas_the_same_way(farm, max_workers):
    farm.reset()
    requests = [dict(messages=[{"role": "user", "content": f"Repeat the number {i}."}]) for i in range(2 * max_workers)]
    results = client_for(farm, max_workers).chat_many(requests)
    assert farm.peak_serving == capacity(max_workers) and farm.peak_arrived == max_workers
    assert farm.served == Counter(r["messages"][0]["content"] for r in requests)
    assert [re.findall(r"[0-9]+", r.text)[0] for r in results] == [str(i) for i in range(len(requests))]


# ------------------------------------------------------------------ the scripts pass their flags through

class _Stop(Exception):
    """Raised by the captured embedded_client: the script got as far as connecting, which is all we check."""


@pytest.fixture
def captured(monkeypatch):
    """The keyword arguments each script passes to embedded_client (the script stops right there)."""
    calls = []

    def fake_embedded_client(*args, **kwargs):
        calls.append(kwargs)
        raise _Stop

    for module in (train_grpo, skill_r1_eval, rewrite):
        monkeypatch.setattr(module, "embedded_client", fake_embedded_client)
    return calls


def test_train_grpo_task_concurrency_reaches_the_client(captured, monkeypatch):
    assert train_grpo.parse_args([]).task_concurrency == 16   # the embedded server's batch
    with pytest.raises(SystemExit):
        train_grpo.parse_args(["--task-concurrency", "0"])
    assert "task_concurrency" not in train_grpo.RESUME_MUST_MATCH  # it changes no result: may change on --resume
    monkeypatch.setattr(train_grpo, "setup", lambda args: SimpleNamespace())
    with pytest.raises(_Stop):
        train_grpo.train(train_grpo.parse_args(["--task-concurrency", "256"]))
    monkeypatch.setattr(skill_r1_eval, "heldout_instances", lambda args: ([], []))
    with pytest.raises(_Stop):                                 # --eval reaches the task model too
        skill_r1_eval.evaluate(train_grpo.parse_args(["--eval", "--task-concurrency", "64"]))
    assert [call["max_workers"] for call in captured] == [256, 64]


def test_rewrite_compare_task_concurrency_reaches_the_client(captured, monkeypatch, tmp_path):
    monkeypatch.setattr(rewrite, "load_suite", lambda *args, **kwargs: [])
    flags = ["apply", "--rewriter", "r", "--model-card", "c", "--skills", "s", "--task", "t",
             "--out", str(tmp_path / "out"), "--compare", "--suite", "qa"]
    assert rewrite.build_parser().parse_args(flags).task_concurrency == 8
    with pytest.raises(_Stop):
        rewrite.compare(rewrite.build_parser().parse_args(flags + ["--task-concurrency", "32"]), {}, None, None)
    assert captured[0]["max_workers"] == 32


# ------------------------------------------------- the bound as the scripts' own rollout code sees it

def test_evolve_masa_concurrency_bounds_the_target_rollouts(farm, tmp_path):
    """CachingClient passes its inner client's max_workers on, so --concurrency bounds the target's rollouts."""
    args = evolve_masa.build_parser().parse_args(["--task-url", farm.url, "--task-model", MODEL,
                                                  "--teacher-url", farm.url, "--teacher-model", MODEL,
                                                  "--task-concurrency", "4"])
    run = SimpleNamespace(args=args, cache_path=None, budget=CallBudget(), config=MasaConfig(), tasks=[],
                          heldout=[], out=tmp_path)
    farm.reset()
    with evolve_masa.connect(run) as (target, _teacher):
        trajectories = run_rollouts(target, echo_tasks(12))
    assert all(t.success for t in trajectories) and farm.served.total() == 12
    assert farm.peak_serving == capacity(4)


def test_train_grpo_scoring_is_bounded_by_the_clients_max_workers(farm):
    """score_skills runs up to 16 jobs at once, each with its own run_rollouts pool: the client's max_workers
    still bounds the requests in flight, client-wide."""
    farm.reset()
    jobs = [(Instance(f"x{j}", "echo", echo_tasks(4, prefix=f"x{j} ")), "a skill", j) for j in range(6)]
    scored = score_skills(client_for(farm, 2), jobs, EvolveConfig())
    assert [reward for reward, _ in scored] == [1.0] * 6 and farm.served.total() == 24
    assert farm.peak_serving == capacity(2)
