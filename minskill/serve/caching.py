"""A disk cache of model calls and a call budget, wrapped around a chat client
(minskill/serve/client.py).

MASA's search asks the frozen target the same questions again and again: a resumed run replays the
evaluations it had finished, and a rerun with other search settings meets many of the same skill
sets. `CachingClient` answers a call it has seen from a JSONL file, so only new calls reach the
model. Two calls are the same call when their key is:

    key = sha256(model, exact messages, n, temperature, top_p, max_tokens, stop, seed)
        `request_key`

(plus the inner client's `extra_body` when it has one: `{"chat_template_kwargs":
{"enable_thinking": ...}}` changes the answers; so do a request's other fields, `response_format`,
`tools`, when it has them). A cached answer keeps its reasoning (client.split_reasoning) and
reasoning tokens.

`CallBudget` bounds the calls a whole run pays for (calls that miss the cache, and teacher calls): a
charge that does not fit raises `BudgetExhausted`, which a search catches to stop cleanly with what
it has. The wrapper has the same `chat` / `chat_many` interface as `ChatClient`, so code that takes
a client (rollout.run_rollouts, the teacher prompts) uses it unchanged.

`usage` is the role's cost (client.Usage: calls sent, tokens, request and busy seconds) plus
`cache_hits`:
an answer from the cache is counted apart and costs no call, token or second. Several wrappers
around one inner client (MASA's target and teacher on one embedded server) each count only their
own calls, and `CachingClient(..., usage=saved)` continues the counts of a resumed run.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from minskill.files import check_shape, open_append, read_jsonl
from minskill.serve.client import ChatResult, Usage

# a cache line (what _store writes); a line of another shape is an error naming FILE:LINE, not a
# crash at its hit
CACHE_LINE = {"key": str, "result": {"texts": [str], "finish_reasons": [(None, str)],
                                     "prompt_tokens": (None, int),
                                     "completion_tokens": (None, int),
                                     "reasonings?": (None, [str]),
                                     "reasoning_tokens?": (None, int)}}


class BudgetExhausted(RuntimeError):
    """The run's --max-calls budget is spent; the search stops and keeps the best so far."""


class CallBudget:
    """Counts model calls (target calls that miss the cache, and teacher calls) against a limit.
    `spent` is the whole run's (a resumed run passes what its earlier sessions spent);
    `spent_this_session` this process's."""

    def __init__(self, max_calls: int | None = None, spent: int = 0):
        if max_calls is not None and max_calls < 0:
            raise ValueError(f"max_calls must be >= 0 or None, got {max_calls}")
        self.max_calls, self.spent, self.spent_before = max_calls, spent, spent
        self.refusals = 0  # charges refused so far (a rollout compares it before and after)
        self._lock = threading.Lock()

    @property
    def spent_this_session(self) -> int:
        return self.spent - self.spent_before

    def charge(self, calls: int) -> None:
        """Reserve `calls` calls, or raise BudgetExhausted (and count the refusal) when they do not
        fit."""
        with self._lock:
            if self.max_calls is not None and self.spent + calls > self.max_calls:
                self.refusals += 1
                raise BudgetExhausted(f"call budget spent: {self.spent} of {self.max_calls} calls "
                                      f"used, {calls} more needed")
            self.spent += calls


# CachingClient.chat's fields; a request's others (response_format, tools) are keyed as they are
REQUEST_FIELDS = ("messages", "n", "temperature", "top_p", "max_tokens", "stop", "seed")


def request_key(model: str, request: dict, extra_body: dict | None = None) -> str:
    """sha256 of (model, exact messages, sampling parameters, seed, extra body fields if any): what
    makes two calls the same call (no extra fields: the key earlier versions wrote, so their caches
    still hit)."""
    more = {k: v for k, v in request.items() if k not in REQUEST_FIELDS}
    keyed = {**({"extra_body": extra_body} if extra_body else {}),
             **({"more": more} if more else {}), "model": model, "messages": request["messages"],
             "n": request.get("n", 1), "temperature": request.get("temperature", 0.0),
             "top_p": request.get("top_p", 1.0), "max_tokens": request.get("max_tokens", 256),
             "stop": request.get("stop"), "seed": request.get("seed")}
    return hashlib.sha256(
        json.dumps(keyed, sort_keys=True, ensure_ascii=False).encode("utf-8")
    ).hexdigest()


