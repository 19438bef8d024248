"""Streamed chat replies of minskill.serve.server: `"stream": true` answered with server-sent events, as OpenAI does.

One HTTP/1.1 response (Content-Type text/event-stream, chunked, so the connection stays reusable) of
`data: <JSON>` events, each a "chat.completion.chunk" with the id, created and model of the whole reply:

    data: {"choices": [{"index": j, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}], ...}
    data: {"choices": [{"index": j, "delta": {"content": "Hel"}, "finish_reason": null}], ...}     deltas
    data: {"choices": [{"index": j, "delta": {}, "finish_reason": "stop" | "length"}], ...}         per choice
    data: {"choices": [], "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}, ...}    include_usage
    data: [DONE]

(with stream_options.include_usage every other chunk carries "usage": null, as OpenAI's do). The deltas are
what the backend reports while it generates (minskill.serve.backends: per decoded token for a model); when the
reply is done, what they held back is sent, so the deltas of choice j add up to its full text.

The response starts with the first event. A request that fails before that (e.g. a backend's 503)
gets its ordinary status and OpenAI's error body, so clients can retry as usual; one that fails later gets
a `data: {"error": {...}}` event and the stream ends without [DONE]. A client that goes away (the
connection closes or resets, or stops reading for request_timeout seconds) cancels its request as a
non-streaming one does: it leaves the queue, or its generation stops at the next token.
"""
from __future__ import annotations

import json
import queue
import sys
import time
import traceback
import uuid

from minskill.serve.backends import ClientGone, CompletionRequest
from minskill.serve.errors import BackendError


class _EventStream:
    """The SSE response of one request, on the handler's connection; it starts with the first event."""

    def __init__(self, handler, request: CompletionRequest, model: str):
        self.handler, self.request, self.started = handler, request, False
        self.head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model}

    def _write(self, data: bytes):
        self.handler.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))   # one HTTP chunk

    def _event(self, body):
        self._start()
        self._write(b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode()) + b"\n\n")

    def _start(self):
        if self.started:
            return
        self.started = True
        handler = self.handler
        # reading is over: writes may wait request_timeout seconds for a slow reader, then the client counts as gone
        handler.reader.deadline = None
        handler.connection.settimeout(handler.server.state.request_timeout)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for j in range(self.request.n):
            self.chunk(j, {"role": "assistant", "content": ""})

    def chunk(self, j: int, delta: dict, finish_reason: str | None = None):
        body = {**self.head, "choices": [{"index": j, "delta": delta, "logprobs": None,
                                          "finish_reason": finish_reason}]}
        if self.request.include_usage:
            body["usage"] = None
        self._event(body)

    def finish(self, choices, sent: list[str]):
        """The held-back rest of each choice, its finish reason, the usage if asked for, then [DONE]."""
        for j, choice in enumerate(choices):
            rest = choice.text[len(sent[j]):] if choice.text.startswith(sent[j]) else ""
            if rest:
                self.chunk(j, {"content": rest})
            self.chunk(j, {}, choice.finish_reason)
        if self.request.include_usage:
            completion = sum(choice.completion_tokens for choice in choices)
            prompt = self.request.prompt_tokens
            self._event({**self.head, "choices": [], "usage": {
                "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
        self._event(b"[DONE]")
        self._write(b"")                 # the last, empty chunk ends the response

    def fail(self, error: BaseException):
        """An error after the stream started: one error event, then the stream (and connection) ends."""
        if not isinstance(error, BackendError):
            traceback.print_exception(error, file=sys.stderr)
            error = BackendError(500, f"internal error: {type(error).__name__}: {error}")
        self._event({"error": {"message": error.message, "type": error.type, "param": error.param,
                               "code": error.code}})
        self._write(b"")
        self.handler.close_connection = True


def stream_chat(handler, scheduler, request: CompletionRequest, model: str, poll: float = 0.5) -> None:
    """Serve a validated streaming request on `handler` (minskill.serve.server's): queue it, send its deltas as
    they come, finish the stream. Raises ClientGone (request cancelled) when the client has gone, and the
    request's own error if it fails before anything was sent."""
    events: queue.Queue = queue.Queue()
    request.on_text = lambda j, text: events.put((j, text))
    job = scheduler.enqueue(request, events)
    out, sent = _EventStream(handler, request, model), [""] * request.n
    checked = time.monotonic()
    try:
        while True:
            try:
                item = events.get(timeout=poll)
            except queue.Empty:
                item = ()
            if item is None:                # the scheduler is done with this job
                break
            if time.monotonic() - checked >= poll:   # (a busy stream is checked as often as an idle one)
                if handler._client_gone():
                    raise ClientGone()
                checked = time.monotonic()
            if item:
                j, text = item
                out.chunk(j, {"content": text})
                sent[j] += text
        if job.error is None:
            out.finish(job.result, sent)
    except (ClientGone, OSError):      # closed, reset, or a write that timed out: nobody reads this any more
        scheduler.cancel(job)
        raise ClientGone() from None
    if job.error is not None:
        if not out.started:
            raise job.error             # nothing sent yet: the handler answers with the error's status
        try:
            out.fail(job.error)
        except OSError:
            handler.close_connection = True
