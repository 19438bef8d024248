"""What the HTTP server (minskill.serve.server) serves with: the backends, and the validation of a chat request.

A backend is any object with `name`, `max_context`, `count_prompt_tokens(messages)` and
`complete(requests) -> [[Choice, ...] per request]` (an entry may instead be an exception, which fails
that request only); one that also has `embedding_tokens(text)` and `embed(request)` serves /v1/embeddings
(minskill.serve.embeddings):

  * ModelBackend    a minskill Transformer + Tokenizer, batched through sampling.generate (optionally
                    with int8 weights: `from_spec(..., quantize="int8")`, see minskill.nn.quantize), or, with
                    prefix_cache_mb > 0 or scheduler="continuous", through the engine of minskill.serve.scheduler
                    (start / step / in_flight: the server's continuous loop); embeddings: mean-pooled final
                    hidden states;
  * ScriptedBackend fn(messages, request) -> str; puts a scripted model behind real HTTP in tests
                    (embeddings from an optional embed_fn(text) -> [float, ...]).

`parse_chat_request(payload, backend)` turns a decoded /v1/chat/completions body into a
CompletionRequest, `parse_completion_request` a legacy /v1/completions body into one per prompt string, or they
raise BackendError(400/404, ...) naming the field at fault (minskill.serve.fields: which fields are implemented,
ignored or refused). Roles: `developer` is read as `system` (OpenAI's newer name for it); an assistant turn's
`content` may be null or absent (an empty turn, as a client replays a reply); `tool_calls` and
`tool` turns go to the chat template (serve.tool_calls.tool_turn).

Tools and sampling controls. `tools` / `tool_choice` are read into .tool_use (serve.tool_calls: a
backend gets count_prompt_tokens(messages, tools=...) only with tools; each Choice's calls parsed
as its `tool_style` says), penalties and `logit_bias` into .penalties (serve.penalties, in the
engine); a legacy `echo` puts the prompt before each text (serve.bodies, serve.sse).

Log-probabilities. `logprobs: true` (chat) or `logprobs: k` (legacy) gives each reply token's log-probability,
and `top_logprobs: k` (chat; up to MAX_TOP_LOGPROBS) the k most likely tokens at each step: both from
sampling.generate, of the distribution the token was drawn from before top-k / top-p, log_softmax(logits / T)
(T = 0 counts as 1). A Choice carries them as TokenLogprobs for the reply's tokens (a stop token that ended the
reply is not one of them, nor one wholly after a stop string's cut); a token's bytes are its own (byte-level
BPE: part of a UTF-8 character too), its text those bytes decoded with U+FFFD for a partial character.
ScriptedBackend has none: such a request is a 400.

Chat template kwargs. `chat_template_kwargs` (an object, as vLLM and SGLang take it) may carry `enable_thinking`
(true, false or null): true renders a Qwen3 template's reply prompt without the empty `<think>` block, so the
model thinks (minskill.nn.tokenizer; default false, thinking off: unlike vLLM, whose default is the template's,
on). Other keys are ignored, as vLLM ignores the kwargs a template does not use; a template without
enable_thinking ignores it too. A backend gets it as `count_prompt_tokens(messages, enable_thinking=True)`
(passed only when true) and as `CompletionRequest.enable_thinking`.

Content parts. A message's `content` is a string or, as OpenAI's API also allows, a list of
{"type": "text", "text": ...} parts; the parts' texts are joined with "\n", as vLLM and TensorRT-LLM join
them, so that a prompt reaches the model the same here and behind those engines (OpenAI does not document
a separator). Any other part type (image_url, input_audio, file, refusal, ...) is a 400 naming
messages[i].content[k] and its type: these models read text only.

Streaming. A request with `on_text` set (the server sets it for "stream": true) gets its reply as it is
generated: on_text(choice_index, delta) is called on the scheduler thread. ModelBackend calls it per
decoded token (sampling.generate's on_token hook, through _TextStream); ScriptedBackend, which has no
tokens to wait for, word by word once fn has answered. Deltas always add up to a prefix of the final text;
what they held back (an incomplete UTF-8 character, the possible start of a stop string) the server sends
from the final Choice.

JSON replies. `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}}) and vLLM's `guided_json` / `structured_outputs` are read by serve.constrained into
CompletionRequest.response_schema; ModelBackend serves such a request through the engine, each sample
with a JsonConstraint that masks its logits at every step; ScriptedBackend refuses it (a 400).
"""
from __future__ import annotations

