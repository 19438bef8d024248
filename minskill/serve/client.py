"""Client for OpenAI-compatible chat endpoints: `POST {base_url}/chat/completions`.

This is how minskill reaches its frozen models (the task model, MASA's teacher): vLLM, SGLang,
llama.cpp's server, Ollama, a hosted API, or minskill's own server (`python -m minskill.serve`).
It imports nothing from the rest of minskill, so it can be copied alone into another project.
Its contract in full: docs/http-api.md, "The client's contract". In short:

* `ChatClient(base_url, model, api_key, extra_body=None)` (else OPENAI_BASE_URL, OPENAI_MODEL,
  OPENAI_API_KEY); `chat(messages, n, ...) -> ChatResult`; `chat_many` and `chat_as_completed`
  run many calls on a bounded pool; `embed(texts)` calls `POST {base_url}/embeddings`.
* A reply's reasoning is set apart from its texts (`split_reasoning`), and every string of a reply
  is made Unicode text (lone surrogates and bytes that are not UTF-8 become U+FFFD).
* `max_workers` bounds the requests in flight client-wide. `timeout` bounds a whole call begun at
  t0 by T = t0 + timeout; an attempt begun at t may take (a watchdog closes it after that)

      limit = min(attempt_timeout, T - t)        (attempt_timeout None: T - t)

* Connection errors, timed-out attempts, 429 and 5xx are retried up to `max_retries` times;
  attempt a that fails waits (full jitter, never less than the server's Retry-After, at most 60 s)

      delay_a = max(retry_after, U(0, min(backoff_max, backoff_base * 2**a)))

* Every other failure raises `ChatError` (`status`: the HTTP status, None without a reply).
* `usage` (a `Usage` snapshot): calls, failures, tokens, and the seconds of the chat calls,

      request_seconds = Σ_calls (end − start)     busy_seconds = |∪_calls [start, end]|
"""

import json
import math
import os
import random
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter

BODY_QUOTE_CHARS = 200  # how much of an unexpected reply body an error message quotes
MAX_REPLY_BYTES = 64 << 20  # most bytes of a reply body read (16 replies of 32,768 tokens: ~2 MB)
MAX_RETRY_AFTER = 60.0  # seconds: a longer Retry-After (a server asking for a day) is cut to this
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # (the only str characters UTF-8 cannot encode)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_FIELDS = ("reasoning_content", "reasoning")   # vLLM/SGLang --reasoning-parser; OpenRouter
_THINK_BLOCK = re.compile(f"{THINK_OPEN}(.*?){THINK_CLOSE}", re.DOTALL)
_current = threading.local()  # .watchdog: the _Watchdog of this thread's attempt, if any


class ChatError(RuntimeError):
    """A chat request failed for good. `status` is the HTTP status (None: no HTTP reply)."""

    def __init__(self, message: str, status: int | None = None, endpoint: str = "",
                 method: str = "POST"):
        self.message, self.status, self.endpoint = message, status, endpoint
        where = f"{method} {endpoint}" if endpoint else "chat request"
        super().__init__(f"{where} failed" + (f" with HTTP {status}" if status else "")
                         + f": {message}")


@dataclass
class ChatResult:
    texts: list[str]            # one reply per choice, in choice-index order
    finish_reasons: list[str]   # "stop" | "length" | whatever the server says
    prompt_tokens: int
    completion_tokens: int
    seconds: float = 0.0        # this call's request seconds (0: not sent, e.g. cached)
    reasonings: list[str] | None = None   # each choice's reasoning, apart from its text
    reasoning_tokens: int = 0   # of completion_tokens, the reasoning's (or estimated)
    tool_calls: list[list[dict]] | None = None   # each choice's message.tool_calls (None: none)

    @property
    def text(self) -> str:
        """The first (for n=1: the only) reply."""
        return self.texts[0]

    @property
    def reasoning(self) -> str:
        """The first reply's reasoning ("" without)."""
        return self.reasonings[0] if self.reasonings else ""