class CachingClient:
    """A ChatClient wrapper with the same `chat` / `chat_many` interface (so rollout.run_rollouts
    uses it unchanged) that answers repeated calls from a JSONL file on disk and charges new calls
    to a budget.

    cache_path None = no cache (still counts and charges the budget). Each new result is appended
    as one line with a single O_APPEND write, so concurrent appends do not interleave and a crash
    can only tear the last line (dropped on load). `stats`: calls (sent to the model), cache_hits;
    `usage`: the module docstring's (`usage=` a saved `usage` to continue from; `calls` and
    `cache_hits` count this process)."""

    def __init__(self, inner, cache_path=None, budget: CallBudget | None = None,
                 model: str | None = None, usage: dict | None = None):
        self.inner, self.budget = inner, budget or CallBudget()
        self.cache_path = None if cache_path is None else Path(cache_path)
        self._model = model
        self._lock = threading.Lock()
        self._cache: dict[str, dict] = {}
        self.calls = self.cache_hits = 0
        self._usage = Usage(**(usage or {}))
        self._hits_before = int((usage or {}).get("cache_hits") or 0)
        if self.cache_path is not None and self.cache_path.exists():
            for lineno, record in read_jsonl(self.cache_path):
                if isinstance(record, dict) and "key" in record and "result" in record:
                    result = check_shape(record, CACHE_LINE,
                                         f"{self.cache_path}:{lineno}")["result"]
                    self._cache[record["key"]] = {k.rstrip("?"): result[k.rstrip("?")]
                                                  for k in CACHE_LINE["result"]
                                                  if k.rstrip("?") in result}

    @property
    def model(self) -> str:
        """The target's model name (asked from the server once when none was configured)."""
        if self._model is None:
            self._model = getattr(self.inner, "model", None)
            if self._model is None and hasattr(self.inner, "resolve_model"):
                self._model = self.inner.resolve_model()
            self._model = self._model or "default"
        return self._model

    @property
    def max_workers(self) -> int:
        """The inner client's bound on requests in flight: run_rollouts sizes its pool by it."""
        return getattr(self.inner, "max_workers", 8)

    @property
    def stats(self) -> dict:
        return {"calls": self.calls, "cache_hits": self.cache_hits,
                "cached_entries": len(self._cache)}

    @property
    def usage(self) -> dict:
        """The calls sent (client.Usage.FIELDS) and the cache hits, of the whole run (a
        snapshot)."""
        with self._lock:
            hits = self._hits_before + self.cache_hits
        return {**self._usage.snapshot(), "cache_hits": hits}

    def _lookup(self, key: str):
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self.cache_hits += 1
                return ChatResult(**hit)
        return None

    def _store(self, key: str, result) -> None:
        record = {"texts": list(result.texts), "finish_reasons": list(result.finish_reasons),
                  "prompt_tokens": result.prompt_tokens,
                  "completion_tokens": result.completion_tokens}
        if getattr(result, "reasonings", None):
            record.update(reasonings=list(result.reasonings),
                          reasoning_tokens=result.reasoning_tokens)
        with self._lock:
            self._cache[key] = record
            if self.cache_path is not None:
                # one write(2) of the whole line with O_APPEND: concurrent appends do not interleave
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                line = (
                    json.dumps({"key": key, "result": record}, ensure_ascii=False) + "\n"
                ).encode("utf-8")
                with open_append(self.cache_path, binary=True) as f:   # (never through a link)
                    f.write(line)

    def chat(self, messages, n=1, temperature=0.0, top_p=1.0, max_tokens=256, stop=None, seed=None,
             **more):
        return self.chat_many([dict(messages=messages, n=n, temperature=temperature, top_p=top_p,
                                    max_tokens=max_tokens, stop=stop, seed=seed, **more)])[0]

    def chat_many(self, requests: list[dict], return_exceptions=False) -> list:
        caching = self.cache_path is not None
        extra = getattr(self.inner, "extra_body", None)
        keys = [request_key(self.model, r, extra) if caching else None for r in requests]
        results: list = [self._lookup(k) if caching else None for k in keys]
        missing = [i for i, r in enumerate(results) if r is None]
        if not missing:
            return results
        try:
            self.budget.charge(len(missing))
        except BudgetExhausted as error:
            if not return_exceptions:
                raise
            for i in missing:
                results[i] = error
            return results
        with self._lock:
            self.calls += len(missing)
        t0 = self._usage.start()   # busy seconds: the batch's wall time; request seconds: each
                                   # call's own
        try:
            fresh = self.inner.chat_many([requests[i] for i in missing],
                                         return_exceptions=return_exceptions)
        except BaseException:
            self._usage.add(None, 0.0)   # a batch that raises counts as one failure
            raise
        finally:
            self._usage.stop(t0)
        for i, result in zip(missing, fresh):
            results[i] = result
            failed = isinstance(result, BaseException)
            self._usage.add(None if failed else result,
                            0.0 if failed else getattr(result, "seconds", 0.0))
            if caching and not failed:
                self._store(keys[i], result)
        return results