import collections
import re
import threading
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Protocol

import torch
from tokenizers.decoders import ByteLevel as ByteLevelDecoder

from minskill.nn.quantize import apply_quantization, weight_format
from minskill.nn.sampling import generate
from minskill.nn.weights import load_model
from minskill.serve.aligned import pad_single_rows
from minskill.serve.bodies import echo_requested
from minskill.serve.constrained import (BYTE_OF_CHAR, JsonConstraint, JsonFormat, response_schema,
                                        vocabulary_for)
from minskill.serve.embeddings import mean_pooled_embeddings
from minskill.serve.errors import BackendError, bad_request, check_body_and_model
from minskill.serve.fields import CHAT_FIELDS, COMPLETION_FIELDS, check_fields
from minskill.serve.penalties import Penalties, parse_penalties
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine, sequences_for
from minskill.serve.tool_calls import ToolUse, tool_turn, tool_use, with_tool_calls

MAX_N = 16                        # most choices one request may ask for
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20             # most alternatives per token (OpenAI's limit)
ROLES = ("system", "developer", "user", "assistant", "tool")
SCHEDULERS = ("static", "continuous")   # ModelBackend(scheduler=...), python -m minskill.serve --scheduler


# ---- what backends see and return -----------------------------------------------------------------
@dataclass
class CompletionRequest:
    """A validated chat request. max_tokens is already clamped to the room left in the context."""
    messages: list[dict]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    prompt_tokens: int = 0
    sample_index: int = 0         # ScriptedBackend sets it per call of fn (choice j of n)
    # set when the client has gone (it timed out or was killed): its reply would be lost, so stop working on it
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    stream: bool = False          # "stream": true: answered with server-sent events (minskill.serve.sse)
    enable_thinking: bool = False  # chat_template_kwargs.enable_thinking (module docstring)
    include_usage: bool = False   # stream_options.include_usage: a last chunk with the usage
    on_text: Callable[[int, str], None] | None = field(default=None, repr=False, compare=False)
    top_k: int = 0                # 0: no top-k restriction
    logprobs: bool = False        # give each reply token's log-prob (module docstring)
    top_logprobs: int = 0         # ... and the k most likely tokens at each step
    prompt: str | None = None     # a legacy /v1/completions prompt, sent as it is (messages then empty)
    response_schema: JsonFormat | None = None   # the JSON the reply must be (serve.constrained)
    tool_use: ToolUse | None = None     # the tools the model may call (serve.tool_calls)
    penalties: Penalties | None = None  # logit_bias and the penalties (serve.penalties); None: none
    echo: bool = False                  # legacy: the prompt comes back before each choice's text


@dataclass
class TokenLogprob:
    """One token of a reply: its text, its bytes, its log-prob, and the most likely tokens at its step."""
    token: str
    token_bytes: bytes
    logprob: float
    top: list["TokenLogprob"] = field(default_factory=list)


@dataclass
class Choice:
    text: str
    finish_reason: str            # "stop" | "length"
    completion_tokens: int        # generated tokens, counting the stop token that ended the reply
    reasoning: str | None = None  # sent as message.reasoning_content, as vLLM's --reasoning-parser does (scripted)
    logprobs: list[TokenLogprob] | None = None   # when the request asks for them
    tool_calls: list[dict] | None = None  # the calls parsed out of the reply (serve.tool_calls)


