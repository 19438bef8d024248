"""The server's decoding engine: sequences join a running batch at the next decoding step and leave
it at once.

`Engine` holds one KVCache whose rows are the sequences being decoded (one per sample: a request
with n = 4 is 4 sequences), and the logits of each row's next token. Each `step()`:

  1. drops the rows whose request was cancelled (finish_reason "cancelled": its client has gone);
  2. chooses one token per row (sampling._sample_step: the same rule as sampling.generate, after the
     row's logit_bias and penalties, serve.penalties, and its schema's mask, serve.constrained),
     streams it (on_token), and ends a row on a stop token, a stop string or its max_new_tokens;
  3. finished rows leave the cache at once (KVCache.select), their request is answered as soon as
     its last sample ends; the others are fed their token (one forward of the model, one new slot
     for every row; with quantized weights and batch_invariant, serve.lean_decode's step: the same
     bits, fewer ops; with c_kernels, serve.c_decode's: other bits, fewer calls still).

`add(sequences)` prefills newcomers and merges them into the running cache: with a prefix cache,
through serve.cascade.prefill_shared (a prefix that running or joining sequences share is computed
once, from the prefix cache when it is there, and kept once in the batch: a CascadeCache, whose
slots hold each row's own tokens only), else through serve.prefix_cache.prefill (identical prompts
once, every row holding its prompt). All rows share one write offset (KVCache): the rows are
aligned on their last slot, the shorter side is left padded with masked slots, and leading slots
that no row uses any more are cut, so a long-gone prompt does not keep the cache wide. Positions
are per row (next_position), so padding never shifts a row's RoPE positions.

Invariants.
  * A row's tokens depend only on its own prompt, parameters and generator: padding is masked,
    positions are its own, and a seeded sample draws one uniform per token from its own
    torch.Generator, seeded as sampling.generate seeds it (seed s, sample j), so a seeded request
    gives the same tokens whatever shares the batch, and the same as generate on the CPU. With
    batch_invariant (the server's default) a row's logits have the same bits whatever shares the
    batch (int8, bf16; float32 to its GEMMs' rounding): serve.aligned. Without it, a row's keys sit
    behind its companions' padding and its softmax sums them in another order, so int8/bf16 greedy
    replies can change with the batch.
  * The cache has room for every row's remaining tokens (grown at each merge).
  * The engine runs on one thread (the server's scheduler thread); callbacks run on it.

`run_continuous(scheduler)` is the server's loop for `--scheduler continuous`
(minskill.serve.server): between two steps it takes the queued requests that fit in max_batch
samples, so a request waits at most one decoding step.
"""
from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch

from minskill.nn.model import KVCache
from minskill.nn.sampling import (Sample, _cut_at_stop, _generators, _Plan, _sample_step,
                                   compute_dtype, stop_string_ended)
from minskill.serve.aligned import merge_aligned, prefill_aligned
from minskill.serve.c_decode import CDecoder
from minskill.serve.cascade import groups_of, prefill_shared, with_groups
from minskill.serve.constrained import JsonConstraint, constrain
from minskill.serve.lean_decode import LeanDecoder
from minskill.serve.penalties import Penalties, apply_penalties
from minskill.serve.prefix_cache import PrefixCache, prefill


@dataclass
class Sequence:
    """One sample being decoded, and what it has produced."""
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    top_logprobs: int = 0
    generator: torch.Generator | None = None
    on_token: Callable[[int], None] | None = None        # on_token(token_id), as it is chosen
    should_stop: Callable[[], bool] | None = None        # the client has gone
    on_done: Callable[["Sequence"], None] | None = None  # called once, when the sequence ends
    constraint: JsonConstraint | None = None             # its JSON schema (serve.constrained)
    penalties: Penalties | None = None                   # logit_bias, penalties (serve.penalties)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: str = "length"

    def sample(self, stop_token_ids, tokenizer) -> Sample:
        """As sampling.generate reports a sample: text without the stop token, cut at the first
        stop string."""
        text = ""
        if tokenizer is not None:
            ended_by_token = bool(self.tokens) and self.tokens[-1] in stop_token_ids
            text = tokenizer.decode(self.tokens[:-1] if ended_by_token else self.tokens)
            cut = _cut_at_stop(text, self.stop_strings)
            text = text if cut is None else cut
        return Sample(0, self.tokens, self.logprobs, text, self.finish,
                      self.top[:len(self.tokens)] if self.top_logprobs else None)


