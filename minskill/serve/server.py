"""OpenAI-compatible HTTP server for a minskill model, and the embedded default endpoint.

    python -m minskill.serve --model SPEC [--host 127.0.0.1] [--port 8000] [--api-key KEY]
                              [--max-batch 16] [--dtype float32|bfloat16]
                              [--quantize int4|int8|none|auto] [--threads N]
                              [--log-requests] [--prefix-cache-mb 256] [--scheduler
                              continuous|static] [--c-kernels on|off] [--request-timeout 30]
                              [--max-connections 256]

Decisions (in full: docs/http-api.md, "The server's decisions"):
  1. OpenAI's endpoints and reply shapes (chat, legacy completions, embeddings, models, health);
     a field that would change what is sampled and is not implemented is a 400 naming it.
  2. Bad input is a 4xx with OpenAI's error body, never a 500; stalled clients time out.
  3. One scheduler thread (the main one) runs the engine: continuous batching, a prefix cache,
     batch-invariant replies (serve.scheduler, serve.aligned); handler threads only do HTTP.
  4. A client that leaves cancels its request; limits follow the model's context.
  5. Backends: ModelBackend (a minskill model) or ScriptedBackend (a scripted model, for tests).
"""

import argparse
import collections
import hmac
import io
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import unquote, urlsplit

import torch

from minskill.device import add_device_args, is_cuda, set_up_device
from minskill.serve.c_decode import CDecoder
from minskill.nn.quantize import QUANTIZE_CHOICES, serving_default, weight_format
from minskill.serve.backends import (SCHEDULERS, Backend, Choice, ClientGone, CompletionRequest,
                                     ModelBackend)
from minskill.serve.bodies import chat_reply, completion_reply
from minskill.serve.client import ChatClient
from minskill.serve.embedded import (API_KEY_ENV, DEFAULT_PREFIX_CACHE_MB,
                                     DEFAULT_SCHEDULER, PARENT_PID_ENV)
from minskill.serve.embeddings import EmbeddingRequest, embeddings_reply, parse_embeddings_request
from minskill.serve.errors import BackendError, bad_request
from minskill.serve.http_body import decode_json, read_body
from minskill.serve.request_parsing import parse_chat_request, parse_completion_request
from minskill.serve.scheduler import run_continuous
from minskill.serve.sse import stream_chat

DEFAULT_MAX_BODY_BYTES = 8 << 20  # 8 MiB of JSON is far more than any prompt a model here can read
DEFAULT_REQUEST_TIMEOUT = 30.0    # seconds for a request's line, headers and body; keep-alive idle
DEFAULT_MAX_CONNECTIONS = 256     # open connections at once; each holds a handler thread


# ---- batching scheduler --------------------------------------------------------------------------
class _Job:
    def __init__(self, request: CompletionRequest | EmbeddingRequest, events=None):
        self.request, self.done = request, threading.Event()
        self.result: list[Choice] | None = None       # (for an EmbeddingRequest: the vectors)
        self.error: BaseException | None = None
        self.events = events   # a streaming request's queue of deltas; None once the job is done