class Backend(Protocol):
    name: str
    max_context: int

    def count_prompt_tokens(self, messages: list[dict], enable_thinking: bool = False,
                            tools: list[dict] | None = None) -> int: ...

    def count_text_tokens(self, prompt: str) -> int: ...   # a legacy /v1/completions prompt

    def complete(self, requests: list[CompletionRequest]) -> list[list[Choice]]: ...


class ClientGone(Exception):
    """The client closed its connection before its reply was ready (minskill.serve.server, minskill.serve.sse)."""


class ScriptedBackend:
    """A backend whose replies come from `fn(messages, request) -> str`, called once per choice.

    Tokens are whitespace-separated words: prompt_tokens = words in all message contents,
    completion_tokens = words in the reply. A reply is cut at the first stop string
    (finish_reason "stop") and after max_tokens words (finish_reason "length").
    `request.sample_index` tells fn which of the n choices it is producing; a legacy /v1/completions prompt
    reaches fn as one user message (request.prompt holds it too). fn may return (reasoning, text):
    the reply then carries the reasoning apart, as `message.reasoning_content` (a reasoning model behind vLLM
    with --reasoning-parser; not streamed), uncounted.
    With `embed_fn(text) -> [float, ...]` it serves /v1/embeddings too (vectors as fn gives them);
    without, /v1/embeddings answers 400.
    """

    tool_style = "hermes"      # its tool calls: <tool_call>{...}</tool_call> (serve.tool_calls)

    def __init__(self, fn: Callable[[list[dict], CompletionRequest], str], name: str = "scripted",
                 max_context: int = 4096, embed_fn: Callable[[str], list[float]] | None = None):
        self.fn, self.name, self.max_context, self.embed_fn = fn, name, max_context, embed_fn

    def count_prompt_tokens(self, messages, enable_thinking: bool = False, tools=None):
        return sum(len(message["content"].split()) for message in messages)

    def count_text_tokens(self, prompt: str) -> int:
        return len(prompt.split())

    def _choice(self, reply, request) -> Choice:
        reasoning, text = reply if isinstance(reply, tuple) and len(reply) == 2 else (None, reply)
        if not isinstance(text, str) or not isinstance(reasoning, str | None):
            raise TypeError(f"scripted fn returned {type(reply).__name__}, expected str or (reasoning, text)")
        cuts = [text.find(stop) for stop in request.stop if stop in text]
        if cuts:
            text = text[:min(cuts)]
        words = text.split()
        if len(words) > request.max_tokens:
            return Choice(" ".join(words[:request.max_tokens]), "length", request.max_tokens, reasoning)
        return with_tool_calls(Choice(text, "stop", len(words), reasoning), request.tool_use,
                               self.tool_style)

    def complete(self, requests):
        results = []
        for request in requests:
            if request.logprobs:
                results.append(BackendError(400, f"the model {self.name!r} (a ScriptedBackend) has no "
                                                 "log-probabilities", "invalid_request_error", None, "logprobs"))
                continue
            if request.penalties is not None or request.response_schema is not None:
                field = (request.response_schema or request.penalties).field
                message = f"'{field}': the model {self.name!r} (a ScriptedBackend) cannot " \
                          "constrain or penalize its replies"
                results.append(BackendError(400, message, "invalid_request_error",
                                            "unsupported_field", field))
                continue
            try:
                messages = request.messages if request.prompt is None else \
                    [{"role": "user", "content": request.prompt}]   # a legacy prompt: as one user turn
                choices = [self._choice(self.fn(messages, replace(request, sample_index=j)), request)
                           for j in range(request.n)]
            except Exception as error:  # one failing script fails its own request, not the batch
                results.append(error)
                continue
            for j, choice in enumerate(choices):
                for piece in re.findall(r"\s*\S+|\s+$", choice.text) if request.on_text else ():
                    request.on_text(j, piece)       # word by word: what a streaming client sees
            results.append(choices)
        return results

    def embedding_tokens(self, text: str) -> list[str]:
        if self.embed_fn is None:
            raise BackendError(400, f"the model {self.name!r} serves no embeddings (a ScriptedBackend needs an "
                                    f"embed_fn for /v1/embeddings)", "invalid_request_error",
                               "embeddings_not_supported", "model")
        return text.split()

    def embed(self, request) -> list[list[float]]:
        return [[float(x) for x in self.embed_fn(text)] for text in request.texts]