class _Retryable(Exception):
    """One attempt failed in a way worth retrying; `retry_after` is the server's wish in seconds."""

    def __init__(self, reason: str, status: int | None = None, retry_after: float = 0.0):
        super().__init__(reason)
        self.reason, self.status, self.retry_after = reason, status, retry_after


def sleep(seconds: float) -> None:
    """Indirection so that tests can replace the backoff sleep without touching time.sleep."""
    time.sleep(seconds)


def _quote(text: str) -> str:
    text = text.strip()
    return repr(text[:BODY_QUOTE_CHARS] + ("..." if len(text) > BODY_QUOTE_CHARS else ""))


def _parse_retry_after(value: str | None) -> float:
    """Retry-After in seconds, at most MAX_RETRY_AFTER: delta-seconds or an HTTP date; unparseable,
    negative and non-finite values ("inf", "nan", "1e999") count as absent."""
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0.0
    return min(seconds, MAX_RETRY_AFTER) if math.isfinite(seconds) and seconds >= 0 else 0.0


def unicode_text(text: str) -> str:
    """`text` with each lone surrogate (JSON's "\\ud800" escape decodes to one) replaced by U+FFFD:
    what a model wrote becomes text that UTF-8, JSON files and tokenizers all accept (they refuse a
    lone surrogate)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def lone_surrogate_at(value) -> str | None:
    """Where a decoded JSON value has a string (or key) with a lone surrogate, e.g.
    "messages[0].content" ("the body": the value itself); None when all its strings are Unicode
    text. (minskill.serve.server refuses a request with one; minskill.masa.rewriter_sft skips such
    a record.)"""
    stack = [("", value)]
    while stack:  # (a loop, not recursion: the value may be as deep as json.loads allows)
        where, value = stack.pop()
        if isinstance(value, str) and _LONE_SURROGATE.search(value):
            return where or "the body"
        if isinstance(value, dict):
            for key, item in value.items():
                if _LONE_SURROGATE.search(key):
                    return where or "the body"
                stack.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


def _unicode_json(value):
    """A decoded JSON value with unicode_text applied to every string in it, keys too (in place)."""
    if isinstance(value, str):
        return unicode_text(value)
    stack = [value]
    while stack:  # (a loop, not recursion: the body may be as deep as json.loads allows)
        node = stack.pop()
        if isinstance(node, dict):   # its keys made text here (order kept), its values below
            items = list(node.items())
            node.clear()
            node.update((unicode_text(key), item) for key, item in items)
        entries = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node,
                list) else ()
        for key, item in entries:
            if isinstance(item, str):
                node[key] = unicode_text(item)
            else:
                stack.append(item)
    return value


def _decode_json(content: bytes):
    """The JSON value of a reply body, all its strings Unicode text (bytes that are not UTF-8 and
    lone surrogates are U+FFFD: module docstring); ValueError if it is not JSON (also when nested
    too deeply)."""
    try:
        # (-sig: a BOM is no text)
        return _unicode_json(json.loads(content.decode("utf-8-sig", "replace")))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _server_message(content: bytes, reason: str | None) -> str:
    """The error message in an error reply's body: OpenAI's {"error": {"message"}}, or common
    variants (reason: the HTTP reason phrase, for an empty body)."""
    text = content.decode("utf-8", "replace")
    try:
        body = _decode_json(content)
    except ValueError:
        return _quote(text) if text.strip() else reason or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    return _quote(text)


def normalize_base_url(base_url: str) -> str:
    """'http://h:p/v1/' -> 'http://h:p/v1'; 'http://h:p' -> 'http://h:p/v1'."""
    base_url = base_url.strip().rstrip("/")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must look like http://host:port/v1, got {base_url!r}")
    return base_url if parts.path else base_url + "/v1"


def split_reasoning(content: str) -> tuple[str, str]:
    """(answer, reasoning) of a reply's content: `<think>…</think>` blocks are reasoning; so is all
    of it after a leading `<think>` that never closes (cut by max_tokens: no answer), and what
    precedes a `</think>` with no opening one (a template that opens the block in the prompt:
    DeepSeek-R1). A content without the tags is its answer, unchanged. (A server's reasoning parser
    sends it apart instead: REASONING_FIELDS, read by _parse.)"""
    if THINK_OPEN not in content and THINK_CLOSE not in content:
        return content, ""
    reasoning = []
    head, closed, tail = content.partition(THINK_CLOSE)
    if closed and THINK_OPEN not in head:
        reasoning.append(head)
        content = tail
    answer = _THINK_BLOCK.sub(lambda block: reasoning.append(block.group(1)) or "",
                              content).lstrip()
    if answer.startswith(THINK_OPEN):
        reasoning.append(answer[len(THINK_OPEN):])
        answer = ""
    return answer, "\n".join(part.strip() for part in reasoning if part.strip())


def _reasoning_tokens(usage: dict, completion_tokens: int, texts: list[str],
                      reasonings: list[str]) -> int:
    """The server's count of reasoning tokens, else completion_tokens split by characters."""
    details = usage.get("completion_tokens_details")
    reported = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if type(reported) is int and reported >= 0:
        return reported
    thought = sum(map(len, reasonings))
    return round(completion_tokens * thought / (thought + sum(map(len, texts))))


