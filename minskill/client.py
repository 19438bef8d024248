"""Client for OpenAI-compatible chat endpoints: `POST {base_url}/chat/completions`.

This is how minskill reaches its frozen models (the task model, MASA's teacher): vLLM, SGLang,
llama.cpp's server, Ollama, a hosted API, or minskill's own server (`python -m minskill.server`).
It imports nothing from the rest of minskill, so it can be copied alone into another project.

Contract
--------
* `ChatClient(base_url, model, api_key)`; each may come from `OPENAI_BASE_URL`, `OPENAI_MODEL`,
  `OPENAI_API_KEY`. `base_url` is the API root, e.g. `http://127.0.0.1:8000/v1` (a trailing "/" is
  ignored; a bare `http://host:port` gets `/v1` appended). With no model name the client asks
  `GET {base_url}/models` once and uses the first model listed.
* `chat(messages, n, temperature, top_p, max_tokens, stop, seed) -> ChatResult` with the `n` reply
  texts in choice order, their finish reasons and the token usage the server reported.
* `chat_many(requests)` runs many `chat` calls on a bounded thread pool; results come back in order.
* Retried (up to `max_retries` times): connection errors (refused, reset), timeouts, HTTP 429 and
  5xx. Attempt a = 0, 1, ... that fails waits, before attempt a+1,

      delay_a = max(retry_after, U(0, min(backoff_max, backoff_base * 2**a)))

  i.e. exponential backoff with "full jitter" (a uniform draw below the exponential cap, which
  spreads out clients that failed together), but never less than the server's `Retry-After`
  seconds when it sent one. After the last retry fails, `ChatError` says how many attempts were
  made and what the last failure was.
* Not retried: any other 4xx raises `ChatError` carrying the server's message, the status and the
  endpoint. A reply that is not the expected JSON raises `ChatError` quoting the start of the body.
* `stats` (thread-safe): calls (successful chat calls), prompt_tokens, completion_tokens,
  retries (re-sent requests), failures (chat calls that raised).
"""

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import requests

BODY_QUOTE_CHARS = 200  # how much of an unexpected reply body an error message quotes


class ChatError(RuntimeError):
    """A chat request failed for good. `status` is the HTTP status (None: no HTTP reply)."""

    def __init__(self, message: str, status: int | None = None, endpoint: str = ""):
        self.message = message
        self.status = status
        self.endpoint = endpoint
        where = f"POST {endpoint}" if endpoint else "chat request"
        super().__init__(f"{where} failed" + (f" with HTTP {status}" if status else "") + f": {message}")


@dataclass
class ChatResult:
    texts: list[str]            # one reply per choice, in choice-index order
    finish_reasons: list[str]   # "stop" | "length" | whatever the server says
    prompt_tokens: int
    completion_tokens: int

    @property
    def text(self) -> str:
        """The first (for n=1: the only) reply."""
        return self.texts[0]


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
    """Retry-After is either delta-seconds or an HTTP date; unparseable values count as absent."""
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0


def _server_message(response: requests.Response) -> str:
    """The error message in an error reply: OpenAI's {"error": {"message"}}, or common variants."""
    try:
        body = response.json()
    except ValueError:
        return _quote(response.text) if response.text.strip() else response.reason or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    return _quote(response.text)


def normalize_base_url(base_url: str) -> str:
    """'http://h:p/v1/' -> 'http://h:p/v1'; 'http://h:p' -> 'http://h:p/v1'."""
    base_url = base_url.strip().rstrip("/")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must look like http://host:port/v1, got {base_url!r}")
    return base_url if parts.path else base_url + "/v1"


