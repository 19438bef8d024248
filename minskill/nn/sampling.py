"""Batched generation with a KV cache, and per-token log-probabilities of given completions.

    python -m minskill.nn.sampling --model smollm2-135m --prompt "What is 2+2?"    (a chat)

generate(): every prompt is prefilled once, its cache repeated for its n samples, then all samples
decode one token a step; T > 0 draws from softmax(logits / T) restricted to top_k then top_p.
completion_logprobs(): log p(c_t | prompt, c_<t) / T of given completions, differentiable.
In full, with the sampling rule's equations: docs/model.md, "sampling.py in full".

Decisions:
1. The reported log-prob of a token is the unrestricted log_softmax(logits / T)[token] (T = 0
   counts as 1): exactly what completion_logprobs() recomputes for training.
2. Each sample draws from its own seeded torch.Generator: a seeded request gives the same tokens
   whatever else shares the batch.
3. The host looks at the tokens once every `sync_every` tokens (1 on the CPU); the tokens are the
   same for any sync_every.
4. completion_logprobs computes logits at completion positions only, in recomputed chunks: the
   full (B, T, V) float32 logits never exist.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from minskill.nn.compiled_decode import StaticDecoder
from minskill.nn.weights import load_model

SYNC_EVERY = 8              # decoding steps between two looks at the host on a GPU (a finished
                            # sample wastes < 8)
_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: sample j of seed s gets seed s * MIX + j
                                # (mod 2^63)


@dataclass
class Sample:
    prompt_index: int
    token_ids: list[int]         # generated tokens, including the stop token when one ended the
                                 # sample
    logprobs: list[float]        # log_softmax(logits / T) of each token in token_ids
    text: str                    # decoded without the stop token, cut at the first stop string
    finish_reason: str           # "stop" | "length" | "cancelled"
    top_logprobs: list[list[tuple[int, float]]] | None = None   # per token: the k most likely (id,
                                                                # log-prob)


def _per_prompt(value, n_prompts: int, name: str, is_scalar) -> list:
    """A scalar applies to every prompt; a list/tuple gives one value per prompt."""
    if is_scalar(value):
        return [value] * n_prompts
    values = list(value)
    if len(values) != n_prompts:
        raise ValueError(f"generate: {name} has {len(values)} values for {n_prompts} prompts")
    bad = [v for v in values if not is_scalar(v)]
    if bad:
        raise ValueError(f"generate: {name} has an invalid entry {bad[0]!r}")
    return values


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_stop_list(v):
    return (
        v is None
        or isinstance(v, str)
        or (isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v))
    )


def _stop_list(v) -> tuple[str, ...]:
    return () if v is None else (v,) if isinstance(v, str) else tuple(v)


def _cut_at_stop(text: str, stop_strings) -> str | None:
    """text up to the first occurrence of any stop string, or None when none occurs."""
    hits = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
    return text[:min(hits)] if hits else None


def stop_string_ended(tokenizer, tokens: list[int], stop_strings) -> bool:
    """Whether decode(tokens) holds a stop string, where decode(tokens[:-1]) held none (the check
    runs after every token): _cut_at_stop(tokenizer.decode(tokens), stop_strings) is not None, read
    from the last tokens' text only, so that a check costs the new text, not the whole reply (which
    made decoding quadratic).

    Byte-level BPE decodes the bytes of all its tokens at once, U+FFFD for those that are no
    character. The last token changes the text from its predecessors' last character on (one they
    left unfinished) and adds at most as many characters as it decodes to alone (`added`), so a stop
    string that was not there before starts in the last `longest + added` characters. A window of
    the last tokens decodes to the text's end after the U+FFFD of the bytes it opens in the middle
    of (UTF-8 resynchronises at the first byte that is not a continuation byte): the window doubles
    until those characters lie past them."""
    longest = max((len(s) for s in stop_strings if s), default=0)
    if not longest or not tokens:
        return False
    added, width = len(tokenizer.decode(tokens[-1:])), longest + 8
    while width < len(tokens):
        tail = tokenizer.decode(tokens[-width:])
        start = len(tail) - added - longest
        if start >= len(tail) - len(tail.lstrip("\ufffd")):
            return _cut_at_stop(tail[start:], stop_strings) is not None
        width *= 2
    return _cut_at_stop(tokenizer.decode(tokens), stop_strings) is not None


def _left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = [[pad_id] * (width - len(s)) + list(s) for s in seqs]
    mask = [[0] * (width - len(s)) + [1] * len(s) for s in seqs]
    return torch.tensor(ids, dtype=torch.long, device=device), torch.tensor(mask, dtype=torch.long,
            device=device)


def _filtered_choice(probs, top_k, top_p, u, total, check_cover=True):
    """Inverse-CDF draw from the top-k / top-p restricted distribution, candidates in descending
    order.

    Only the K most likely tokens are sorted (torch.topk), K growing until it covers every row's
    kept set:
    a full sort of a 150k vocabulary costs as much as a decoding step. check_cover=False: the
    caller knows every row keeps at most 64 tokens (top-k), so the window needs no look at the
    device. """
    V = probs.shape[1]
    no_k = (top_k <= 0) | (top_k >= V)
    k_eff = torch.where(no_k, V, top_k)
    K = min(V, 64)
    while True:
        # (R, K), descending
        top, index = probs.topk(K, dim=-1)
        covered = (k_eff <= K) | (no_k & (top.sum(-1) >= top_p * total))
        if K == V or not check_cover or bool(covered.all()):
            break
        K = min(V, 4 * K)
    rank = torch.arange(K, device=probs.device)
    top = top * (rank < k_eff[:, None])                                             # top-k
    # normaliser of the top-k set
    mass = torch.where(no_k, total, top.sum(-1))
    # top-p; the first always stays
    top = top * ((top.cumsum(-1) - top) < (top_p * mass)[:, None])
    cdf = top.cumsum(-1)
    choice = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=K - 1)
    return index.gather(1, choice).squeeze(1)


def _sample_step(logits, temperature, top_k, top_p, plan: "_Plan", u=None):
    """logits (R, V) float32 -> (tokens (R,), their logprobs (R,), all logprobs (R, V)); per-row
    parameters are (R,) tensors, u (R,) the rows' uniforms (None when every row is greedy: `plan`,
    worked out on the host, says which rows draw).

    Which path a row takes depends only on its own parameters, so its draw never depends on its
    companions. """
    greedy = temperature == 0
    logprobs = torch.log_softmax(logits / torch.where(greedy, 1.0, temperature)[:, None], dim=-1)
    tokens = logits.argmax(-1)
    if plan.sampled:
        probs = logprobs.exp()
        # vocabulary order
        cdf = probs.cumsum(-1)
        choice = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
        choice = choice.clamp(max=cdf.shape[1] - 1)
        if plan.filtered is not None:
            rows = plan.filtered
            choice[rows] = _filtered_choice(probs[rows], top_k[rows], top_p[rows], u[rows],
                                            cdf[rows, -1], plan.check_cover)
        tokens = torch.where(greedy, tokens, choice)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1), logprobs


@dataclass
class _Plan:
    """What the rows of one decoding block do, known on the host from their parameters (no look at
    the device)."""
    sampled: bool                     # some row draws (temperature > 0)
    filtered: torch.Tensor | None     # the rows that restrict to top-k / top-p, or None
    check_cover: bool                 # _filtered_choice must look at the probability mass (a top-p
                                      # row, no small k)

    @classmethod
    def of(cls, temperature: list[float], top_k: list[int], top_p: list[float], device) -> "_Plan":
        rows = [
            i
            for i, (t, k, p) in enumerate(zip(temperature, top_k, top_p))
            if t > 0 and (k > 0 or p < 1)
        ]
        check = any(not 0 < top_k[i] <= 64 for i in rows)
        return cls(any(t > 0 for t in temperature),
                   torch.tensor(rows, device=device) if rows else None, check)


@dataclass
class _Options:
    """The per-prompt settings of one generate() call, checked."""
    temperature: list[float]
    top_k: list[int]
    top_p: list[float]
    max_new_tokens: list[int]
    seed: list[int | None]
    stop_strings: list[tuple[str, ...]]
    stop_token_ids: set[int]
    on_token: object = None          # on_token(row, token_id) as each token is chosen: a server
                                     # streams replies
    top_logprobs: list[int] = None   # per prompt: how many most likely tokens to keep per token
                                     # (0: none)


def _options(prompts, n, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids,
             stop_strings, tokenizer, on_token=None, top_logprobs=0) -> _Options:
    P = len(prompts)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"generate: n must be a positive int, got {n!r}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"generate: prompt {i} is empty")
    opts = _Options(
        temperature=_per_prompt(temperature, P, "temperature", _is_number),
        top_k=_per_prompt(top_k, P, "top_k",
                          lambda v: isinstance(v, int) and not isinstance(v, bool)),
        top_p=_per_prompt(top_p, P, "top_p", _is_number),
        max_new_tokens=_per_prompt(max_new_tokens, P, "max_new_tokens",
                                   lambda v: isinstance(v, int) and v >= 0),
        seed=_per_prompt(seed, P, "seed",
                         lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool))),
        stop_strings=[_stop_list(v)
                      for v in _per_prompt(stop_strings, P, "stop_strings", _is_stop_list)],
        stop_token_ids=set(int(t) for t in stop_token_ids), on_token=on_token,
        top_logprobs=_per_prompt(top_logprobs, P, "top_logprobs",
                                 lambda v: isinstance(v, int) and v >= 0))
    for name, vals, ok in (("temperature", opts.temperature, lambda v: v >= 0),
                           ("top_p", opts.top_p, lambda v: 0 < v <= 1)):
        if not all(ok(v) for v in vals):
            raise ValueError(f"generate: {name} out of range: {vals}")
    if any(opts.stop_strings) and tokenizer is None:
        raise ValueError("generate: stop_strings need a tokenizer")
    return opts


def _generators(seeds: list[int | None], n: int) -> list[torch.Generator]:
    """One generator per row (rows = samples, prompt-major): sample j of seed s is seeded s * MIX +
    j."""
    generators = []
    for r in range(len(seeds) * n):
        s = seeds[r // n]
        g = torch.Generator()
        # unseeded: torch's CPU RNG
        base = int(torch.randint(0, 2**62, (1,), device="cpu")) if s is None else s
        g.manual_seed((base * _SEED_MIX + r % n) % 2**63)
        generators.append(g)
    return generators


def compute_dtype(model) -> torch.dtype:
    """The dtype attention computes in: autocast's (bf16) when it is on for the model's device,
    else the weights'. The KV cache is kept in it, so a decoding step does not re-cast the whole
    cache."""
    kind = model.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else model.dtype


def _prefill(model, prompts, n: int, pad_id: int, new_tokens: int):
    """Prefill each prompt once, then give each of its n samples a copy of the cache: (cache,
    logits (R, V))."""
    ids, mask = _left_pad(prompts, pad_id, model.device)
    cache = model.new_cache(len(prompts), ids.shape[1] + new_tokens, dtype=compute_dtype(model))
    last_hidden = model.hidden_states(ids, mask, cache)[:, -1]                        # (P, H)
    logits = model.lm_head(last_hidden).float().repeat_interleave(n, dim=0)            # (R, V)
    return (cache.repeat_interleave(n) if n > 1 else cache), logits


@dataclass
class _Rows:
    """What each row (one sample; prompt-major, row r is sample r % n of prompt r // n) has
    produced."""
    prompt: list[int]
    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish: list[str]
    top: list[list[list[tuple[int, float]]]] = None   # per row, per token: (id, log-prob) of the
                                                      # most likely

    @classmethod
    def start(cls, n_prompts: int, n: int) -> "_Rows":
        R = n_prompts * n
        return cls([r // n for r in range(R)], [[] for _ in range(R)], [[] for _ in range(R)],
                   ["length"] * R, [[] for _ in range(R)])

    def append_block(self, active, block: "_Block", opts: _Options, tokenizer) -> list[int]:
        """A block's tokens (steps × rows of `active`), step by step: a row's tokens after it
        stopped are dropped. Returns the rows that go on decoding."""
        tokens, logprobs, still = block.tokens.tolist(), block.logprobs.tolist(), active
        if block.top_ids is not None:
            self._append_top(active, block, opts)
        for step_tokens, step_logprobs in zip(tokens, logprobs):
            alive = set(still)
            keep = [i for i, r in enumerate(active) if r in alive]
            still = self.append([active[i] for i in keep], [step_tokens[i] for i in keep],
                                [step_logprobs[i] for i in keep], opts, tokenizer)
            if not still:
                break
        return still

    def _append_top(self, active, block: "_Block", opts: _Options):
        """Each row's k most likely tokens of every step of the block (append_block then drops what
        comes after a row stopped: cut here to the tokens it keeps)."""
        ids, values = block.top_ids.tolist(), block.top_logprobs.tolist()
        for i, r in enumerate(active):
            k = opts.top_logprobs[self.prompt[r]]
            if k:
                self.top[r] += [list(zip(ids[s][i][:k], values[s][i][:k])) for s in range(len(ids))]

    def append(self, active, tokens, logprobs, opts: _Options, tokenizer) -> list[int]:
        """Add this step's token to each active row; returns the rows that go on decoding."""
        still = []
        for r, tok, lp in zip(active, tokens, logprobs):
            self.tokens[r].append(tok)
            self.logprobs[r].append(lp)
            if opts.on_token is not None:
                opts.on_token(r, tok)
            stop_list = opts.stop_strings[self.prompt[r]]
            if tok in opts.stop_token_ids or \
                    (stop_list and stop_string_ended(tokenizer, self.tokens[r], stop_list)):
                self.finish[r] = "stop"
            elif len(self.tokens[r]) < opts.max_new_tokens[self.prompt[r]]:
                still.append(r)
        return still

    def sample(self, r: int, opts: _Options, tokenizer) -> Sample:
        """Row r as a Sample: its text decoded without the stop token, cut at the first stop
        string."""
        tokens, text = self.tokens[r], ""
        if tokenizer is not None:
            ended_by_token = bool(tokens) and tokens[-1] in opts.stop_token_ids
            text = tokenizer.decode(tokens[:-1] if ended_by_token else tokens)
            cut = _cut_at_stop(text, opts.stop_strings[self.prompt[r]])
            text = text if cut is None else cut
        top = self.top[r][:len(tokens)] if opts.top_logprobs[self.prompt[r]] else None
        return Sample(prompt_index=self.prompt[r], token_ids=tokens, logprobs=self.logprobs[r],
                      text=text, finish_reason=self.finish[r], top_logprobs=top)


