"""A request body read into the CompletionRequest a backend serves (minskill.serve.backends), every
field checked: a bad one is a BackendError(400/404, ...) naming it.

`parse_chat_request(payload, backend)` turns a decoded /v1/chat/completions body into a
CompletionRequest, `parse_completion_request` a legacy /v1/completions body into one per prompt
string, or they raise BackendError(400/404, ...) naming the field at fault (minskill.serve.fields:
which fields are implemented, ignored or refused). Roles: `developer` is read as `system` (OpenAI's
newer name for it); an assistant turn's `content` may be null or absent (an empty turn, as a client
replays a reply); `tool_calls` and `tool` turns go to the chat template
(serve.tool_calls.tool_turn).

Tools and sampling controls. `tools` / `tool_choice` are read into .tool_use (serve.tool_calls: a
backend gets count_prompt_tokens(messages, tools=...) only with tools; each Choice's calls parsed
as its `tool_style` says), penalties and `logit_bias` into .penalties (serve.penalties, in the
engine); a legacy `echo` puts the prompt before each text (serve.bodies, serve.sse).

Chat template kwargs. `chat_template_kwargs` (an object, as vLLM and SGLang take it) may carry
`enable_thinking` (true, false or null): true renders a Qwen3 template's reply prompt without the
empty `<think>` block, so the model thinks (minskill.nn.tokenizer; default false, thinking off:
unlike vLLM, whose default is the template's, on). Other keys are ignored, as vLLM ignores the
kwargs a template does not use; a template without enable_thinking ignores it too. A backend gets
it as `count_prompt_tokens(messages, enable_thinking=True)` (passed only when true) and as
`CompletionRequest.enable_thinking`.

Content parts. A message's `content` is a string or, as OpenAI's API also allows, a list of
{"type": "text", "text": ...} parts; the parts' texts are joined with "\n", as vLLM and
TensorRT-LLM join them, so that a prompt reaches the model the same here and behind those engines
(OpenAI does not document a separator). Any other part type (image_url, input_audio, file, refusal,
...) is a 400 naming messages[i].content[k] and its type: these models read text only.
"""
from __future__ import annotations

from minskill.serve.backends import (MAX_N, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, ROLES, Backend,
                                     CompletionRequest)
from minskill.serve.bodies import echo_requested
from minskill.serve.constrained import response_schema
from minskill.serve.errors import bad_request, check_body_and_model
from minskill.serve.fields import CHAT_FIELDS, COMPLETION_FIELDS, check_fields
from minskill.serve.penalties import parse_penalties
from minskill.serve.tool_calls import tool_turn, tool_use


def _number(payload, key, default, low, high, low_open=False):
    value = payload.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            (low < value if low_open else low <= value) and value <= high):
        low_text = f"> {low}" if low_open else f">= {low}"
        raise bad_request(f"'{key}' must be a number {low_text} and <= {high}, got {value!r}", key)
    return float(value)


def _integer(payload, key, default, low, high):
    value = payload.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_request(f"'{key}' must be an integer from {low} to {high}, got {value!r}", key)
    return value


def _content_text(content, i: int) -> str:
    """A message's content: a string, or a list of text parts joined with "\n" (see the module
    docstring)."""
    where = f"messages[{i}].content"
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text parts, got "
                          f"{type(content).__name__}", where)
    if not content:
        raise bad_request(f"{where} is an empty list: give a string or at least one text part",
                          where)
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad_request(f"{where}[{k}] must be an object {{'type': 'text', 'text': ...}}, "
                               f"got {type(part).__name__}", f"{where}[{k}]")
        if part.get("type") != "text":
            raise bad_request(f"{where}[{k}] has type {part.get('type')!r}: this server reads text "
                               f"parts only ({{'type': 'text', 'text': ...}})", f"{where}[{k}]",
                               "unsupported_content_type")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{k}].text must be a string, got "
                              f"{type(part.get('text')).__name__}",
                               f"{where}[{k}].text")
        texts.append(part["text"])
    return "\n".join(texts)