class ChatClient:
    def __init__(self, base_url=None, model=None, api_key=None, timeout=120.0, max_retries=5,
                 max_workers=8, backoff_base=0.5, backoff_max=30.0):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise ValueError("no endpoint: pass base_url (e.g. http://127.0.0.1:8000/v1) "
                             "or set OPENAI_BASE_URL")
        if max_retries < 0 or max_workers < 1 or timeout <= 0 or backoff_base < 0 or backoff_max < 0:
            raise ValueError(f"ChatClient: need max_retries >= 0, max_workers >= 1, timeout > 0 and "
                             f"backoff >= 0, got max_retries={max_retries}, max_workers={max_workers}, "
                             f"timeout={timeout}, backoff_base={backoff_base}, backoff_max={backoff_max}")
        self.base_url = normalize_base_url(base_url)
        self.endpoint = self.base_url + "/chat/completions"
        self.model = model or os.environ.get("OPENAI_MODEL") or None
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout, self.max_retries, self.max_workers = timeout, max_retries, max_workers
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self._lock = threading.Lock()
        self._sessions = threading.local()  # requests.Session is not thread-safe: one per thread
        self._stats = dict(calls=0, prompt_tokens=0, completion_tokens=0, retries=0, failures=0)

    # ---- bookkeeping -----------------------------------------------------------------------------
    @property
    def stats(self) -> dict:
        """A snapshot of the counters (a copy: safe to read while other threads are calling)."""
        with self._lock:
            return dict(self._stats)

    def reset_stats(self) -> None:
        with self._lock:
            for key in self._stats:
                self._stats[key] = 0

    def _count(self, **deltas) -> None:
        with self._lock:
            for key, value in deltas.items():
                self._stats[key] += value

    def _session(self) -> requests.Session:
        session = getattr(self._sessions, "session", None)
        if session is None:
            session = self._sessions.session = requests.Session()
        return session

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def backoff_delay(self, attempt: int, retry_after: float = 0.0) -> float:
        """Full-jitter exponential backoff after failed attempt `attempt` (0-based), >= Retry-After."""
        cap = min(self.backoff_max, self.backoff_base * 2 ** attempt)
        return max(retry_after, random.uniform(0.0, cap))

    # ---- one HTTP exchange, with retries ---------------------------------------------------------
    def _attempt(self, method: str, url: str, payload: dict | None):
        """One request. Returns the decoded JSON; raises _Retryable or ChatError."""
        try:
            response = self._session().request(method, url, headers=self._headers(), timeout=self.timeout,
                                               data=None if payload is None else json.dumps(payload))
        except requests.Timeout as error:
            raise _Retryable(f"no reply within {self.timeout} s ({type(error).__name__})")
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as error:
            raise _Retryable(f"connection failed ({type(error).__name__}: {error})")
        except requests.RequestException as error:  # e.g. an invalid URL: retrying cannot help
            raise ChatError(f"{type(error).__name__}: {error}", None, url)
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Retryable(_server_message(response), status,
                             _parse_retry_after(response.headers.get("Retry-After")))
        if status >= 400:
            raise ChatError(_server_message(response), status, url)
        try:
            return response.json()
        except ValueError:
            raise ChatError(f"reply is not JSON; body starts {_quote(response.text)}", status, url)

    def _request(self, method: str, url: str, payload: dict | None = None):
        for attempt in range(self.max_retries + 1):
            try:
                return self._attempt(method, url, payload)
            except _Retryable as failure:
                if attempt == self.max_retries:
                    raise ChatError(f"gave up after {attempt + 1} attempts ({self.max_retries} retries); "
                                    f"last failure: {failure.reason}", failure.status, url) from None
                self._count(retries=1)
                sleep(self.backoff_delay(attempt, failure.retry_after))

    def resolve_model(self) -> str:
        """The model to ask for; with none configured, the first one the server lists (asked once)."""
        if self.model is None:
            url = self.base_url + "/models"
            body = self._request("GET", url)
            try:
                self.model = body["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise ChatError(f"no model given and the model list has no 'data[0].id'; body starts "
                                f"{_quote(json.dumps(body))}", 200, url) from None
        return self.model

    # ---- public API ------------------------------------------------------------------------------
    def chat(self, messages, n=1, temperature=0.0, top_p=1.0, max_tokens=256, stop=None, seed=None) -> ChatResult:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(f"messages must be a list of {{'role', 'content'}} dicts, got {messages!r:.200}")
        try:
            payload = {"model": self.resolve_model(), "messages": messages, "n": n, "temperature": temperature,
                       "top_p": top_p, "max_tokens": max_tokens}
            if stop is not None:
                payload["stop"] = [stop] if isinstance(stop, str) else list(stop)
            if seed is not None:
                payload["seed"] = seed
            result = self._parse(self._request("POST", self.endpoint, payload), n)
        except ChatError:
            self._count(failures=1)
            raise
        self._count(calls=1, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens)
        return result

    def _parse(self, body, n: int) -> ChatResult:
        def wrong_shape(problem: str) -> ChatError:
            return ChatError(f"reply has {problem}; body starts {_quote(json.dumps(body))}", 200, self.endpoint)

        if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
            raise wrong_shape("no 'choices' list")
        choices = body["choices"]
        if len(choices) != n:
            raise wrong_shape(f"{len(choices)} choices where n={n} were asked for")
        try:
            choices = sorted(choices, key=lambda choice: choice.get("index", 0))
            texts = [choice["message"]["content"] or "" for choice in choices]  # null content -> ""
            reasons = [choice.get("finish_reason") or "stop" for choice in choices]
        except (KeyError, TypeError, AttributeError):
            raise wrong_shape("a choice without 'message.content'") from None
        if not all(isinstance(text, str) for text in texts):
            raise wrong_shape("a non-string 'message.content'")
        usage = body.get("usage") or {}
        if not isinstance(usage, dict):
            raise wrong_shape("a non-object 'usage'")
        return ChatResult(texts, reasons, int(usage.get("prompt_tokens") or 0),
                          int(usage.get("completion_tokens") or 0))

    def chat_many(self, requests: list[dict], return_exceptions=False) -> list:
        """Run `chat(**request)` for each request concurrently (at most max_workers at once).

        Results are in request order. With return_exceptions, a failed request's slot holds its
        exception; otherwise the first failure (in request order) is raised once the pool stops.
        """
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
        session = getattr(self._sessions, "session", None)
        if session is not None:
            session.close()
            self._sessions.session = None

    def __repr__(self):
        return f"ChatClient({self.base_url!r}, model={self.model!r})"