def _feed(model, cache, n_cached: int, slots, tokens, pad_id: int):
    """One decoding step: `tokens` (device) into cache slots `slots`, a pad token into the others
    (rows that finished; their outputs are ignored). Returns the logits of the fed rows, float32."""
    step_ids = torch.full((n_cached, 1), pad_id, dtype=torch.long, device=model.device)
    step_ids[slots, 0] = tokens
    if isinstance(cache, StaticDecoder):   # generate(compiled=True): nn/compiled_decode.py
        return cache.step(step_ids)[slots]
    return model(step_ids, cache=cache)[:, -1].float()[slots]                       # (fed rows, V)


@dataclass
class _Block:
    """One decoding block, on the device: the tokens and their log-probs (steps, rows), and, when
    some row asks for them, each step's `width` most likely tokens and their log-probs (steps,
    rows, width)."""
    tokens: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


def _decode_block(model, cache, cache_rows: list[int], logits, active: list[int], steps: int,
                  opts: _Options, rows: _Rows, generators, pad_id: int) -> _Block:
    """`steps` tokens for every row of `active`, on the device. The block's last tokens are not fed
    yet: the host first says who goes on (_decode_step)."""
    params = [
        [getattr(opts, name)[rows.prompt[r]] for r in active]
        for name in ("temperature", "top_k", "top_p")
    ]
    plan = _Plan.of(*params, device=model.device)
    temp, top_k, top_p = (torch.tensor(v, dtype=d, device=model.device)
                          for v, d in zip(params, (torch.float32, torch.long, torch.float32)))
    # the generators live on the CPU (the same draws on every device): the block's uniforms, one
    # copy over
    u = torch.stack([torch.rand(steps, generator=generators[r], device="cpu") for r in active],
                    1).to(model.device) \
        if plan.sampled else None
    slot = {r: i for i, r in enumerate(cache_rows)}
    slots = torch.tensor([slot[r] for r in active], device=model.device)
    width = max(opts.top_logprobs[rows.prompt[r]] for r in active)
    tokens, logprobs, top = [], [], []
    for i in range(steps):
        token, logprob, full = _sample_step(logits, temp, top_k, top_p, plan,
                                            None if u is None else u[i])
        tokens.append(token)
        logprobs.append(logprob)
        if width:
            top.append(full.topk(min(width, full.shape[1]), dim=-1))
        if i < steps - 1:
            logits = _feed(model, cache, len(cache_rows), slots, token, pad_id)
    if not width:
        return _Block(torch.stack(tokens), torch.stack(logprobs))
    return _Block(torch.stack(tokens), torch.stack(logprobs), torch.stack([t.indices for t in top]),
                  torch.stack([t.values for t in top]))


