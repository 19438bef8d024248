"""What the HTTP server (minskill.serve.server) serves with: the backends (a request body
is read into their CompletionRequest by minskill.serve.request_parsing).

A backend is any object with `name`, `max_context`, `count_prompt_tokens(messages)` and
`complete(requests) -> [[Choice, ...] per request]` (an entry may instead be an exception, which
fails that request only); one that also has `embedding_tokens(text)` and `embed(request)` serves
/v1/embeddings (minskill.serve.embeddings):

  * ModelBackend    a minskill Transformer + Tokenizer, batched through sampling.generate
                    (optionally with int8 weights: `from_spec(..., quantize="int8")`, see
                    minskill.nn.quantize), or, with prefix_cache_mb > 0 or scheduler="continuous",
                    through the engine of minskill.serve.scheduler (start / step / in_flight: the
                    server's continuous loop); embeddings: mean-pooled final hidden states;
  * ScriptedBackend fn(messages, request) -> str; puts a scripted model behind real HTTP in tests
                    (embeddings from an optional embed_fn(text) -> [float, ...]).

Log-probabilities. `logprobs: true` (chat) or `logprobs: k` (legacy) gives each reply token's
log-probability, and `top_logprobs: k` (chat; up to MAX_TOP_LOGPROBS) the k most likely tokens at
each step: both from sampling.generate, of the distribution the token was drawn from before top-k /
top-p, log_softmax(logits / T) (T = 0 counts as 1). A Choice carries them as TokenLogprobs for the
reply's tokens (a stop token that ended the reply is not one of them, nor one wholly after a stop
string's cut); a token's bytes are its own (byte-level BPE: part of a UTF-8 character too), its
text those bytes decoded with U+FFFD for a partial character. ScriptedBackend has none: such a
request is a 400.

Streaming. A request with `on_text` set (the server sets it for "stream": true) gets its reply as
it is generated: on_text(choice_index, delta) is called on the scheduler thread. ModelBackend calls
it per decoded token (sampling.generate's on_token hook, through _TextStream); ScriptedBackend,
which has no tokens to wait for, word by word once fn has answered. Deltas always add up to a
prefix of the final text; what they held back (an incomplete UTF-8 character, the possible start of
a stop string) the server sends from the final Choice.

JSON replies. `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}}) and vLLM's `guided_json` / `structured_outputs` are read by serve.constrained into
CompletionRequest.response_schema; ModelBackend serves such a request through the engine, each
sample with a JsonConstraint that masks its logits at every step; ScriptedBackend refuses it (a
400). """
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
from minskill.serve.constrained import BYTE_OF_CHAR, JsonConstraint, JsonFormat, vocabulary_for
from minskill.serve.embeddings import mean_pooled_embeddings
from minskill.serve.errors import BackendError
from minskill.serve.penalties import Penalties
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine, sequences_for
from minskill.serve.tool_calls import ToolUse, with_tool_calls

MAX_N = 16                        # most choices one request may ask for
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20             # most alternatives per token (OpenAI's limit)
ROLES = ("system", "developer", "user", "assistant", "tool")
SCHEDULERS = ("static", "continuous")   # ModelBackend(scheduler=...), python -m minskill.serve
                                        # --scheduler


# ---- what backends see and return ----------------------------------------------------------------
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
    # set when the client has gone (it timed out or was killed): its reply would be lost, so stop
    # working on it
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    stream: bool = False          # "stream": true: answered with server-sent events
                                  # (minskill.serve.sse)
    enable_thinking: bool = False  # chat_template_kwargs.enable_thinking (module docstring)
    include_usage: bool = False   # stream_options.include_usage: a last chunk with the usage
    on_text: Callable[[int, str], None] | None = field(default=None, repr=False, compare=False)
    top_k: int = 0                # 0: no top-k restriction
    logprobs: bool = False        # give each reply token's log-prob (module docstring)
    top_logprobs: int = 0         # ... and the k most likely tokens at each step
    prompt: str | None = None     # a legacy /v1/completions prompt, sent as it is (messages then
                                  # empty)
    response_schema: JsonFormat | None = None   # the JSON the reply must be (serve.constrained)
    tool_use: ToolUse | None = None     # the tools the model may call (serve.tool_calls)
    penalties: Penalties | None = None  # logit_bias and the penalties (serve.penalties); None: none
    echo: bool = False                  # legacy: the prompt comes back before each choice's text