def sequences_for(prompt, n: int, seed, **params) -> list[Sequence]:
    """The n samples of one prompt, each with the generator sampling.generate would give it."""
    return [Sequence(list(prompt), generator=g, **params) for g in _generators([seed], n)]


class Engine:
    """The running batch (module docstring). add() newcomers, step() until `rows` is empty."""

    def __init__(self, model, tokenizer, stop_token_ids=None, pad_id: int = 0,
                 prefix_cache: PrefixCache | None = None, batch_invariant: bool = False,
                 lean: bool = True, c_kernels: bool = False):
        """stop_token_ids None: the tokenizer's, read at each step (as generate reads them at each
        call). batch_invariant: every row's keys at the slots of their positions and prompts
        prefilled one by one (serve.aligned), so a row's bits do not depend on its companions; no
        prefix is kept once (cascade). c_kernels: the lean step's small ops in C where the model
        and the machine allow (serve.c_decode: batch-invariant too, with other bits)."""
        self.model, self.tokenizer, self.pad_id = model, tokenizer, pad_id
        self.prefix_cache = prefix_cache
        self.batch_invariant = batch_invariant
        # the decoding step in fewer ops, with the same bits, where it covers the model (a quantized
        # one: the server's CPU default); lean=False keeps the plain step (bench profile compares)
        lean_step = LeanDecoder.of(model) if batch_invariant and lean else None
        self.lean = (c_kernels and lean_step and CDecoder.of(model, lean_step)) or lean_step
        self._stop_token_ids = None if stop_token_ids is None else \
            set(int(t) for t in stop_token_ids)
        self.rows: list[Sequence] = []
        self.cache: KVCache | None = None
        self.logits: torch.Tensor | None = None   # (rows, V) float32: next-token logits

    @property
    def stop_token_ids(self) -> set[int]:
        if self._stop_token_ids is None:
            return set(self.tokenizer.stop_token_ids)
        return self._stop_token_ids

    def add(self, sequences: list[Sequence]):
        """Prefill `sequences` and let them join the batch (a sequence with max_new_tokens 0 ends
        at once)."""
        for s in [s for s in sequences if s.max_new_tokens <= 0]:
            self._finish(s)
        sequences = [s for s in sequences if s.max_new_tokens > 0]
        if not sequences:
            return
        room = max(s.max_new_tokens - len(s.tokens) for s in self.rows + sequences)
        prompts, dtype = [s.prompt for s in sequences], compute_dtype(self.model)
        if self.batch_invariant:            # each row at its own slots (serve.aligned)
            cache, logits = prefill_aligned(self.model, prompts, room, self.prefix_cache, dtype)
        elif self.prefix_cache is not None:
            # shared prefixes kept once in the batch (serve.cascade)
            running = groups_of(self.cache)[0] if self.cache is not None else None
            cache, logits = prefill_shared(self.model, prompts, room, self.prefix_cache,
                                           self.pad_id, dtype, [s.prompt for s in self.rows],
                                           running)
        else:
            cache, logits = prefill(self.model, prompts, room, None, self.pad_id, dtype)
        if self.cache is None:
            self.cache, self.logits = cache, logits
        else:
            self.cache = merge_aligned(self.cache, cache, room) if self.batch_invariant else \
                merge_caches(self.cache, cache, room)
            self.logits = torch.cat([self.logits, logits])
        self.rows += sequences

    def step(self):
        """One token for every row (module docstring)."""
        keep = [i for i, s in enumerate(self.rows) if not (s.should_stop and s.should_stop())]
        for i in sorted(set(range(len(self.rows))) - set(keep)):
            self.rows[i].finish = "cancelled"
        self._leave(keep)
        if not self.rows:
            return
        # a row's own controls (serve.penalties), then, with a JSON schema, its allowed tokens only
        self.logits = constrain(apply_penalties(self.logits, self.rows), self.rows)
        tokens, logprobs, top = self._choose()
        still, stop_token_ids = [], self.stop_token_ids
        for i, (s, tok, lp) in enumerate(zip(self.rows, tokens, logprobs)):
            s.tokens.append(tok)
            s.logprobs.append(lp)
            if s.top_logprobs:
                s.top.append(list(zip(top[0][i][:s.top_logprobs], top[1][i][:s.top_logprobs])))
            if s.on_token is not None:
                s.on_token(tok)
            if tok in stop_token_ids or (
                    s.stop_strings and stop_string_ended(self.tokenizer, s.tokens, s.stop_strings)):
                s.finish = "stop"
            elif len(s.tokens) < s.max_new_tokens:
                still.append(i)
        self._leave(still)
        if self.rows:
            ids = torch.tensor([[s.tokens[-1]] for s in self.rows], dtype=torch.long,
                               device=self.model.device)
            self.logits = self._decode(ids)

    def _decode(self, ids: torch.Tensor) -> torch.Tensor:
        """Every row's next-token logits (rows, V) float32 after feeding it `ids` (rows, 1)."""
        if self.lean is not None:
            return self.lean.step(ids, self.cache)
        return self.model(ids, cache=self.cache)[:, -1].float()

    def _choose(self):
        """This step's token and log-prob of every row (and the most likely tokens, when a row
        asks)."""
        device = self.model.device
        params = [[getattr(s, name) for s in self.rows]
                  for name in ("temperature", "top_k", "top_p")]
        plan = _Plan.of(*params, device=device)
        temp, top_k, top_p = (torch.tensor(v, dtype=d, device=device)
                              for v, d in zip(params, (torch.float32, torch.long, torch.float32)))
        u = torch.cat([torch.rand(1, generator=s.generator, device="cpu")
                       for s in self.rows]).to(device) if plan.sampled else None
        tokens, logprobs, full = _sample_step(self.logits, temp, top_k, top_p, plan, u)
        width = max(s.top_logprobs for s in self.rows)
        top = None
        if width:
            best = full.topk(min(width, full.shape[1]), dim=-1)
            top = (best.indices.tolist(), best.values.tolist())
        # one read from the device for both (float64 holds every token id and float32 exactly)
        chosen = torch.stack([tokens.double(), logprobs.double()]).tolist()
        return [int(t) for t in chosen[0]], chosen[1], top

    def _leave(self, keep: list[int]):
        """Rows not in `keep` have ended: out of the cache now, their callbacks called."""
        if len(keep) == len(self.rows):
            return
        gone = [s for i, s in enumerate(self.rows) if i not in set(keep)]
        self.rows = [self.rows[i] for i in keep]
        if self.rows:
            self.cache = (self.cache.select(keep) if self.batch_invariant
                          else trim_left(self.cache.select(keep)))
            self.logits = self.logits[torch.tensor(keep, device=self.logits.device)]
        else:
            self.cache = self.logits = None
        for s in gone:
            self._finish(s)

    def _finish(self, s: Sequence):
        if s.on_done is not None:
            s.on_done(s)

    def run(self, sequences: list[Sequence]):
        """Static batching: these sequences alone, until all have ended."""
        self.add(sequences)
        while self.rows:
            self.step()


