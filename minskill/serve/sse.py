"""Streamed chat replies of minskill.serve.server: `"stream": true` answered with server-sent
events, as OpenAI does.

One HTTP/1.1 response (Content-Type text/event-stream, chunked, so the connection stays reusable) of
`data: <JSON>` events, each a "chat.completion.chunk" with the id, created and model of the whole
reply:

    data: {"choices": [{"index": j, "delta": {"role": "assistant", "content": ""}, "finish_reason":
    null}], ...}
    data: {"choices": [{"index": j, "delta": {"content": "Hel"}, "finish_reason": null}], ...}
        deltas
    data: {"choices": [{"index": j, "delta": {}, "finish_reason": "stop" | "length"}], ...}
            per choice
    data: {"choices": [], "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}, ...}
       include_usage
    data: [DONE]

(with stream_options.include_usage every other chunk carries "usage": null, as OpenAI's do). The
deltas are what the backend reports while it generates (minskill.serve.backends: per decoded token
for a model); when the reply is done, what they held back is sent, so the deltas of choice j add up
to its full text. With `logprobs`, a choice's log-probs (minskill.serve.bodies' shape) all come in
the chunk that carries that rest (its content maybe ""), just before its finish_reason:
concatenated over the chunks, as clients do, they are the reply's.

Tool calls (serve.tool_calls): a request with tools is not streamed token by token (a delta could be
the start of a call); when its reply is done, a choice's content (if any) comes in one delta, then
its calls in one delta, `{"tool_calls": [{"index": k, "id", "type": "function", "function": {"name",
"arguments"}}, ...]}`, as the openai client accumulates them, then finish_reason "tool_calls".

Legacy /v1/completions streams the same way, as "text_completion" chunks: choices [{"index", "text",
"logprobs", "finish_reason"}] (no role chunk), one request per prompt, the choices of prompt i
numbered i * n + j; with `echo`, each choice's first chunk is its prompt.

The response starts with the first event. A request that fails before that (e.g. a backend's 503)
gets its ordinary status and OpenAI's error body, so clients can retry as usual; one that fails
later gets a `data: {"error": {...}}` event and the stream ends without [DONE]. A client that goes
away (the connection closes or resets, or stops reading for request_timeout seconds) cancels its
request as a non-streaming one does: it leaves the queue, or its generation stops at the next token.
"""
from __future__ import annotations

import json
import queue
import sys
import time
import traceback
import uuid

from minskill.serve.backends import ClientGone, CompletionRequest
from minskill.serve.bodies import chat_logprobs, legacy_logprobs, echoed, usage
from minskill.serve.errors import BackendError