@dataclass
class TokenLogprob:
    """One token of a reply: its text, its bytes, its log-prob, and the most likely tokens at its
    step."""
    token: str
    token_bytes: bytes
    logprob: float
    top: list["TokenLogprob"] = field(default_factory=list)


@dataclass
class Choice:
    text: str
    finish_reason: str            # "stop" | "length"
    completion_tokens: int        # generated tokens, counting the stop token that ended the reply
    reasoning: str | None = None  # sent as message.reasoning_content, as vLLM's --reasoning-parser
                                  # does (scripted)
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
    """The client closed its connection before its reply was ready (minskill.serve.server,
    minskill.serve.sse)."""


class ScriptedBackend:
    """A backend whose replies come from `fn(messages, request) -> str`, called once per choice.

    Tokens are whitespace-separated words: prompt_tokens = words in all message contents,
    completion_tokens = words in the reply. A reply is cut at the first stop string
    (finish_reason "stop") and after max_tokens words (finish_reason "length").
    `request.sample_index` tells fn which of the n choices it is producing; a legacy
    /v1/completions prompt reaches fn as one user message (request.prompt holds it too). fn may
    return (reasoning, text):
    the reply then carries the reasoning apart, as `message.reasoning_content` (a reasoning model
    behind vLLM with --reasoning-parser; not streamed), uncounted.
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
            raise TypeError(f"scripted fn returned {type(reply).__name__}, expected str or "
                            f"(reasoning, text)")
        cuts = [text.find(stop) for stop in request.stop if stop in text]
        if cuts:
            text = text[:min(cuts)]
        words = text.split()
        if len(words) > request.max_tokens:
            return Choice(" ".join(words[:request.max_tokens]), "length", request.max_tokens,
                          reasoning)
        return with_tool_calls(Choice(text, "stop", len(words), reasoning), request.tool_use,
                               self.tool_style)

    def complete(self, requests):
        results = []
        for request in requests:
            if request.logprobs:
                results.append(BackendError(400, f"the model {self.name!r} (a ScriptedBackend) has "
                                                 f"no "
                                                 "log-probabilities", "invalid_request_error",
                                                 None, "logprobs"))
                continue
            if request.penalties is not None or request.response_schema is not None:
                field = (request.response_schema or request.penalties).field
                message = f"'{field}': the model {self.name!r} (a ScriptedBackend) cannot " \
                          "constrain or penalize its replies"
                results.append(
                    BackendError(400, message, "invalid_request_error", "unsupported_field", field)
                )
                continue
            try:
                messages = request.messages if request.prompt is None else \
                    [{"role": "user", "content": request.prompt}]   # a legacy prompt: as one user
                # turn
                choices = [
                    self._choice(self.fn(messages, replace(request, sample_index=j)), request)
                    for j in range(request.n)
                ]
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
            raise BackendError(400, f"the model {self.name!r} serves no embeddings (a "
                                    f"ScriptedBackend needs an embed_fn for /v1/embeddings)",
                                    "invalid_request_error",
                               "embeddings_not_supported", "model")
        return text.split()

    def embed(self, request) -> list[list[float]]:
        return [[float(x) for x in self.embed_fn(text)] for text in request.texts]


class ModelBackend:
    """A minskill Transformer + Tokenizer; a batch is served by sampling.generate (one call per
    n)."""

    def __init__(self, model, tokenizer, name: str = "minskill", prefix_cache_mb: float = 0,
                 scheduler: str = "static", batch_invariant: bool = False,
                 c_kernels: bool = False):
        """prefix_cache_mb > 0: prompt prefixes' keys/values are kept
        (minskill.serve.prefix_cache), up to that many MB; scheduler "continuous": the server lets
        requests join and leave the running batch at each decoding step (minskill.serve.scheduler).
        With both off (0, "static") a batch is one sampling.generate call per n, as before.
        batch_invariant: a request's tokens do not depend on which requests share its batch
        (minskill.serve.aligned; always through the engine). c_kernels: the decoding step's
        small ops in C (minskill.serve.c_decode), where they cover the model."""
        if scheduler not in SCHEDULERS or not prefix_cache_mb >= 0:
            raise ValueError(f"ModelBackend: scheduler must be one of {SCHEDULERS} and "
                             f"prefix_cache_mb >= 0, got {scheduler!r}, {prefix_cache_mb!r}")
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
                             batch_invariant=batch_invariant, c_kernels=c_kernels)
        self._owners: dict[int, Callable] = {}     # id(sequence) in the engine -> its request's
        # answer()

    @classmethod
    def from_spec(cls, spec: str, dtype=None, device=None, name: str | None = None,
                  quantize: str | None = None, prefix_cache_mb: float = 0,
                  scheduler: str = "static", batch_invariant: bool = False,
                  c_kernels: bool = False):
        """Load `spec`; quantize="int8" / "int4" serves it with int8 / int4 weights
        (minskill.nn.quantize)."""
        model, tokenizer = load_model(spec, dtype=dtype, device=device)
        model.eval()
        apply_quantization(model, quantize)
        # a quantized model answers differently: its default name says so (clients, caches and
        # reports see it)
        suffix = f"-{weight_format(model)}" if weight_format(model) else ""
        return cls(model, tokenizer, name or (Path(str(spec).rstrip("/")).name or str(spec))
                   + suffix, prefix_cache_mb=prefix_cache_mb, scheduler=scheduler,
                   batch_invariant=batch_invariant, c_kernels=c_kernels)

    # ---- the engine (minskill.serve.scheduler): used when the prefix cache or continuous batching
    # is on
    def start(self, request: CompletionRequest, on_done: Callable[[list], None]):
        """Let `request` join the engine's running batch; on_done(choices) once its n samples have
        ended (or on_done(error) once, from fail_all)."""
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
        """The engine failed: every request in it gets `error` (once), the running batch is
        emptied."""
        rows, self.engine.rows, self.engine.cache, self.engine.logits = self.engine.rows, [
                ], None, None
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
        """A legacy prompt's tokens as HF and vLLM encode it: special-token text as its ids, and
        what the tokenizer's post-processor adds (Llama 3's BOS)."""
        return self.tokenizer.backend.encode(prompt, add_special_tokens=True).ids

    def _prompt(self, request: CompletionRequest) -> list[int]:
        if request.prompt is not None:
            return self._text_prompt(request.prompt)
        return self.tokenizer.apply_chat_template(
            request.messages, enable_thinking=request.enable_thinking,
            tools=request.tool_use.tools if request.tool_use else None)

    def embedding_tokens(self, text: str) -> list[int]:
        """The text's tokens as plain characters (no chat template, no BOS): what its embedding
        pools."""
        return self.tokenizer.encode(text, special_tokens=False)

    def embed(self, request) -> torch.Tensor:
        with torch.inference_mode():
            return mean_pooled_embeddings(self.model, request.tokens,
                                          pad_id=self.tokenizer.pad_token_id,
                                          should_stop=request.cancelled.is_set)

    def _streams(self, group: list[CompletionRequest], n: int):
        """generate's on_token hook feeding each streaming request's _TextStreams (None: nobody
        streams)."""
        if not any(r.on_text for r in group):
            return None
        streams = [
            [
                _TextStream(self.tokenizer, r.stop, partial(r.on_text, j)) if r.on_text else None
                for j in range(n)
            ]
            for r in group
        ]

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
                    max_new_tokens=[r.max_tokens for r in group],
                    temperature=[r.temperature for r in group], top_p=[r.top_p for r in group],
                    top_k=[r.top_k for r in group], stop_strings=[list(r.stop) for r in group],
                    seed=[r.seed for r in group], stop_token_ids=self.tokenizer.stop_token_ids,
                    tokenizer=self.tokenizer, pad_id=self.tokenizer.pad_token_id,
                    on_token=self._streams(group, n), top_logprobs=[r.top_logprobs for r in group])
                for k, i in enumerate(indices):  # samples are prompt-major: prompt k owns k*n ..
                                                 # k*n+n-1
                    results[i] = [self._choice(s, group[k]) for s in samples[k * n:(k + 1) * n]]
        return results

    def _logprobs(self, sample) -> list[TokenLogprob]:
        """The sample's tokens with their log-probs and alternatives, less a stop token that ended
        it, or the tokens wholly after the cut of a stop string that ended it (kept: the fewest
        tokens whose text starts with the reply's, as a token may hold part of a character)."""
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
        """(text, bytes) of one token: byte-level BPE's vocabulary entry mapped back to its bytes
        (part of a UTF-8 character, maybe), an added token's own text; another tokenizer's decoded
        text."""
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