class BatchScheduler:
    """Queue of pending requests; one thread serves them in batches of up to max_batch samples.

    A request whose client has gone (submit's client_gone() turns true, checked every `poll`
    seconds) is cancelled: dropped from the queue if it has not started, else its `cancelled` event
    tells the backend to stop generating for it. A client that times out and retries would
    otherwise double the work. """

    def __init__(self, backend: Backend, max_batch: int = 16, log_requests: bool = False,
                 batch_window: float = 0.02, thread: bool = True):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend, self.max_batch, self.log_requests = backend, max_batch, log_requests
        self.batch_window = batch_window  # seconds a batch's first request waits for companions
        self.pending: collections.deque[_Job] = collections.deque()
        self.condition = threading.Condition()
        self.stopping, self.batches_served, self.cancelled_requests = False, 0, 0
        # thread False: the caller serves on its own thread, calling run() (main() does:
        # docs/http-api.md)
        self.thread = threading.Thread(target=self.run, name="minskill-scheduler", daemon=True) \
            if thread else None
        if self.thread:
            self.thread.start()

    def submit(self, request: CompletionRequest | EmbeddingRequest,
               client_gone: Callable[[], bool] | None = None, poll: float = 0.5, wait: bool = True):
        """Queue a request and block until its batch is done; raise ClientGone once client_gone()
        is true. wait=False: only queue it, and return the job for wait()."""
        job = self.enqueue(request)
        return self.wait(job, client_gone, poll) if wait else job

    def wait(self, job: _Job, client_gone: Callable[[], bool] | None = None, poll: float = 0.5,
             others=()):
        """The job's result once its batch is done (its error raised); ClientGone, every job of
        `others` cancelled with it, once client_gone() is true."""
        while not job.done.wait(None if client_gone is None else poll):
            if client_gone():
                for other in {job, *others}:
                    self.cancel(other)
                raise ClientGone()
        if job.error is not None:
            raise job.error
        return job.result

    def enqueue(self, request, events=None) -> _Job:
        with self.condition:
            if self.stopping:
                raise BackendError(503, "the server is shutting down", code="shutting_down")
            job = _Job(request, events)
            self.pending.append(job)
            self.condition.notify()
        return job

    def cancel(self, job: _Job) -> None:
        """The job's client has gone: drop it from the queue, or tell the backend to stop working
        on it."""
        if job.done.is_set():
            return
        job.request.cancelled.set()
        with self.condition:
            if job in self.pending:
                self.pending.remove(job)
            self.cancelled_requests += 1
        if self.log_requests:
            print("[minskill.serve] client gone: request cancelled", file=sys.stderr, flush=True)

    def _next_batch(self) -> list[_Job] | None:
        with self.condition:
            while not self.pending and not self.stopping:
                self.condition.wait()
            if self.stopping:
                return None
            batch = [self.pending.popleft()]   # (cancelled jobs leave the queue themselves, under
                                               # this lock)
            if isinstance(batch[0].request, EmbeddingRequest):
                return batch                   # an embedding request runs alone
            samples = batch[0].request.n
            # Wait a short window for companions: concurrent clients rarely arrive in the same
            # millisecond,
            # and a request that just misses a batch waits for the whole of it (static batching).
            deadline = time.monotonic() + self.batch_window
            while samples < self.max_batch and not self.stopping:
                if self.pending:
                    following = self.pending[0].request
                    if isinstance(following,
                                  EmbeddingRequest) or samples + following.n > self.max_batch:
                        break
                    batch.append(self.pending.popleft())
                    samples += batch[-1].request.n
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.condition.wait(remaining)
            return batch

    def _embed(self, job: _Job):
        try:
            job.result = self.backend.embed(job.request)
        except Exception as error:
            if not isinstance(error, BackendError) and not job.request.cancelled.is_set():
                traceback.print_exc(file=sys.stderr)
            job.error = error
        job.done.set()

    def finish(self, job: _Job, result):
        """Give the job its result (an exception fails it) and wake its handler."""
        if isinstance(result, BaseException):
            job.error = result
        elif not isinstance(result, list) or len(result) != job.request.n:
            job.error = RuntimeError(f"backend returned {result!r:.100} for a request with "
                                     f"n={job.request.n}")
        else:
            job.result = result
        job.done.set()
        if job.events is not None:
            job.events.put(None)

    def run(self):
        """Serve until stop(): on the scheduler's own thread, or on the caller's (thread=False)."""
        if getattr(self.backend, "scheduler", "static") == "continuous":
            return run_continuous(self)   # requests join and leave at each step (serve.scheduler)
        while (batch := self._next_batch()) is not None:
            if isinstance(batch[0].request, EmbeddingRequest):
                self._embed(batch[0])
                continue
            started = time.perf_counter()
            requests = [job.request for job in batch]
            try:
                results = self.backend.complete(requests)
                if len(results) != len(batch):
                    raise RuntimeError(f"backend returned {len(results)} results for {len(batch)} "
                                       f"requests")
            except Exception as error:
                traceback.print_exc(file=sys.stderr)
                results = [error] * len(batch)
            tokens = 0
            for job, result in zip(batch, results):
                self.finish(job, result)
                tokens += sum(choice.completion_tokens for choice in job.result or ())
            self.batches_served += 1
            if self.log_requests:
                print(f"[minskill.serve] batch of {len(batch)} requests, "
                      f"{sum(r.n for r in requests)} samples, {tokens} completion tokens, "
                      f"{time.perf_counter() - started:.2f} s", file=sys.stderr, flush=True)

    def stop(self, timeout: float = 30.0):
        """Refuse new work, fail what is still queued with 503, let the running batch finish."""
        with self.condition:
            self.stopping = True
            abandoned = list(self.pending)
            self.pending.clear()
            self.condition.notify_all()
        for job in abandoned:
            self.finish(job, BackendError(503, "the server is shutting down", code="shutting_down"))
        if self.thread and self.thread is not threading.current_thread():
            self.thread.join(timeout)