# ---- cost accounting -----------------------------------------------------------------------------
class Usage:
    """Thread-safe counters of one role's model calls (module docstring: `usage`). `t0 = start()`
    when a call (or a batch of calls) goes out, `seconds = stop(t0)` when it is back, then
    `add(result, seconds)` per call (result None: it failed); `snapshot()` is a dict of FIELDS;
    `Usage(**saved)` continues saved counts."""
    FIELDS = ("calls", "failures", "prompt_tokens", "completion_tokens", "reasoning_tokens",
              "request_seconds", "busy_seconds")

    def __init__(self, **start):
        self._lock = threading.Lock()
        self._counts = {k: (float if k.endswith("seconds") else int)(start.get(k) or 0)
                        for k in self.FIELDS}
        self._in_flight, self._busy_since = 0, 0.0

    def start(self) -> float:
        """Calls are in flight from now; returns the start time (time.monotonic())."""
        now = time.monotonic()
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = now
            self._in_flight += 1
        return now

    def stop(self, t0: float) -> float:
        """What `start` began is over: busy_seconds grows when nothing is in flight any more;
        returns now − t0."""
        now = time.monotonic()
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._counts["busy_seconds"] += now - self._busy_since
        return now - t0

    def add(self, result: "ChatResult | None", seconds: float) -> None:
        """Count one call that took `seconds`: its tokens, or (result None) a failure."""
        with self._lock:
            self._counts["request_seconds"] += seconds
            if result is None:
                self._counts["failures"] += 1
            else:
                self._counts["calls"] += 1
                self._counts["prompt_tokens"] += result.prompt_tokens
                self._counts["completion_tokens"] += result.completion_tokens
                self._counts["reasoning_tokens"] += getattr(result, "reasoning_tokens", 0)

    def snapshot(self) -> dict:
        """The counts now (busy_seconds includes the calls still in flight)."""
        with self._lock:
            out = dict(self._counts)
            if self._in_flight:
                out["busy_seconds"] += time.monotonic() - self._busy_since
        return out


def usage_delta(after: dict, before: dict) -> dict:
    """What was spent between two `usage` snapshots (keys of `after`)."""
    return {k: v - before.get(k, 0) for k, v in after.items()}


# ---- the per-attempt deadline --------------------------------------------------------------------
class _Watchdog:
    """Shuts down the connection of one attempt once `seconds` have passed, which ends a blocked
    read at once: timeouts on the socket bound each read alone, and a trickling server never trips
    them."""

    def __init__(self, seconds: float):
        self.expired, self._connection, self._lock = False, None, threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, connection) -> None:
        """`connection` (a urllib3 connection) is about to wait for the reply."""
        with self._lock:
            self._connection = connection
            if self.expired:
                self._cut()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._cut()

    def _cut(self) -> None:
        if (sock := getattr(self._connection, "sock", None)) is not None:
            try:  # socket.socket's shutdown even for TLS (SSLSocket's unwraps under the reader)
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._connection = None  # back in the pool: no longer this attempt's to cut