def _stream_options(payload) -> tuple[bool, bool]:
    """(stream, include_usage) from "stream" and "stream_options", checked as OpenAI checks them."""
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request(f"'stream' must be true or false, got {stream!r:.100}", "stream")
    options = payload.get("stream_options")
    if options is None:
        return bool(stream), False
    if not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true",
                          "stream_options")
    if not isinstance(options, dict):
        raise bad_request(f"'stream_options' must be an object, got {type(options).__name__}",
                          "stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request(f"'stream_options.include_usage' must be true or false, got "
                          f"{include_usage!r:.100}",
                           "stream_options.include_usage")
    for key, value in options.items():   # include_obfuscation only pads chunks: ignored; vLLM's
                                         # per-chunk usage: no
        if key not in ("include_usage", "include_obfuscation") and value not in (None, False):
            raise bad_request(f"'stream_options.{key}' = {value!r:.100} is not implemented by this "
                              f"server (it reads include_usage)", f"stream_options.{key}",
                              "unsupported_field")
    return True, bool(include_usage)


def _enable_thinking(payload) -> bool:
    """chat_template_kwargs.enable_thinking (module docstring): an object's boolean, other keys
    ignored."""
    kwargs = payload.get("chat_template_kwargs")
    if kwargs is None:
        return False
    if not isinstance(kwargs, dict):
        raise bad_request(f"'chat_template_kwargs' must be an object, got {type(kwargs).__name__}",
                          "chat_template_kwargs")
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request(f"'chat_template_kwargs.enable_thinking' must be true or false, got "
                          f"{thinking!r:.100}",
                          "chat_template_kwargs.enable_thinking")
    return bool(thinking)