class ModelBackend:
    """A minskill Transformer + Tokenizer; a batch is served by sampling.generate (one call per n)."""

    def __init__(self, model, tokenizer, name: str = "minskill", prefix_cache_mb: float = 0,
                 scheduler: str = "static", batch_invariant: bool = False):
        """prefix_cache_mb > 0: prompt prefixes' keys/values are kept (minskill.serve.prefix_cache), up to that
        many MB; scheduler "continuous": the server lets requests join and leave the running batch at each
        decoding step (minskill.serve.scheduler). With both off (0, "static") a batch is one sampling.generate
        call per n, as before. batch_invariant: a request's tokens do not depend on which requests
        share its batch (minskill.serve.aligned; always through the engine)."""
        if scheduler not in SCHEDULERS or not prefix_cache_mb >= 0:
            raise ValueError(f"ModelBackend: scheduler must be one of {SCHEDULERS} and prefix_cache_mb >= 0, got "
                             f"{scheduler!r}, {prefix_cache_mb!r}")
        self.model, self.tokenizer, self.name, self.scheduler = model, tokenizer, name, scheduler
        self.max_context = int(model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        # how its replies write tool calls (serve.tool_calls): as its chat template asks
        self.tool_style = "llama3_json" if tokenizer.chat_format == "llama3" else "hermes"
        self.prefix_cache = PrefixCache(prefix_cache_mb) if prefix_cache_mb > 0 else None
        self.batch_invariant = batch_invariant
        if batch_invariant:
            pad_single_rows(model)
        self.engine = Engine(model, tokenizer, None, tokenizer.pad_token_id, self.prefix_cache,
                             batch_invariant=batch_invariant)
        self._owners: dict[int, Callable] = {}     # id(sequence) in the engine -> its request's answer()

    @classmethod
    def from_spec(cls, spec: str, dtype=None, device=None, name: str | None = None,
                  quantize: str | None = None, prefix_cache_mb: float = 0,
                  scheduler: str = "static", batch_invariant: bool = False):
        """Load `spec`; quantize="int8" / "int4" serves it with int8 / int4 weights (minskill.nn.quantize)."""
        model, tokenizer = load_model(spec, dtype=dtype, device=device)
        model.eval()
        apply_quantization(model, quantize)
        # a quantized model answers differently: its default name says so (clients, caches and reports see it)
        suffix = f"-{weight_format(model)}" if weight_format(model) else ""
        return cls(model, tokenizer, name or (Path(str(spec).rstrip("/")).name or str(spec)) + suffix,
                   prefix_cache_mb=prefix_cache_mb, scheduler=scheduler,
                   batch_invariant=batch_invariant)

    # ---- the engine (minskill.serve.scheduler): used when the prefix cache or continuous batching is on
    def start(self, request: CompletionRequest, on_done: Callable[[list], None]):
        """Let `request` join the engine's running batch; on_done(choices) once its n samples have ended (or
        on_done(error) once, from fail_all)."""
        hook, ended, answered = self._streams([request], request.n), {}, []

        def answer(result):
            if not answered:
                answered.append(True)
                on_done(result)

        def sample_done(j: int, sequence):
            self._owners.pop(id(sequence), None)
            ended[j] = sequence.sample(self.engine.stop_token_ids, self.tokenizer)
            if len(ended) == request.n:
                answer([self._choice(ended[k], request) for k in range(request.n)])
        sequences = sequences_for(
            self._prompt(request), request.n, request.seed, max_new_tokens=request.max_tokens,
            temperature=request.temperature, top_k=request.top_k, top_p=request.top_p,
            stop_strings=tuple(request.stop), top_logprobs=request.top_logprobs,
            should_stop=request.cancelled.is_set, penalties=request.penalties)
        for j, sequence in enumerate(sequences):
            if request.response_schema is not None:   # each sample its own state (constrained)
                sequence.constraint = JsonConstraint(request.response_schema.node, vocabulary_for(
                    self.tokenizer, int(self.model.config.vocab_size)))
            sequence.on_done = partial(sample_done, j)
            sequence.on_token = None if hook is None else partial(hook, j)
            self._owners[id(sequence)] = answer
        try:
            with torch.inference_mode():
                self.engine.add(sequences)
        except BaseException:
            for sequence in sequences:
                self._owners.pop(id(sequence), None)
            raise

    def step(self):
        with torch.inference_mode():
            self.engine.step()

    def in_flight(self) -> int:
        """Samples in the engine's running batch."""
        return len(self.engine.rows)

    def fail_all(self, error: BaseException):
        """The engine failed: every request in it gets `error` (once), the running batch is emptied."""
        rows, self.engine.rows, self.engine.cache, self.engine.logits = self.engine.rows, [], None, None
        for sequence in rows:
            answer = self._owners.pop(id(sequence), None)
            if answer is not None:
                answer(error)

    def _complete_with_engine(self, requests):
        results: list = [None] * len(requests)
        for i, request in enumerate(requests):
            self.start(request, partial(results.__setitem__, i))
        try:
            while self.engine.rows:
                self.step()
        except BaseException as error:
            self.fail_all(error)
            raise
        return results

    def _choice(self, sample, request) -> Choice:
        choice = Choice(sample.text, sample.finish_reason, len(sample.token_ids),
                        logprobs=self._logprobs(sample) if request.logprobs else None)
        return with_tool_calls(choice, request.tool_use, self.tool_style)

    def count_prompt_tokens(self, messages, enable_thinking: bool = False, tools=None):
        return len(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                      enable_thinking=enable_thinking, tools=tools))

    def count_text_tokens(self, prompt: str) -> int:
        return len(self._text_prompt(prompt))

    def _text_prompt(self, prompt: str) -> list[int]:
        """A legacy prompt's tokens as HF and vLLM encode it: special-token text as its ids, and what the
        tokenizer's post-processor adds (Llama 3's BOS)."""
        return self.tokenizer.backend.encode(prompt, add_special_tokens=True).ids

    def _prompt(self, request: CompletionRequest) -> list[int]:
        if request.prompt is not None:
            return self._text_prompt(request.prompt)
        return self.tokenizer.apply_chat_template(
            request.messages, enable_thinking=request.enable_thinking,
            tools=request.tool_use.tools if request.tool_use else None)

    def embedding_tokens(self, text: str) -> list[int]:
        """The text's tokens as plain characters (no chat template, no BOS): what its embedding pools."""
        return self.tokenizer.encode(text, special_tokens=False)

    def embed(self, request) -> torch.Tensor:
        with torch.inference_mode():
            return mean_pooled_embeddings(self.model, request.tokens, pad_id=self.tokenizer.pad_token_id,
                                          should_stop=request.cancelled.is_set)

    def _streams(self, group: list[CompletionRequest], n: int):
        """generate's on_token hook feeding each streaming request's _TextStreams (None: nobody streams)."""
        if not any(r.on_text for r in group):
            return None
        streams = [[_TextStream(self.tokenizer, r.stop, partial(r.on_text, j)) if r.on_text else None
                    for j in range(n)] for r in group]

        def on_token(row: int, token: int):   # rows are prompt-major: row = k * n + j
            stream = streams[row // n][row % n]
            if stream is not None:
                stream.push(token)
        return on_token

    def complete(self, requests):
        if self.prefix_cache is not None or self.scheduler != "static" or self.batch_invariant or \
                any(r.response_schema or r.penalties for r in requests):   # (engine only)
            return self._complete_with_engine(requests)
        results: list = [None] * len(requests)
        by_n = collections.defaultdict(list)   # generate takes one n per call
        for i, request in enumerate(requests):
            by_n[request.n].append(i)
        with torch.inference_mode():
            for n, indices in by_n.items():
                group = [requests[i] for i in indices]
                samples = generate(
                    self.model, [self._prompt(r) for r in group], n=n,
                    should_stop=lambda k, group=group: group[k].cancelled.is_set(),
                    max_new_tokens=[r.max_tokens for r in group], temperature=[r.temperature for r in group],
                    top_p=[r.top_p for r in group], top_k=[r.top_k for r in group],
                    stop_strings=[list(r.stop) for r in group],
                    seed=[r.seed for r in group], stop_token_ids=self.tokenizer.stop_token_ids,
                    tokenizer=self.tokenizer, pad_id=self.tokenizer.pad_token_id,
                    on_token=self._streams(group, n), top_logprobs=[r.top_logprobs for r in group])
                for k, i in enumerate(indices):  # samples are prompt-major: prompt k owns k*n .. k*n+n-1
                    results[i] = [self._choice(s, group[k]) for s in samples[k * n:(k + 1) * n]]
        return results

    def _logprobs(self, sample) -> list[TokenLogprob]:
        """The sample's tokens with their log-probs and alternatives, less a stop token that ended it, or the
        tokens wholly after the cut of a stop string that ended it (kept: the fewest tokens whose text starts
        with the reply's, as a token may hold part of a character)."""
        ids, added = sample.token_ids, self.tokenizer.backend.get_added_tokens_decoder()
        top = sample.top_logprobs or [[] for _ in ids]
        tokens = [TokenLogprob(*self._piece(t, added), lp,
                               [TokenLogprob(*self._piece(a, added), alp) for a, alp in alts])
                  for t, lp, alts in zip(ids, sample.logprobs, top)]
        if sample.finish_reason != "stop":
            return tokens
        if ids[-1] in self.tokenizer.stop_token_ids:
            return tokens[:-1]
        kept = len(tokens)   # ended by a stop string: drop the tokens the text does not need
        while kept and self.tokenizer.decode(ids[:kept - 1]).startswith(sample.text):
            kept -= 1
        return tokens[:kept]

    def _piece(self, token: int, added_tokens: dict) -> tuple[str, bytes]:
        """(text, bytes) of one token: byte-level BPE's vocabulary entry mapped back to its bytes (part of a
        UTF-8 character, maybe), an added token's own text; another tokenizer's decoded text."""
        backend = self.tokenizer.backend
        added = added_tokens.get(token)
        if added is not None or not isinstance(backend.decoder, ByteLevelDecoder):
            raw = (added.content if added is not None else self.tokenizer.decode([token])).encode()
        else:
            raw = bytes(BYTE_OF_CHAR[c] for c in backend.id_to_token(token))
        return raw.decode("utf-8", "replace"), raw



class _TextStream:
    """One choice's reply as text deltas while it is generated. Pieces of a byte-level BPE are not
    text alone, so each token's text is read from a decode in context; a delta is sent only where it
    cannot change any more: not an incomplete UTF-8 character at the end (decoded as U+FFFD), not an
    end that could be the start of a stop string, nothing from a stop string or a stop token on. So
    the deltas add up to a prefix of the final Choice.text, which the server completes.

    A token costs the text it adds, not the whole reply (as the engine's stop check,
    sampling.stop_string_ended): once the text ends in a whole character no later byte changes it
    (`final`, `final_text`), and a new token's text is decode(tokens[anchor:]) after
    decode(tokens[anchor:final]), the anchor one token before `final` (a decoder may write a token's
    leading space only after another token); where that is no prefix, the reply is decoded whole."""

    def __init__(self, tokenizer, stop: list[str], emit: Callable[[str], None]):
        self.tokenizer, self.stop, self.emit = tokenizer, stop, emit
        self.stop_ids = set(tokenizer.stop_token_ids)
        self.longest = max((len(s) for s in stop), default=0)
        self.tokens: list[int] = []
        self.sent, self.closed = 0, False
        self.final, self.final_text = 0, ""     # tokens whose text is settled, and that text

    def push(self, token: int):
        if self.closed:
            return
        if token in self.stop_ids:
            self.closed = True
            return
        self.tokens.append(token)
        settled, text = len(self.final_text), self._text()
        if not text.endswith("\ufffd"):
            self.final, self.final_text = len(self.tokens), text
        # a stop string wholly in the settled text was found by an earlier push: look near its end
        lo = max(0, settled - self.longest)
        cuts = [i for i in (text.find(s, lo) for s in self.stop) if i >= 0]
        if cuts:
            text, self.closed = text[:min(cuts)], True
        else:
            held = max((k for s in self.stop for k in range(1, min(len(s) - 1, len(text)) + 1)
                        if s.startswith(text[-k:])), default=0)
            text = text[:len(text) - held].rstrip("\ufffd")
        if len(text) > self.sent:
            self.emit(text[self.sent:])
            self.sent = len(text)

    def _text(self) -> str:
        """decode(self.tokens), decoding only the tokens after `final` and one before it."""
        anchor = max(self.final - 1, 0)
        before = self.tokenizer.decode(self.tokens[anchor:self.final])
        after = self.tokenizer.decode(self.tokens[anchor:])
        if not after.startswith(before):
            return self.tokenizer.decode(self.tokens)
        return self.final_text + after[len(before):]


# ---- request validation ---------------------------------------------------------------------------
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
    """A message's content: a string, or a list of text parts joined with "\n" (see the module docstring)."""
    where = f"messages[{i}].content"
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text parts, got {type(content).__name__}", where)
    if not content:
        raise bad_request(f"{where} is an empty list: give a string or at least one text part", where)
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad_request(f"{where}[{k}] must be an object {{'type': 'text', 'text': ...}}, got "
                               f"{type(part).__name__}", f"{where}[{k}]")
        if part.get("type") != "text":
            raise bad_request(f"{where}[{k}] has type {part.get('type')!r}: this server reads text parts only "
                               f"({{'type': 'text', 'text': ...}})", f"{where}[{k}]", "unsupported_content_type")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{k}].text must be a string, got {type(part.get('text')).__name__}",
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
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(options, dict):
        raise bad_request(f"'stream_options' must be an object, got {type(options).__name__}", "stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request(f"'stream_options.include_usage' must be true or false, got {include_usage!r:.100}",
                           "stream_options.include_usage")
    for key, value in options.items():   # include_obfuscation only pads chunks: ignored; vLLM's per-chunk usage: no
        if key not in ("include_usage", "include_obfuscation") and value not in (None, False):
            raise bad_request(f"'stream_options.{key}' = {value!r:.100} is not implemented by this server "
                              f"(it reads include_usage)", f"stream_options.{key}", "unsupported_field")
    return True, bool(include_usage)