class _Watched:
    """Mixed into urllib3's connection classes: shows the connection that waits for a reply to the
    watchdog."""

    def getresponse(self, *args, **kwargs):
        if (watchdog := getattr(_current, "watchdog", None)) is not None:
            watchdog.watch(self)
        return super().getresponse(*args, **kwargs)


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = type("WatchedHTTPConnection", (_Watched, urllib3.connection.HTTPConnection), {})


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = type("WatchedHTTPSConnection", (_Watched, urllib3.connection.HTTPSConnection),
                         {})


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter, with connections (direct, or through an HTTP proxy) that the watchdog can
    cut."""
    pools = {"http": _HTTPPool, "https": _HTTPSPool}

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self.pools

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS has pool classes of its own: unwatched
            manager.pool_classes_by_scheme = self.pools
        return manager


# ---- the client ----------------------------------------------------------------------------------
class ChatClient:
    # no extra_body key
    SETS = ("model", "messages", "n", "temperature", "top_p", "max_tokens", "stop", "seed")

    def __init__(self, base_url=None, model=None, api_key=None, timeout=120.0, max_retries=5,
                 max_workers=8, backoff_base=0.5, backoff_max=30.0, attempt_timeout=None,
                 extra_body=None, max_reply_bytes=MAX_REPLY_BYTES):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise ValueError("no endpoint: pass base_url (e.g. http://127.0.0.1:8000/v1) or set "
                             "OPENAI_BASE_URL")
        if (max_retries < 0 or max_workers < 1 or not timeout > 0 or backoff_base < 0
            or backoff_max < 0
                or (attempt_timeout is not None and not attempt_timeout > 0)
                or type(max_reply_bytes) is not int or max_reply_bytes < 1):
            raise ValueError(f"ChatClient: need max_retries >= 0, max_workers >= 1, timeout > 0, "
                             f"attempt_timeout > 0 (or None), backoff >= 0 and an integer "
                             f"max_reply_bytes >= 1, got max_retries={max_retries}, "
                             f"max_workers={max_workers}, timeout={timeout}, "
                             f"attempt_timeout={attempt_timeout}, backoff_base={backoff_base}, "
                             f"backoff_max={backoff_max}, max_reply_bytes={max_reply_bytes!r}")
        if extra_body is not None and not isinstance(extra_body, dict):
            raise ValueError(f"extra_body must be a JSON object (a dict), got "
                             f"{type(extra_body).__name__}")
        if clash := sorted(set(extra_body or ()) & set(self.SETS)):
            raise ValueError(f"extra_body may not set {', '.join(clash)}: the client sets it (its "
                             f"own arguments)")
        self.extra_body = dict(extra_body or {})
        self.base_url = normalize_base_url(base_url)
        self.endpoint = self.base_url + "/chat/completions"
        self.model = model or os.environ.get("OPENAI_MODEL") or None
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout, self.max_retries, self.max_workers = timeout, max_retries, max_workers
        self.attempt_timeout = attempt_timeout  # None: an attempt may use all the call has left
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.max_reply_bytes = max_reply_bytes   # a longer reply body: ChatError, not read on
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_workers)   # client-wide (module docstring)
        self._sessions = threading.local()  # requests.Session is not thread-safe: one per thread
        self._stats = dict(retries=0, failures=0)   # calls and tokens: counted once, by self._usage
        self._usage = Usage()

    # ---- bookkeeping -----------------------------------------------------------------------------
    @property
    def stats(self) -> dict:
        """A snapshot of the counters (a copy: safe to read while other threads are calling)."""
        usage = self._usage.snapshot()
        with self._lock:
            return {**{k: usage[k] for k in ("calls", "prompt_tokens", "completion_tokens")},
                    **self._stats}

    @property
    def usage(self) -> dict:
        """Calls, tokens and seconds of this client's chat calls so far (module docstring; a
        snapshot)."""
        return self._usage.snapshot()

    def _count(self, **deltas) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._stats[key] += value

    def _session(self) -> requests.Session:
        session = getattr(self._sessions, "session", None)
        if session is None:
            session = self._sessions.session = requests.Session()
            for prefix in ("http://", "https://"):
                session.mount(prefix, _WatchedAdapter())
        return session

    def _headers(self) -> dict:
        authorization = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {"Content-Type": "application/json", **authorization}

    def backoff_delay(self, attempt: int, retry_after: float = 0.0) -> float:
        """Full-jitter exponential backoff after failed attempt `attempt` (0-based), >=
        Retry-After."""
        cap = min(self.backoff_max, self.backoff_base * 2 ** attempt)
        return max(retry_after, random.uniform(0.0, cap))

    # ---- one HTTP exchange, with retries ---------------------------------------------------------
    def _attempt(self, method: str, url: str, data: str | None, deadline: float):
        """One request, over by `deadline` (a time.monotonic() time) or sooner with attempt_timeout.
        Returns the decoded JSON; raises _Retryable or ChatError."""
        left = deadline - time.monotonic()
        limit = left if self.attempt_timeout is None else min(left, self.attempt_timeout)
        timed_out = (f"no reply within {self.timeout} s (the call's timeout)" if limit == left
                     else f"no reply within {self.attempt_timeout} s (attempt_timeout)")
        if limit <= 0:
            raise _Retryable(timed_out)
        watchdog = _current.watchdog = _Watchdog(limit)
        try:
            response = self._session().request(method, url, headers=self._headers(), data=data,
                                               timeout=(limit, limit), stream=True)
            content = self._read_body(response, url, method)
        except ChatError:
            raise
        except Exception as error:  # whatever the exchange raised, the caller gets a ChatError
            if watchdog.expired or isinstance(error, requests.Timeout):
                raise _Retryable(f"{timed_out} ({type(error).__name__})") from None
            if isinstance(error, (requests.ConnectionError,
                                  requests.exceptions.ChunkedEncodingError)):
                raise _Retryable(f"connection failed ({type(error).__name__}: {error})") from None
            # e.g. an invalid URL, an API key that no HTTP header can carry: retrying cannot help
            raise ChatError(f"{type(error).__name__}: {error}", None, url, method) from None
        finally:
            watchdog.stop()
            _current.watchdog = None
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Retryable(_server_message(content, response.reason), status,
                             _parse_retry_after(response.headers.get("Retry-After")))
        if status >= 400:
            raise ChatError(_server_message(content, response.reason), status, url, method)
        try:
            return _decode_json(content)
        except ValueError as error:
            text = content.decode("utf-8", "replace")
            raise ChatError(f"reply is not JSON ({error}); body starts {_quote(text)}", status,
                            url, method) from None

    def _read_body(self, response: requests.Response, url: str, method: str) -> bytes:
        """The reply's body, or ChatError naming its size once it is over max_reply_bytes (as its
        Content-Length says, or as it arrives: a chunked, streamed or compressed body), so a 200 MB
        reply is never held in memory."""
        cap, declared = self.max_reply_bytes, response.headers.get("Content-Length", "").strip()
        if declared.isdigit() and int(declared) > cap:
            said = f"its Content-Length is {int(declared)} bytes"
        else:
            chunks, size = [], 0
            for chunk in response.iter_content(1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    break
            if size <= cap:
                return b"".join(chunks)
            said = f"more than {cap} bytes arrived"
        response.close()   # the rest is never read: the connection is dropped, not reused
        raise ChatError(f"reply body too large: {said}, over max_reply_bytes = {cap} (a script's "
                        "--max-reply-mb); not read", response.status_code, url, method)

    def _request(self, method: str, url: str, payload: dict | None, deadline: float):
        data = None if payload is None else json.dumps(payload)  # TypeError here: the caller's
                                                                 # values
        for attempt in range(self.max_retries + 1):
            try:
                return self._attempt(method, url, data, deadline)
            except _Retryable as failure:
                delay = self.backoff_delay(attempt, failure.retry_after)
                if attempt == self.max_retries:
                    why = f"({self.max_retries} retries)"
                elif time.monotonic() + delay >= deadline:
                    why = (f"({attempt} retries): the next would start after the call's "
                           f"{self.timeout} s deadline (wait {delay:.3g} s)")
                else:
                    self._count(retries=1)
                    sleep(delay)
                    continue
                raise ChatError(f"gave up after {attempt + 1} attempts {why}; last failure: "
                                f"{failure.reason}",
                                failure.status, url, method) from None

    def resolve_model(self) -> str:
        """The model to ask for; with none configured, the first the server lists (asked once)."""
        return self._resolve_model(time.monotonic() + self.timeout)

    def _resolve_model(self, deadline: float) -> str:
        if self.model is None:
            url = self.base_url + "/models"
            body = self._request("GET", url, None, deadline)
            try:
                model = body["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                model = None
            if not isinstance(model, str) or not model:
                raise ChatError(f"no model given and the model list has no 'data[0].id' string; "
                                f"body starts {_quote(json.dumps(body))}", 200, url, "GET")
            self.model = model
        return self.model

    # ---- public API ------------------------------------------------------------------------------
    def chat(self, messages, n=1, temperature=0.0, top_p=1.0, max_tokens=256, stop=None, seed=None,
             **more) -> ChatResult:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(f"messages must be a list of {{'role', 'content'}} dicts, got "
                            f"{messages!r:.200}")
        with self._slots:  # waiting for a slot is not the server's time: the deadline starts after
            t0, result = self._usage.start(), None
            try:
                result = self._chat(messages, n, temperature, top_p, max_tokens, stop, seed, more)
                result.seconds = time.monotonic() - t0
                return result
            finally:
                self._usage.add(result, self._usage.stop(t0))

    def _chat(self, messages, n, temperature, top_p, max_tokens, stop, seed, more) -> ChatResult:
        deadline = time.monotonic() + self.timeout
        try:
            payload = {**self.extra_body, "model": self._resolve_model(deadline),
                       "messages": messages, "n": n, "temperature": temperature, "top_p": top_p,
                       "max_tokens": max_tokens, **more}
            if stop is not None:
                payload["stop"] = [stop] if isinstance(stop, str) else list(stop)
            if seed is not None:
                payload["seed"] = seed
            return self._parse(self._request("POST", self.endpoint, payload, deadline), n)
        except ChatError:
            self._count(failures=1)   # a ChatError; `usage` counts any other exception too
            raise

    def _parse(self, body, n: int) -> ChatResult:
        def wrong_shape(problem: str) -> ChatError:
            return ChatError(f"reply has {problem}; body starts {_quote(json.dumps(body))}", 200,
                             self.endpoint)

        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or not choices:
            raise wrong_shape("no 'choices' list")
        if len(choices) != n:
            raise wrong_shape(f"{len(choices)} choices where n={n} were asked for")
        if not all(isinstance(c, dict) and type(c.get("index", 0)) is int for c in choices):
            raise wrong_shape("a choice that is not an object with an integer 'index'")
        texts, reasons, reasonings, calls = [], [], [], []
        for choice in sorted(choices, key=lambda choice: choice.get("index", 0)):
            message = choice.get("message")
            if not isinstance(message, dict) or "content" not in message:
                raise wrong_shape("a choice without 'message.content'")
            text, reason = message["content"], choice.get("finish_reason")
            calls.append(message.get("tool_calls") or [])     # (OpenAI's {"id", "function"} dicts)
            if not isinstance(text, str | None) or not isinstance(reason, str | None) or not \
                    isinstance(calls[-1], list) or not all(isinstance(c, dict) for c in calls[-1]):
                raise wrong_shape("a non-string content or finish_reason (or bad tool_calls)")
            answer, thought = split_reasoning(text or "")      # null content -> ""
            field = next((message[k].strip() for k in REASONING_FIELDS
                          if isinstance(message.get(k), str)), "")
            texts.append(answer)
            reasonings.append("\n".join(part for part in (field, thought) if part))
            reasons.append(reason or "stop")
        usage = body.get("usage") or {}
        if not isinstance(usage, dict):
            raise wrong_shape("a non-object 'usage'")
        # absent/null: 0
        counts = [usage.get(key) or 0 for key in ("prompt_tokens", "completion_tokens")]
        # (type: not bool, float, NaN)
        if not all(type(count) is int and count >= 0 for count in counts):
            raise wrong_shape(f"'usage' token counts that are not non-negative integers: {counts}")
        thought = any(reasonings)
        tokens = _reasoning_tokens(usage, counts[1], texts, reasonings) if thought else 0
        return ChatResult(texts, reasons, *counts, reasonings=reasonings if thought else None,
                          reasoning_tokens=tokens, tool_calls=calls if any(calls) else None)

    def embed(self, texts: list[str]) -> list[list[float]]:
        """`POST {base_url}/embeddings` with `input` = texts: one vector per text, in order. The
        same slots, deadline, retries and ChatError as `chat`; a reply without one list of numbers
        per text (by `index`) raises ChatError quoting it. Not counted in `stats` (those count chat
        calls)."""
        if (isinstance(texts, str) or not isinstance(texts, list)
                or not all(isinstance(t, str) for t in texts)):
            raise TypeError(f"texts must be a list of strings, got {texts!r:.200}")
        if not texts:
            return []
        url = self.base_url + "/embeddings"
        with self._slots:
            deadline = time.monotonic() + self.timeout
            body = self._request("POST", url,
                                 {"model": self._resolve_model(deadline), "input": texts}, deadline)
        data = body.get("data") if isinstance(body, dict) else None
        items = sorted(data, key=lambda d: d.get("index", 0)) if isinstance(data, list) and all(
            isinstance(d, dict) and type(d.get("index", 0)) is int for d in data) else None
        vectors = [d.get("embedding") for d in items] if items is not None else None
        if vectors is None or len(vectors) != len(texts) or not all(
                isinstance(v, list) and v and all(type(x) in (int, float) for x in v)
                for v in vectors):
            raise ChatError(f"embeddings reply has no list of {len(texts)} numeric "
                            f"'data[].embedding' vectors; body starts {_quote(json.dumps(body))}",
                            200, url)
        return [[float(x) for x in v] for v in vectors]

    def chat_many(self, requests: list[dict], return_exceptions=False) -> list:
        """Run `chat(**request)` for each request concurrently (at most max_workers at once).
        Results are in request order. With return_exceptions, a failed request's slot holds its
        exception; otherwise the first failure (in request order) is raised once the pool stops."""
        if not requests:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(requests))) as pool:
            futures = [pool.submit(self.chat, **request) for request in requests]
            results = []
            for future in futures:
                try:
                    results.append(future.result())
                except Exception as error:
                    if not return_exceptions:
                        for pending in futures:
                            pending.cancel()
                        raise
                    results.append(error)
        return results

    def close(self) -> None:
        """Close this thread's connection pool (other threads' sessions close when collected)."""
        if (session := getattr(self._sessions, "session", None)) is not None:
            session.close()
            self._sessions.session = None

    def __repr__(self):
        return f"ChatClient({self.base_url!r}, model={self.model!r})"


def chat_as_completed(client, requests: list[dict]):
    """Yield (index, ChatResult or exception) as each `client.chat(**request)` finishes, at most
    `client.max_workers` in flight (the bound chat_many uses). If the consumer stops (an exception,
    Ctrl-C, SIGTERM), pending requests are cancelled and in-flight ones are not waited for, so an
    embedded server can be shut down at once. A client without `chat` is served by one `chat_many`
    call."""
    if not requests:
        return
    if not hasattr(client, "chat"):
        yield from enumerate(client.chat_many(requests, return_exceptions=True))
        return
    pool = ThreadPoolExecutor(max_workers=min(getattr(client, "max_workers", 8), len(requests)))
    try:
        futures = {pool.submit(client.chat, **request): k for k, request in enumerate(requests)}
        for future in as_completed(futures):
            error = future.exception()
            yield futures[future], (error if error is not None else future.result())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