class _EventStream:
    """The SSE response of one request, on the handler's connection; it starts with the first
    event."""

    def __init__(self, handler, requests: list[CompletionRequest], model: str,
                 legacy: bool = False):
        self.handler, self.requests, self.legacy, self.started = handler, requests, legacy, False
        self.include_usage = requests[0].include_usage
        self.head = {"id": f"{'cmpl' if legacy else 'chatcmpl'}-{uuid.uuid4().hex}",
                     "object": "text_completion" if legacy else "chat.completion.chunk",
                     "created": int(time.time()), "model": model}

    def _write(self, data: bytes):
        self.handler.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))   # one HTTP chunk

    def _event(self, body):
        self._start()
        self._write(b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode())
                    + b"\n\n")

    def _start(self):
        if self.started:
            return
        self.started = True
        handler = self.handler
        # reading is over: writes may wait request_timeout seconds for a slow reader, then the
        # client counts as gone
        handler.reader.deadline = None
        handler.connection.settimeout(handler.server.state.request_timeout)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for j in range(0 if self.legacy else sum(r.n for r in self.requests)):
            self.chunk(j, {"role": "assistant", "content": ""})
        j = 0
        for request in self.requests if self.legacy else ():
            for _ in range(request.n):
                if echoed(request):
                    self.chunk(j, {"content": echoed(request)})
                j += 1

    def chunk(self, j: int, delta: dict, finish_reason: str | None = None, logprobs=None):
        choice = {"index": j, "text": delta.get("content", "")} if self.legacy else {"index": j,
                "delta": delta}
        body = {**self.head, "choices": [{**choice, "logprobs": logprobs,
                                          "finish_reason": finish_reason}]}
        if self.include_usage:
            body["usage"] = None
        self._event(body)

    def finish(self, choices, sent: list[str]):
        """The held-back rest of each choice (with its log-probs), its finish reason, the usage if
        asked for, then [DONE]."""
        for j, choice in enumerate(choices):
            rest = choice.text[len(sent[j]):] if choice.text.startswith(sent[j]) else ""
            logprobs = (legacy_logprobs if self.legacy else chat_logprobs)(choice.logprobs)
            if rest or logprobs is not None:
                self.chunk(j, {"content": rest}, logprobs=logprobs)
            if getattr(choice, "tool_calls", None):
                calls = [{"index": k, **call} for k, call in enumerate(choice.tool_calls)]
                self.chunk(j, {"tool_calls": calls})
            self.chunk(j, {}, choice.finish_reason)
        if self.include_usage:
            self._event({**self.head, "choices": [], "usage": usage(
                sum(r.prompt_tokens for r in self.requests),
                sum(choice.completion_tokens for choice in choices))})
        self._event(b"[DONE]")
        self._write(b"")                 # the last, empty chunk ends the response

    def fail(self, error: BaseException):
        """An error after the stream started: one error event, then the stream (and connection)
        ends."""
        if not isinstance(error, BackendError):
            traceback.print_exception(error, file=sys.stderr)
            error = BackendError(500, f"internal error: {type(error).__name__}: {error}")
        self._event({"error": {"message": error.message, "type": error.type, "param": error.param,
                               "code": error.code}})
        self._write(b"")
        self.handler.close_connection = True


def stream_chat(handler, scheduler, requests: list[CompletionRequest], model: str,
                poll: float = 0.5, legacy: bool = False) -> None:
    """Serve validated streaming requests (a chat request, or a legacy request's prompts) on
    `handler` (minskill.serve.server's) as one stream: queue them, send their deltas as they come,
    finish the stream. Raises ClientGone (requests cancelled) when the client has gone, and a
    request's own error if one fails before anything was sent."""
    events: queue.Queue = queue.Queue()
    first = 0
    for request in requests:    # choice j of request k is choice first_k + j of the stream
        if getattr(request, "tool_use", None) is None:     # (with tools: sent when done)
            request.on_text = lambda j, text, first=first: events.put((first + j, text))
        first += request.n
    jobs = [scheduler.enqueue(request, events) for request in requests]
    out, sent, running = _EventStream(handler, requests, model, legacy), [""] * first, len(jobs)
    checked = time.monotonic()
    try:
        while running:
            try:
                item = events.get(timeout=poll)
            except queue.Empty:
                item = ()
            if item is None:                # the scheduler is done with one job
                running -= 1
                continue
            if time.monotonic() - checked >= poll:   # (a busy stream is checked as often as an
                                                     # idle one)
                if handler._client_gone():
                    raise ClientGone()
                checked = time.monotonic()
            if item:
                j, text = item
                out.chunk(j, {"content": text})
                sent[j] += text
        error = next((job.error for job in jobs if job.error is not None), None)
        if error is None:
            out.finish([choice for job in jobs for choice in job.result], sent)
    except (ClientGone, OSError):      # closed, reset, or a write that timed out: nobody reads
                                       # this any more
        for job in jobs:
            scheduler.cancel(job)
        raise ClientGone() from None
    if error is not None:
        if not out.started:
            raise error                 # nothing sent yet: the handler answers with the error's
                                        # status
        try:
            out.fail(error)
        except OSError:
            handler.close_connection = True