def _empty_like(cache: KVCache, rows: int, max_len: int) -> KVCache:
    k = cache.k.new_zeros((cache.k.shape[0], rows, cache.k.shape[2], max_len, cache.k.shape[4]))
    new = KVCache.__new__(KVCache)
    new.k, new.v = k, torch.zeros_like(k)
    new.key_mask = torch.zeros(rows, max_len, dtype=torch.bool, device=k.device)
    new.next_position = torch.zeros(rows, dtype=torch.long, device=k.device)
    new.length, new.max_len, new.has_pads = 0, max_len, False
    return new


def merge_caches(a: KVCache, b: KVCache, room: int) -> KVCache:
    """Rows of a, then rows of b, aligned on their last written slot, with room for `room` more
    tokens."""
    length = max(a.length, b.length)
    new = _empty_like(a, a.batch_size + b.batch_size, length + room)
    for part, rows in ((a, slice(0, a.batch_size)), (b, slice(a.batch_size, None))):
        lo = length - part.length
        new.k[:, rows, :, lo:length] = part.k[:, :, :, :part.length]
        new.v[:, rows, :, lo:length] = part.v[:, :, :, :part.length]
        new.key_mask[rows, lo:length] = part.key_mask[:, :part.length]
        new.next_position[rows] = part.next_position
    new.length = length
    new.has_pads = not bool(new.key_mask[:, :length].all())
    (shared_a, groups_a), (shared_b, groups_b) = groups_of(a), groups_of(b)
    return with_groups(new, {**shared_a, **shared_b}, groups_a + groups_b)