def _decode_step(model, cache, cache_rows: list[int], active: list[int], last, still: list[int],
                 pad_id: int):
    """Feed each row of `active` that is still cached its last token `last` (device, aligned with
    `active`):
    (cache, rows held in the cache, logits of `still`)."""
    if len(still) <= len(cache_rows) // 2 and not isinstance(cache, StaticDecoder):
        # half the cached rows are finished: drop them (one copy of the cache) so steps get cheaper
        # (a static cache keeps its rows: its compiled step has one shape)
        slot = {r: i for i, r in enumerate(cache_rows)}
        cache = cache.select([slot[r] for r in still])
        cache_rows = still
    slot = {r: i for i, r in enumerate(cache_rows)}
    fed = [(slot[r], i) for i, r in enumerate(active) if r in slot]
    # (2, fed rows)
    index = torch.tensor(fed, device=model.device).T
    logits = _feed(model, cache, len(cache_rows), index[0], last[index[1]], pad_id)
    back = {r: j for j, (i, _) in enumerate(fed) for r in [cache_rows[i]]}
    return cache, cache_rows, logits[torch.tensor([back[r] for r in still], device=model.device)]


@torch.no_grad()
def generate(model, prompts: list[list[int]], *, n=1, max_new_tokens=128, temperature=1.0, top_k=0,
             top_p=1.0, stop_token_ids=(), stop_strings=(), seed=None, tokenizer=None, pad_id=0,
             should_stop=None, on_token=None, sync_every=None, top_logprobs=0,
             compiled=None) -> list[Sample]:
    """len(prompts) * n samples, prompt-major (module docstring); parameters may be per-prompt
    lists. A server's:
    should_stop(prompt_index), asked before each block of decoding steps, ends that prompt's
    samples early (finish_reason "cancelled": its client has gone); on_token(row, token_id)
    streams. sync_every: tokens per look at the host (1 on the CPU, else SYNC_EVERY; the samples do
    not depend on it); top_logprobs: k (module doc); compiled: decode with a static cache and a
    torch.compile'd step (opt-in: nn/compiled_decode.py; None: the model's `compile_decode`, which
    train_grpo.py --compile-decode sets on the editor)"""
    if len(prompts) == 0:
        return []
    opts = _options(prompts, n, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids,
                    stop_strings, tokenizer, on_token, top_logprobs)
    rows = _Rows.start(len(prompts), n)
    generators = _generators(opts.seed, n)
    cache, logits = _prefill(model, prompts, n, pad_id, max(max(opts.max_new_tokens), 1))
    if getattr(model, "compile_decode", False) if compiled is None else compiled:
        cache = StaticDecoder(model, cache)
    every = sync_every or (1 if model.device.type == "cpu" else SYNC_EVERY)
    # rows still decoding
    active = [r for r, p in enumerate(rows.prompt) if opts.max_new_tokens[p] > 0]
    # row held in each cache slot
    cache_rows = list(range(len(rows.prompt)))
    # logits rows follow `active`
    logits = logits[active]
    while active:
        if should_stop is not None:
            active, logits = _drop_cancelled(rows, active, logits, should_stop)
            if not active:
                break
        steps = min(
            every, max(opts.max_new_tokens[rows.prompt[r]] - len(rows.tokens[r]) for r in active)
        )
        block = _decode_block(model, cache, cache_rows, logits, active, steps, opts, rows,
                              generators, pad_id)
        still = rows.append_block(active, block, opts, tokenizer)
        if not still:
            break
        cache, cache_rows, logits = _decode_step(model, cache, cache_rows, active,
                                                 block.tokens[-1], still, pad_id)
        active = still
    return [rows.sample(r, opts, tokenizer) for r in range(len(rows.prompt))]