def _enable_thinking(payload) -> bool:
    """chat_template_kwargs.enable_thinking (module docstring): an object's boolean, other keys ignored."""
    kwargs = payload.get("chat_template_kwargs")
    if kwargs is None:
        return False
    if not isinstance(kwargs, dict):
        raise bad_request(f"'chat_template_kwargs' must be an object, got {type(kwargs).__name__}",
                          "chat_template_kwargs")
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request(f"'chat_template_kwargs.enable_thinking' must be true or false, got {thinking!r:.100}",
                          "chat_template_kwargs.enable_thinking")
    return bool(thinking)


def _messages(payload) -> list[dict]:
    """The chat's messages as {"role", "content": str, ...tool keys}: developer as system, an
    assistant's null content as ""."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {'role', 'content'} objects", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"messages[{i}] must be an object, got {type(message).__name__}", f"messages[{i}]")
        role, tool_keys = message.get("role"), tool_turn(message, i)
        if role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                              f"messages[{i}].role")
        content = message.get("content")
        if content is None and role == "assistant":   # a reply replayed as the client got it (tool_calls aside)
            content = ""
        elif content is None:
            raise bad_request(f"messages[{i}].content must be a string or a list of text parts, got "
                              f"{'null' if 'content' in message else 'nothing'}", f"messages[{i}].content")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content_text(content, i), **tool_keys})
    return out


def _chat_logprobs(payload) -> tuple[bool, int]:
    """(logprobs, top_logprobs) of a chat request: a boolean, and 0..MAX_TOP_LOGPROBS only with logprobs true."""
    logprobs = payload.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request(f"'logprobs' must be true or false, got {logprobs!r:.100}", "logprobs")
    top = _integer(payload, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return bool(logprobs), top


def parse_chat_request(payload, backend: Backend) -> CompletionRequest:
    """Validate a decoded /v1/chat/completions body; raise BackendError(400, ...) naming the problem."""
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
    """Validate a legacy /v1/completions body: one CompletionRequest per prompt string (served in one batch;
    choice i * n + j of the reply is sample j of prompt i). max_tokens defaults to 16, as OpenAI's and vLLM's."""
    check_body_and_model(payload, backend)
    check_fields(payload, COMPLETION_FIELDS, "/v1/completions")
    prompt = payload.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts) \
            or len(prompts) > MAX_N:
        raise bad_request(f"'prompt' must be a string or a list of 1 to {MAX_N} strings (token ids are not "
                          f"implemented), got {prompt!r:.100}", "prompt")
    top = _integer(payload, "logprobs", None, 0, MAX_TOP_LOGPROBS) if payload.get("logprobs") is not None else None
    echo = echo_requested(payload, top is not None)
    requests = []
    for i, text in enumerate(prompts):
        where = "prompt" if isinstance(prompt, str) else f"prompt[{i}]"
        prompt_tokens = backend.count_text_tokens(text)
        if prompt_tokens == 0:
            raise bad_request(f"{where} is empty: the model needs at least one prompt token", where)
        requests.append(_request(payload, backend, prompt_tokens, where, "max_tokens", 16, messages=[],
                                 prompt=text, logprobs=top is not None, top_logprobs=top or 0,
                                 echo=echo))
    if sum(r.n for r in requests) > MAX_N:
        raise bad_request(f"{len(prompts)} prompts × n = {requests[0].n} choices: at most {MAX_N}", "n")
    return requests


def _request(payload, backend: Backend, prompt_tokens: int, where: str, max_key: str, max_default,
             **fields) -> CompletionRequest:
    """The sampling fields both endpoints read, checked; max_tokens clamped to the room the prompt leaves."""
    stream, include_usage = _stream_options(payload)
    temperature = _number(payload, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(payload, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _integer(payload, "top_k", 0, -1, 2**31 - 1)       # vLLM's: -1 and 0 mean no top-k
    n = _integer(payload, "n", 1, 1, MAX_N)
    seed = _integer(payload, "seed", None, -2**63, 2**64 - 1) if payload.get("seed") is not None else None
    context = backend.max_context
    max_tokens = _integer(payload, max_key, max_default, 1, context) \
        if payload.get(max_key, max_default) is not None else None

    stop = payload.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise bad_request(f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} "
                           f"non-empty strings, got {payload.get('stop')!r:.200}", "stop")
    if prompt_tokens >= context:
        raise bad_request(f"the prompt has {prompt_tokens} tokens but the model's context is {context} tokens "
                           f"(and the reply needs at least one)", where, "context_length_exceeded")
    room = context - prompt_tokens
    return CompletionRequest(n=n, temperature=temperature, top_p=top_p, max_tokens=min(max_tokens or room, room),
                             stop=stop, seed=seed, prompt_tokens=prompt_tokens, stream=stream,
                             include_usage=include_usage, top_k=max(top_k, 0),
                             response_schema=response_schema(payload),
                             penalties=parse_penalties(
                                 payload, getattr(backend, "vocab_size", None), _number), **fields)
