"""The reply bodies of minskill.serve.server's completions endpoints, in OpenAI's shapes, log-probs
included.

Chat (`chat.completion`): choices[i] = {index, message: {role, content[, reasoning_content] [,
tool_calls]}, logprobs, finish_reason}, where tool_calls (serve.tool_calls) come with content null
when the reply holds nothing else, and logprobs is null or, with `logprobs: true`,

    {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"},
    ...]}, ...]}

one entry per reply token (top_logprobs holds the request's top_logprobs most likely tokens of that
step; the sampled one need not be among them). Legacy (`text_completion`): choices[i * n + j] =
{index, text, logprobs, finish_reason} for sample j of prompt i, logprobs null or, with `logprobs:
k`,

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}, ...],
    "text_offset": [...]}

(each top_logprobs dict holds the k most likely tokens and the sampled one, as OpenAI's legacy API
does; text_offset: where each token's text starts in the reply). With `echo` (not with logprobs), a
legacy choice's text starts with its prompt. A log-prob below LOGPROB_FLOOR (or -inf, which JSON
cannot carry) is sent as LOGPROB_FLOOR, as vLLM sends it. usage counts each prompt once and every
choice's tokens. """
from __future__ import annotations

import time
import uuid

from minskill.serve.errors import bad_request

LOGPROB_FLOOR = -9999.0


def _logprob(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


def _token(t) -> dict:
    return {"token": t.token, "logprob": _logprob(t.logprob), "bytes": list(t.token_bytes)}


def chat_logprobs(tokens) -> dict | None:
    """A choice's `logprobs` (module docstring) from its TokenLogprobs, or None when it has none."""
    if tokens is None:
        return None
    return {"content": [{**_token(t), "top_logprobs": [_token(a) for a in t.top]} for t in tokens]}


def legacy_logprobs(tokens, text_start: int = 0) -> dict | None:
    """A legacy choice's `logprobs` (module docstring), offsets counted from text_start; None when
    it has none."""
    if tokens is None:
        return None
    offsets, at = [], text_start
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in tokens],
            "token_logprobs": [_logprob(t.logprob) for t in tokens], "top_logprobs": [
                    {**{a.token: _logprob(a.logprob) for a in t.top}, t.token: _logprob(t.logprob)}
                             for t in tokens],
            "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _reasoning_field(choice) -> dict:
    """{"reasoning_content": ...} for a choice with its reasoning apart (ScriptedBackend's
    (reasoning, text))."""
    reasoning = getattr(choice, "reasoning", None)
    return {} if reasoning is None else {"reasoning_content": reasoning}


def chat_message(choice) -> dict:
    """A chat choice's message: content (null beside calls when empty), reasoning, tool calls."""
    calls = getattr(choice, "tool_calls", None)
    if not calls:
        return {"role": "assistant", "content": choice.text, **_reasoning_field(choice)}
    return {"role": "assistant", "content": choice.text or None, **_reasoning_field(choice),
            "tool_calls": calls}


def chat_reply(request, choices, model: str) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": chat_message(c),
                         "logprobs": chat_logprobs(c.logprobs), "finish_reason": c.finish_reason}
                        for i, c in enumerate(choices)],
            "usage": usage(request.prompt_tokens, sum(c.completion_tokens for c in choices))}


def completion_reply(requests, results, model: str) -> dict:
    """The legacy reply to `requests` (one per prompt) whose choices are `results` (a list per
    request)."""
    choices = [(echoed(r), c) for r, result in zip(requests, results) for c in result]
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": i, "text": head + c.text,
                         "logprobs": legacy_logprobs(c.logprobs),
                         "finish_reason": c.finish_reason}
                        for i, (head, c) in enumerate(choices)],
            "usage": usage(sum(r.prompt_tokens for r in requests),
                           sum(c.completion_tokens for _, c in choices))}


def echo_requested(payload: dict, logprobs: bool) -> bool:
    """A legacy request's `echo`, checked (with `logprobs` it needs the prompt's: not served)."""
    echo = payload.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise bad_request(f"'echo' must be true or false, got {echo!r:.40}", "echo")
    if echo and logprobs:
        raise bad_request("'echo' with 'logprobs' (the prompt's log-probs) is not implemented by "
                          "this server", "echo", "unsupported_field")
    return bool(echo)


def echoed(request) -> str:
    """What a legacy choice's text starts with: its prompt with `echo`, else nothing."""
    return request.prompt if getattr(request, "echo", False) else ""