# ---- HTTP layer ----------------------------------------------------------------------------------
ROUTES = {"/health": ("GET",), "/v1/models": ("GET",), "/v1/chat/completions": ("POST",),
          "/v1/completions": ("POST",), "/v1/embeddings": ("POST",)}
MODEL_PATH = "/v1/models/"   # GET /v1/models/{id}: the id may hold slashes ("Qwen/Qwen3-0.6B"),
                             # %-escaped or not


class _DeadlineReader(io.RawIOBase):
    """The connection's socket as the handler's input file, with one deadline (time.monotonic())
    for all reads together: a socket timeout bounds each read alone, so a client sending a byte
    every few seconds could otherwise hold its thread forever. No deadline: reads wait as long as
    the socket's timeout."""

    def __init__(self, sock: socket.socket):
        self.sock, self.deadline = sock, None

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    protocol_version, server_version = "HTTP/1.1", "minskill"  # HTTP/1.1: keep-alive connections

    def log_message(self, format, *args):  # quiet: the scheduler logs one line per batch on request
        pass

    def setup(self):
        super().setup()
        self.rfile.close()  # replaced by a file whose reads share the request's deadline
        self.reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self.reader)

    def handle_one_request(self):
        # the request line, headers and body must arrive within request_timeout of starting to wait
        # for them
        # (http.server closes the connection on the TimeoutError; _read_json answers 408 first)
        self.reader.deadline = time.monotonic() + self.server.state.request_timeout
        super().handle_one_request()

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (a malformed request line or header, an unknown method) in
        OpenAI's shape."""
        self.request_version = self.protocol_version  # a status line even for an HTTP/0.9 request
        self._send_error(BackendError(code, message or self.responses.get(code, ("error",))[0],
                                      "invalid_request_error"))

    def do_GET(self):   # every method is routed alike: _handle answers 405 where a path refuses it
        self._handle(self.command)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def _send_json(self, status: int, body: dict, headers: dict | None = None):
        data = json.dumps(body).encode()
        # reading is over: no deadline; a client that stops reading its reply fails each write
        # after request_timeout s
        self.reader.deadline = None
        self.connection.settimeout(self.server.state.request_timeout)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if status >= 400:  # the body may be unread: the next request needs a fresh connection
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client went away; nothing to answer
            self.close_connection = True

    def _send_error(self, error: BackendError):
        headers = dict(error.headers)
        if error.retry_after is not None:
            headers["Retry-After"] = str(max(0, round(error.retry_after)))
        if error.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        self._send_json(error.status, {"error": {"message": error.message, "type": error.type,
                                                 "param": error.param, "code": error.code}},
                                                 headers)

    def _handle(self, method: str):
        state: ServerState = self.server.state
        try:
            try:
                path = urlsplit(self.path).path.rstrip("/") or "/"
            except ValueError as error:  # e.g. "http://[::1/v1/models"
                raise bad_request(f"cannot parse the request target {self.path!r:.200}: "
                                  f"{error}") from None
            allowed = ROUTES.get(path) or (("GET",) if path.startswith(MODEL_PATH) else None)
            if allowed is None:
                routes = ", ".join(f"{m} {p}" for p, ms in ROUTES.items() for m in ms)
                raise BackendError(404, f"no such endpoint: {method} {path}; this server has "
                                        f"{routes}", "invalid_request_error", "not_found")
            if method not in allowed:
                raise BackendError(405, f"{path} accepts {', '.join(allowed)}, not {method}",
                                   "invalid_request_error", "method_not_allowed",
                                   headers={"Allow": ", ".join(allowed)})
            if path != "/health" and state.api_key is not None and not self._authorized(
                    state.api_key):
                raise BackendError(401, "missing or incorrect API key: send 'Authorization: Bearer "
                                        "<key>'",
                                   "invalid_request_error", "invalid_api_key")
            if path == "/health":
                return self._send_json(200, {"status": "ok", "model": state.backend.name})
            if path == "/v1/models":
                return self._send_json(200, {"object": "list", "data": [{
                    "id": state.backend.name, "object": "model", "created": state.created,
                    "owned_by": "minskill", "max_model_len": state.backend.max_context}]})
            if path.startswith(MODEL_PATH):
                return self._model(state, unquote(path[len(MODEL_PATH):]))
            if path == "/v1/completions":
                return self._completions(state)
            if path == "/v1/embeddings":
                request = parse_embeddings_request(self._read_json(state), state.backend)
                vectors = state.scheduler.submit(request, client_gone=self._client_gone)
                return self._send_json(200, embeddings_reply(request, vectors, state.backend.name))
            self._chat_completions(state)
        except BackendError as error:
            self._send_error(error)
        except ClientGone:
            self.close_connection = True
        except Exception as error:  # a bug: answer 500 and keep serving
            traceback.print_exc(file=sys.stderr)
            self._send_error(BackendError(500, f"internal error: {type(error).__name__}: {error}"))

    def _authorized(self, api_key: str) -> bool:
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                  api_key.encode())

    def _read_json(self, state: "ServerState"):
        """The request's JSON payload: its body by Content-Length or chunked
        (minskill.serve.http_body)."""
        return decode_json(read_body(self.rfile, self.headers, state.max_body_bytes,
                                     state.request_timeout))

    def _client_gone(self) -> bool:
        """True once the client has closed the connection: it is readable and a peek reads
        end-of-file."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):   # reset or already closed
            return True

    def _chat_completions(self, state: "ServerState"):
        request = parse_chat_request(self._read_json(state), state.backend)
        if request.stream:
            return stream_chat(self, state.scheduler, [request], state.backend.name)
        choices = state.scheduler.submit(request, client_gone=self._client_gone)
        self._send_json(200, chat_reply(request, choices, state.backend.name))

    def _completions(self, state: "ServerState"):
        """Legacy /v1/completions: its prompts queued together, so they share a batch as chat
        requests do."""
        requests = parse_completion_request(self._read_json(state), state.backend)
        if requests[0].stream:
            return stream_chat(self, state.scheduler, requests, state.backend.name, legacy=True)
        jobs = [
            state.scheduler.submit(r, client_gone=self._client_gone, wait=False) for r in requests
        ]
        try:
            results = [
                state.scheduler.wait(job, client_gone=self._client_gone, others=jobs)
                for job in jobs
            ]
        except BackendError:     # a prompt failed: its error is the reply, the others need not run
            for job in jobs:
                state.scheduler.cancel(job)
            raise
        self._send_json(200, completion_reply(requests, results, state.backend.name))

    def _model(self, state: "ServerState", model_id: str):
        """GET /v1/models/{id}: the served model, or 404 naming the unknown id."""
        if model_id != state.backend.name:
            raise BackendError(404, f"the model {model_id!r} does not exist: this server serves "
                                    f"{state.backend.name!r}", "invalid_request_error",
                                    "model_not_found", "model")
        self._send_json(200, {"id": state.backend.name, "object": "model", "created": state.created,
                              "owned_by": "minskill", "max_model_len": state.backend.max_context})


@dataclass
class ServerState:
    backend: Backend
    scheduler: BatchScheduler
    api_key: str | None
    max_body_bytes: int
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    created: int = field(default_factory=lambda: int(time.time()))


class _HTTPServer(ThreadingHTTPServer):
    request_queue_size = 128  # the default backlog of 5 drops connections when many clients start
    daemon_threads = True

    def __init__(self, address, handler, max_connections: int):
        super().__init__(address, handler)
        self.max_connections, self.open_connections = max_connections, 0
        self._count_lock = threading.Lock()

    def verify_request(self, request, client_address) -> bool:
        """False (http.server then closes the connection) when max_connections are open already."""
        with self._count_lock:
            if self.open_connections >= self.max_connections:
                return False
            self.open_connections += 1
            return True

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.open_connections -= 1

    def handle_error(self, request, client_address):
        # clients hanging up is normal
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class RunningServer:
    """A server running on background threads. `url` is the API root
    ("http://127.0.0.1:PORT/v1")."""

    def __init__(self, httpd: _HTTPServer, state: ServerState):
        self.httpd, self.state = httpd, state
        self.backend, self.api_key = state.backend, state.api_key
        self.host, self.port = httpd.server_address[:2]
        shown = ("127.0.0.1" if self.host in ("0.0.0.0", "")
                 else f"[{self.host}]" if ":" in self.host else self.host)
        self.url = f"http://{shown}:{self.port}/v1"
        self.thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="minskill-http", daemon=True)
        self.thread.start()
        self._closed = False

    def client(self, **client_kwargs) -> ChatClient:
        """A ChatClient for this server (its model name and key filled in)."""
        return ChatClient(self.url, model=self.backend.name, api_key=self.api_key, **client_kwargs)

    def close(self):
        if self._closed:
            return
        self._closed = True
        self.state.scheduler.stop()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def start_server(backend: Backend, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, max_batch: int = 16, log_requests: bool = False,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 scheduler_thread: bool = True) -> RunningServer:
    """Serve `backend` on background threads; port 0 picks a free port (see .url). Use as a context
    manager. scheduler_thread False: the caller runs the model, calling
    server.state.scheduler.run()."""
    if not request_timeout > 0 or max_connections < 1:
        raise ValueError(f"start_server: need request_timeout > 0 and max_connections >= 1, got "
                         f"request_timeout={request_timeout}, max_connections={max_connections}")
    httpd = _HTTPServer((host, port), _Handler, max_connections)
    scheduler = BatchScheduler(backend, max_batch, log_requests, thread=scheduler_thread)
    httpd.state = ServerState(backend, scheduler, api_key or None, max_body_bytes, request_timeout)
    return RunningServer(httpd, httpd.state)


# ---- command line --------------------------------------------------------------------------------
def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    timeout, cache = args.request_timeout, args.prefix_cache_mb   # "inf", "1e400": floats too
    for flag, value, ok, need in (
            ("--max-batch", args.max_batch, args.max_batch >= 1, "positive"),
            ("--threads", args.threads, args.threads is None or args.threads >= 1, "positive"),
            ("--request-timeout", timeout, math.isfinite(timeout) and timeout > 0, "finite, > 0"),
            ("--max-connections", args.max_connections, args.max_connections >= 1, "positive"),
            ("--prefix-cache-mb", cache, math.isfinite(cache) and cache >= 0, "finite, >= 0"),
            ("--port", args.port, 0 <= args.port <= 65535, "from 0 to 65535 (0: a free port)")):
        if not ok:
            parser.error(f"{flag} must be {need}, got {value}")

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    set_up_device(args.device)
    auto = torch.bfloat16 if is_cuda(args.device) else torch.float32
    dtype = auto if args.dtype == "auto" else getattr(torch, args.dtype)
    try:
        backend = ModelBackend.from_spec(
            args.model, dtype=dtype, device=args.device, name=args.served_model_name,
            quantize=args.quantize or serving_default(args.device), prefix_cache_mb=cache,
            scheduler=args.scheduler, batch_invariant=args.batch_invariant == "on",
            c_kernels=args.c_kernels == "on")
    except (ValueError, OSError) as error:
        print(f"minskill.serve: cannot load model {args.model!r}: {error}", file=sys.stderr)
        return 2
    quantized = weight_format(backend.model)
    weights = f"{quantized} weights, bfloat16 activations" if quantized else \
        f"{str(dtype).removeprefix('torch.')} weights"
    print(f"minskill.serve: {threads} torch thread{'s' if threads != 1 else ''}, device "
          f"{args.device}, {weights}, {decoding_step(backend, args.c_kernels)}", file=sys.stderr,
          flush=True)
    try:
        server = start_server(backend, args.host, args.port,
                              args.api_key or os.environ.get(API_KEY_ENV), args.max_batch,
                              args.log_requests, request_timeout=timeout,
                              max_connections=args.max_connections, scheduler_thread=False)
    except OSError as error:   # the port is in use, the host is not an address of this machine, ...
        print(f"minskill.serve: cannot listen on --host {args.host} --port {args.port}: "
              f"{error.strerror or error} (another --port, or 0 for a free one)", file=sys.stderr)
        return 2
    scheduler = server.state.scheduler
    for signum in (signal.SIGINT, signal.SIGTERM):   # (stop() takes the queue's lock: not in a
        # handler)
        signal.signal(
            signum, lambda *_: threading.Thread(target=scheduler.stop, daemon=True).start()
        )
    threading.Thread(target=_stop_when_orphaned, args=(scheduler,), daemon=True).start()
    print(f"minskill.serve: serving {backend.name} at {server.url}", flush=True)
    # the model runs on this, the main thread: OpenMP keeps one team of threads warm here, where the
    # engine on a second thread was measured 1.2-1.6x slower (docs/benchmarks.md)
    scheduler.run()
    server.close()
    print("minskill.serve: stopped", file=sys.stderr, flush=True)
    return 0


def decoding_step(backend, c_kernels: str) -> str:
    """The start-up line's words for the engine's decoding step, and why the C one is not used
    where it was asked for."""
    step = getattr(getattr(backend, "engine", None), "lean", None)
    if isinstance(step, CDecoder):
        return "decoding step in C (--c-kernels off: torch ops)"
    if step is None:   # float weights, or --batch-invariant off: nothing for C to take over
        return "the model's own decoding step"
    why = f" (C kernels: {CDecoder.why_not})" if c_kernels == "on" and CDecoder.why_not else ""
    return "decoding step in torch ops" + why


def _stop_when_orphaned(scheduler: BatchScheduler):
    """An embedded server must not outlive the run that started it, even one killed without
    cleanup: stop once the process named by PARENT_PID_ENV is gone."""
    parent = int(os.environ.get(PARENT_PID_ENV, "0"))
    while parent and os.getppid() == parent:
        time.sleep(0.5)
    if parent:
        print("minskill.serve: the process that started it is gone; stopping", file=sys.stderr,
              flush=True)
        scheduler.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minskill.serve",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m",
                        help="model spec: an HF folder or smollm2-135m")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback "
                                                            "only)")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--api-key", default=None, help=f"require this bearer key (or set "
                                                        f"{API_KEY_ENV})")
    parser.add_argument("--max-batch", type=int, default=16,
                        help="most samples served in one batch")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="the weights' dtype: auto (default) = bfloat16 on CUDA, float32 on "
                             "the CPU")
    parser.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                        help="the weights (minskill.nn.quantize): int4 (groups of 32, an int8 "
                             "output head; bf16 activations), int8 (a scale per output channel), "
                             "none (the --dtype weights: float32 on a CPU), auto (int8 on a CPU, "
                             "else none); default: int4 on a CPU, else none")
    add_device_args(parser, bf16=False, what="the served model runs")
    parser.add_argument("--prefix-cache-mb", type=float, default=DEFAULT_PREFIX_CACHE_MB,
                        help=f"MB of shared prompt prefixes' keys/values kept (default "
                             f"{DEFAULT_PREFIX_CACHE_MB:g}; "
                             "0: off, every prompt prefilled whole; minskill.serve.prefix_cache, "
                             "cascade)")
    parser.add_argument("--scheduler", choices=SCHEDULERS, default=DEFAULT_SCHEDULER,
                        help="continuous (default): requests join and leave the running batch at "
                             "each decoding step; static: a batch runs until its longest reply "
                             "ends")
    parser.add_argument("--batch-invariant", choices=("on", "off"), default="on",
                        help="on (default): a request's tokens do not depend on which requests "
                             "share its batch or when they came (bit for bit with bfloat16 or int8 "
                             "weights; float32 to ~1e-5 in the logits: minskill.serve.aligned); "
                             "off: shared prefixes kept once (cascade), faster with a long shared "
                             "system prompt (docs/benchmarks.md)")
    parser.add_argument("--c-kernels", choices=("on", "off"), default="on",
                        help="on (default): with quantized weights, the decoding step's norms, "
                             "RoPE, key writes, attention and SiLU run as C functions, built once "
                             "with the machine's C compiler (minskill.serve.c_decode: "
                             "batch-invariant, other bits than off); off: torch ops only, as the "
                             "scripts' own servers run")
    parser.add_argument("--served-model-name", default=None, help="model id reported to clients")
    parser.add_argument("--log-requests", action="store_true",
                        help="log one line per batch on stderr")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; "
                        "1 is much faster on a CPU that other busy processes share)")
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                        help="seconds for a request's line, headers and body to arrive; a stalled "
                             "client's "
                             f"connection is closed after that (default "
                             f"{DEFAULT_REQUEST_TIMEOUT:g})")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help=f"most connections open at once (default {DEFAULT_MAX_CONNECTIONS})")
    return parser


if __name__ == "__main__":
    sys.exit(main())