def trim_left(cache: KVCache) -> KVCache:
    """The cache without its leading slots that no row uses (rows that used them have left)."""
    used = cache.key_mask[:, :cache.length].any(0)
    first = int(used.int().argmax()) if bool(used.any()) else 0
    if first == 0:
        return cache
    new = _empty_like(cache, cache.batch_size, cache.max_len - first)
    new.k[:, :, :, :cache.length - first] = cache.k[:, :, :, first:cache.length]
    new.v[:, :, :, :cache.length - first] = cache.v[:, :, :, first:cache.length]
    new.key_mask[:, :cache.length - first] = cache.key_mask[:, first:cache.length]
    new.next_position, new.length = cache.next_position.clone(), cache.length - first
    new.has_pads = not bool(new.key_mask[:, :new.length].all())
    return with_groups(new, *groups_of(cache))


def run_continuous(scheduler):
    """The server's scheduler thread under --scheduler continuous (scheduler:
    server.BatchScheduler; its backend has start(request, on_done), step(), in_flight()). Requests
    join between two decoding steps, up to max_batch samples in flight (a bigger one runs once the
    batch is empty); an embedding request runs between two steps. batches_served counts the times
    the running batch emptied; with log_requests, each time it empties one line says what it served
    since it was last empty (as static batching logs a batch)."""
    backend = scheduler.backend
    served = dict(requests=0, samples=0, tokens=0, started=time.perf_counter())

    def done(job, result):
        scheduler.finish(job, result)
        served["tokens"] += sum(choice.completion_tokens for choice in job.result or ())
    while True:
        with scheduler.condition:
            while not scheduler.pending and not backend.in_flight() and not scheduler.stopping:
                scheduler.condition.wait()
            if scheduler.stopping and not backend.in_flight():
                return
            joining, samples = [], backend.in_flight()
            while scheduler.pending:
                request = scheduler.pending[0].request
                n = getattr(request, "n", 0)
                if samples and samples + n > scheduler.max_batch:
                    break
                joining.append(scheduler.pending.popleft())
                samples += n
        for job in joining:
            if not hasattr(job.request, "n"):          # an EmbeddingRequest
                scheduler._embed(job)
                continue
            if not backend.in_flight():
                served.update(requests=0, samples=0, tokens=0, started=time.perf_counter())
            served["requests"] += 1
            served["samples"] += job.request.n
            try:
                backend.start(job.request, lambda result, job=job: done(job, result))
            except Exception as error:
                traceback.print_exc(file=sys.stderr)
                scheduler.finish(job, error)
        busy = backend.in_flight()
        try:
            backend.step()
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            backend.fail_all(error)
        if busy and not backend.in_flight():
            scheduler.batches_served += 1        # the running batch emptied: as a batch ends
            if scheduler.log_requests:
                print(f"[minskill.serve] batch of {served['requests']} requests, "
                      f"{served['samples']} samples, {served['tokens']} completion tokens, "
                      f"{time.perf_counter() - served['started']:.2f} s "
                      "(continuous: from the batch's first request until it emptied)",
                      file=sys.stderr, flush=True)