def _drop_cancelled(rows, active: list[int], logits, should_stop):
    """generate's should_stop: the rows whose prompt should stop end as "cancelled"; (rows left,
    their logits)."""
    keep = [i for i, r in enumerate(active) if not should_stop(rows.prompt[r])]
    for i in sorted(set(range(len(active))) - set(keep)):
        rows.finish[active[i]] = "cancelled"
    return [active[i] for i in keep], logits[keep]


def _chunk_logprobs(hidden, targets, weight, temperature):
    """hidden (N, H), targets (N,) -> log_softmax(hidden W^T / T)[target], float32 (N,)."""
    logits = F.linear(hidden, weight).float() / temperature                          # (N, V)
    return logits.gather(1, targets[:, None]).squeeze(1) - logits.logsumexp(-1)


def token_logprobs(hidden, targets, weight, temperature: float, chunk_tokens: int) -> torch.Tensor:
    """(N,) float32 log-probs of `targets` from `hidden` (N, H) through the output matrix `weight`,
    chunk_tokens rows of logits at a time; while training each chunk is checkpointed, so its
    (chunk, V) logits are freed after the forward and recomputed in the backward."""
    pieces = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        args = (hidden[start:start + chunk_tokens], targets[start:start + chunk_tokens], weight,
                temperature)
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(*args))
    return torch.cat(pieces)


def completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]], *,
                        temperature=1.0, chunk_tokens=2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, Tc) float32 log-probs of each completion token given prompt + earlier completion tokens,
    and the (B, Tc) bool mask of real entries (Tc = longest completion). Differentiable through the
    model."""
    if len(prompts) != len(completions):
        raise ValueError(f"completion_logprobs: {len(prompts)} prompts but {len(completions)} "
                         f"completions")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("completion_logprobs: every prompt needs at least one token")
    if temperature < 0 or chunk_tokens < 1:
        raise ValueError(f"completion_logprobs: bad temperature {temperature} or chunk_tokens "
                         f"{chunk_tokens}")
    temperature = temperature or 1.0
    device = model.device
    B = len(prompts)
    Tc = max((len(c) for c in completions), default=0)
    lengths = torch.tensor([len(c) for c in completions], device=device)
    mask = torch.arange(Tc, device=device)[None, :] < lengths[:, None]               # (B, Tc)
    if Tc == 0:
        return torch.zeros(B, 0, device=device), mask

    ids, attn = _left_pad([list(p) + list(c) for p, c in zip(prompts, completions)], 0, device)
    T = ids.shape[1]
    hidden = model.hidden_states(ids, attn)                                          # (B, T, H)
    # completion token j of row b sits at T - len_b + j (left padding); it is predicted one slot
    # earlier
    where = (T - lengths[:, None] + torch.arange(Tc, device=device)[None, :] - 1).clamp(0, T - 1)
    targets = torch.tensor([list(c) + [0] * (Tc - len(c)) for c in completions], dtype=torch.long,
                           device=device)
    h = hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))[mask]    # (N, H)
    t = targets[mask]                                                                # (N,)
    values = token_logprobs(h, t, model.lm_head.weight, temperature, chunk_tokens)
    return torch.zeros(B, Tc, device=device).masked_scatter(mask, values), mask


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minskill.nn.sampling",
                                     description="Chat once with a model: print its reply to one "
                                                 "prompt.")
    parser.add_argument("--model", default="smollm2-135m",
                        help="HF folder or 'smollm2-135m' (offline default)")
    parser.add_argument("--prompt", required=True, help="the user message")
    parser.add_argument("--system", default=None, help="system prompt (default: the chat format's "
                                                       "own)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(args.model, dtype=getattr(torch, args.dtype))
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    [sample] = generate(model, [prompt], max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                        stop_token_ids=tokenizer.stop_token_ids, tokenizer=tokenizer,
                        pad_id=tokenizer.pad_token_id)
    print(sample.text.strip())


if __name__ == "__main__":
    main()