def _messages(payload) -> list[dict]:
    """The chat's messages as {"role", "content": str, ...tool keys}: developer as system, an
    assistant's null content as ""."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {'role', 'content'} objects",
                          "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"messages[{i}] must be an object, got {type(message).__name__}",
                              f"messages[{i}]")
        role, tool_keys = message.get("role"), tool_turn(message, i)
        if role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                              f"messages[{i}].role")
        content = message.get("content")
        if content is None and role == "assistant":   # a reply replayed as the client got it
                                                      # (tool_calls aside)
            content = ""
        elif content is None:
            raise bad_request(f"messages[{i}].content must be a string or a list of text parts, "
                              f"got {'null' if 'content' in message else 'nothing'}",
                              f"messages[{i}].content")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content_text(content, i), **tool_keys})
    return out


def _chat_logprobs(payload) -> tuple[bool, int]:
    """(logprobs, top_logprobs) of a chat request: a boolean, and 0..MAX_TOP_LOGPROBS only with
    logprobs true."""
    logprobs = payload.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request(f"'logprobs' must be true or false, got {logprobs!r:.100}", "logprobs")
    top = _integer(payload, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return bool(logprobs), top


def parse_chat_request(payload, backend: Backend) -> CompletionRequest:
    """Validate a decoded /v1/chat/completions body; raise BackendError(400, ...) naming the
    problem."""
    check_body_and_model(payload, backend)
    check_fields(payload, CHAT_FIELDS, "/v1/chat/completions")
    messages = _messages(payload)
    thinking = _enable_thinking(payload)
    logprobs, top_logprobs = _chat_logprobs(payload)
    tools = tool_use(payload)
    try:
        optional = {**({"enable_thinking": True} if thinking else {}),
                    **({"tools": tools.tools} if tools else {})}
        prompt_tokens = backend.count_prompt_tokens(messages, **optional)
    except (ValueError, KeyError) as error:  # e.g. a chat template that refuses this message order
        raise bad_request(f"cannot format these messages for the model: {error}", "messages")
    key = "max_tokens" if payload.get("max_tokens") is not None else "max_completion_tokens"
    if payload.get("max_tokens") is not None and payload.get("max_completion_tokens") is not None:
        both = [_integer(payload, k, None, 1, backend.max_context)
                for k in ("max_tokens", "max_completion_tokens")]
        if both[0] != both[1]:   # neither is ignored
            raise bad_request(f"'max_tokens' ({both[0]}) and 'max_completion_tokens' ({both[1]}) "
                              "differ: give one of them", "max_completion_tokens")
    request = _request(payload, backend, prompt_tokens, "messages", key, None, messages=messages,
                       enable_thinking=thinking, logprobs=logprobs, top_logprobs=top_logprobs,
                       tool_use=tools)
    if tools is not None and tools.schema is not None:     # a forced call (serve.tool_calls)
        request.response_schema = tools.schema
    return request


def parse_completion_request(payload, backend: Backend) -> list[CompletionRequest]:
    """Validate a legacy /v1/completions body: one CompletionRequest per prompt string (served in
    one batch; choice i * n + j of the reply is sample j of prompt i). max_tokens defaults to 16,
    as OpenAI's and vLLM's."""
    check_body_and_model(payload, backend)
    check_fields(payload, COMPLETION_FIELDS, "/v1/completions")
    prompt = payload.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if (
        not isinstance(prompts, list)
        or not prompts
        or not all(isinstance(p, str) for p in prompts)
        or len(prompts) > MAX_N
    ):
        raise bad_request(f"'prompt' must be a string or a list of 1 to {MAX_N} strings (token ids "
                          f"are not implemented), got {prompt!r:.100}", "prompt")
    top = _integer(payload, "logprobs", None, 0,
                   MAX_TOP_LOGPROBS) if payload.get("logprobs") is not None else None
    echo = echo_requested(payload, top is not None)
    requests = []
    for i, text in enumerate(prompts):
        where = "prompt" if isinstance(prompt, str) else f"prompt[{i}]"
        prompt_tokens = backend.count_text_tokens(text)
        if prompt_tokens == 0:
            raise bad_request(f"{where} is empty: the model needs at least one prompt token", where)
        requests.append(_request(payload, backend, prompt_tokens, where, "max_tokens", 16,
                                 messages=[], prompt=text, logprobs=top is not None,
                                 top_logprobs=top or 0, echo=echo))
    if sum(r.n for r in requests) > MAX_N:
        raise bad_request(f"{len(prompts)} prompts × n = {requests[0].n} choices: at most {MAX_N}",
                          "n")
    return requests


def _request(payload, backend: Backend, prompt_tokens: int, where: str, max_key: str, max_default,
             **fields) -> CompletionRequest:
    """The sampling fields both endpoints read, checked; max_tokens clamped to the room the prompt
    leaves."""
    stream, include_usage = _stream_options(payload)
    temperature = _number(payload, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(payload, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _integer(payload, "top_k", 0, -1, 2**31 - 1)       # vLLM's: -1 and 0 mean no top-k
    n = _integer(payload, "n", 1, 1, MAX_N)
    seed = _integer(payload, "seed", None, -2**63,
                    2**64 - 1) if payload.get("seed") is not None else None
    context = backend.max_context
    max_tokens = _integer(payload, max_key, max_default, 1, context) \
        if payload.get(max_key, max_default) is not None else None

    stop = payload.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise bad_request(f"'stop' must be a non-empty string or a list of at most "
                          f"{MAX_STOP_STRINGS} non-empty strings, "
                          f"got {payload.get('stop')!r:.200}", "stop")
    if prompt_tokens >= context:
        raise bad_request(f"the prompt has {prompt_tokens} tokens but the model's context is "
                           f"{context} tokens (and the reply needs at least one)", where,
                           "context_length_exceeded")
    room = context - prompt_tokens
    return CompletionRequest(n=n, temperature=temperature, top_p=top_p,
                             max_tokens=min(max_tokens or room, room), stop=stop, seed=seed,
                             prompt_tokens=prompt_tokens, stream=stream,
                             include_usage=include_usage, top_k=max(top_k, 0),
                             response_schema=response_schema(payload), penalties=parse_penalties(
                                 payload, getattr(backend, "vocab_size", None), _number), **fields)
