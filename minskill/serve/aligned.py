"""Batch-invariant decoding for the server's engine: a row's keys at the slots of their positions,
and each query reading a key width fixed by its own position.

A greedy reply should not depend on which requests share its batch, or on when they came. In a batch
the model's linear layers see M = (rows x tokens) inputs and attention sees every row's keys side by
side, so a row's arithmetic can depend on its companions in four ways (measured on this project's
CPU build with the real 135M model's activations: tests/test_batch_invariance*.py):

  1. a matmul kernel chosen by M: float32 GEMMs (MKL) give a row other sums at M = 1, 2-3, >= 4 and
     with the threads' split; bfloat16 GEMMs (oneDNN) give M = 1 other bits than M >= 2; the int8
     kernel (`torch._weight_int8pack_mm`) gives a row the same bits at every M;
  2. the layout of a row's keys: a left-padded batch (nn.model.KVCache: one write offset for all
     rows) puts row b's key of position p at slot p + pad_b, and the attention kernel sums in lanes
     and blocks fixed by slot;
  3. the width of the keys an attention call reads: the kernel's sums for a query can change with
     the number of (masked) slots after its own keys; and a head's block of only 1-3 query rows
     gets other bits than a bigger one, and (with two or more threads) other bits again on another
     thread, which a row's place in its batch decides;
  4. how a prompt's keys were computed: alone, beside other prompts, from a cached prefix, or as a
     prefix kept once for several rows (serve.cascade) whose softmax is merged with the row's own
     part.

`AlignedCache` removes 2-4 and `TwoRowLinear` the bf16 case of 1 (float32 keeps differences of ~1e-5
in the logits: a greedy token changes only where two logits are that close). Row b's key of
position p sits at slot p; the query at position t reads slots [0, W(t)), a width fixed by t alone:

    W(t) = ALIGN·⌈(t + 1) / ALIGN⌉

    o_t = softmax(q_t K[0:W(t)]ᵀ / √d + mask_t) V[0:W(t)],    mask_t(s) = 0 for s <= t, −∞ after

    decode:   one SDPA call per run of consecutive rows of one W (their keys a view: nothing
              gathered), each kv head's query rows made a multiple of 4 (copies of the last)
    prefill:  one prompt at a time, its queries in chunks of one W (cut at multiples of ALIGN), each
              chunk made a multiple of 4 queries; its first p tokens copied from the prefix cache,
              whose blocks were computed so by whichever prompt came first

so the bits a row sees are a function of its own tokens. Cost: prompts are prefilled one by one
(their linear layers stream the weights once per prompt instead of once per batch), no prefix is
kept once for several rows (each row reads its own copy of a shared system prompt at every step),
and a decoding step makes one attention call per run of rows of one width (docs/benchmarks.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minskill.nn.model import KVCache
from minskill.serve.prefix_cache import one_row_per_prompt


ALIGN = 64     # W(t): a query's key width, a multiple of this (module docstring)


def padded(n: int) -> int:
    """n rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


class AlignedCache(KVCache):
    """Keys/values (layers, B, n_kv, max_len, d) with row b's position p at slot p;
    `next_position[b]` is the row's length, and `positions` the same lengths on the host (so a
    decoding step never asks the device for them). The model calls `attend` instead of `update`
    (nn.model.Attention): the cache writes the new keys at the rows' own positions and attends over
    them (module docstring)."""

    def __init__(self, config, batch_size: int, max_len: int, dtype=torch.float32, device=None,
                 prefill: bool = False):
        super().__init__(config, batch_size, max_len, dtype, device)
        self.prefill = prefill    # one prompt's row: its queries as a prefill's, even a single one
        self.key_mask = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)   # unused
        self.group = config.num_attention_heads // config.num_key_value_heads
        self.positions = [0] * batch_size     # next_position on the host
        self._groups = None                   # this decoding step's runs of rows by width (layer 0)
        self._slots = None                    # and the rows its new keys go to (_new_key_slots)

    def mark_keys(self, T: int, attention_mask) -> bool:
        """The model's hook before a forward: inputs are never padded here (one prompt a prefill,
        one token a row a decoding step), so every key is real and no mask is built by the model."""
        if attention_mask is not None:
            raise ValueError("AlignedCache takes unpadded input: one prompt per prefill, "
                             "one token per row")
        return True

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, n_h, T, d), this forward's k, v (B, n_kv, T, d) -> attention output (B, n_h, T, d).
        The model has already advanced next_position by T, and advances `length` (= the longest row)
        after the layers. The query at position t reads slots [0, W(t)) (module docstring)."""
        B, n_h, T, d = q.shape
        if not self.prefill:   # decoding: one new key per row, at its own position
            if layer == 0:   # (the model has advanced next_position by one: so do positions)
                self.positions = [n + 1 for n in self.positions]
                self._slots = self._new_key_slots()
                self._groups = self._runs_by_width()
            # row b's new key of kv head h to slot next_position[b] − 1 (a row of the flat cache)
            self.k[layer].view(-1, d).index_copy_(0, self._slots, k.reshape(-1, d))
            self.v[layer].view(-1, d).index_copy_(0, self._slots, v.reshape(-1, d))
            # the `group` query heads of a kv head are `group` query rows of it (as nn.model does),
            # made a multiple of 4 rows (_four_rows: with 1-3, a row's bits moved with its batch)
            q = _four_rows(q.reshape(B, -1, self.group, d))
            runs = [F.scaled_dot_product_attention(
                q[rows], self.k[layer, rows, :, :width], self.v[layer, rows, :, :width],
                attn_mask=mask) for rows, width, mask in self._groups]
            o = runs[0] if len(runs) == 1 else torch.cat(runs)
            return o[:, :, :self.group].reshape(B, n_h, 1, d)
        if B != 1:   # (a prompt whose every block but its last token was cached has T = 1 here)
            raise ValueError(f"AlignedCache prefills one prompt at a time, got {B} rows")
        p = self.length                                                 # tokens already cached
        self.k[layer, :, :, p:p + T], self.v[layer, :, :, p:p + T] = k, v
        out, a = [], p
        while a < p + T:   # queries of one width: positions up to the next multiple of ALIGN
            b = min(padded(a + 1), p + T)
            out.append(self._prefill_chunk(layer, q[:, :, a - p:b - p], a, padded(b)))
            a = b
        return torch.cat(out, dim=2)

    def _prefill_chunk(self, layer: int, q: torch.Tensor, first: int, width: int) -> torch.Tensor:
        """Attention of one row's queries at positions first.. over slots [0, width), causal. The
        kernel splits queries in blocks of 32, 64 or 256, and a last block of 1 to 3 rows gives its
        rows other bits than a bigger one: the queries are made a multiple of 4 (_four_rows)."""
        T, device = q.shape[2], q.device
        positions = torch.arange(first, first + T, device=device)
        causal = torch.arange(width, device=device)[None, :] <= positions[:, None]
        q = _four_rows(q)
        causal = torch.cat([causal, causal[-1:].expand(q.shape[2] - T, -1)])
        o = F.scaled_dot_product_attention(q, self.k[layer, :, :, :width],
                                           self.v[layer, :, :, :width], attn_mask=causal,
                                           enable_gqa=self.group > 1)
        return o[:, :, :T]

    def _new_key_slots(self) -> torch.Tensor:
        """(B·n_kv,) the rows of the flattened (B·n_kv·max_len, d) layer cache that this decoding
        step's new keys go to: row b, kv head h, slot next_position[b] − 1."""
        B, n_kv, max_len = self.k.shape[1:4]
        device = self.next_position.device
        heads = torch.arange(B, device=device)[:, None] * n_kv + torch.arange(n_kv, device=device)
        return (heads * max_len + (self.next_position - 1)[:, None]).reshape(-1)

    def _runs_by_width(self) -> list:
        """[(rows, width, mask)] of a decoding step: runs of consecutive rows whose new token reads
        the same width W = padded(n_b), each a slice (the keys a view, nothing copied), with their
        masks (0 where slot < n_b, −∞ after)."""
        widths = [padded(n) for n in self.positions]
        out, start = [], 0
        for b in range(1, len(widths) + 1):
            if b == len(widths) or widths[b] != widths[start]:
                rows = slice(start, b)
                seen = torch.arange(widths[start], device=self.next_position.device) < \
                    self.next_position[rows][:, None]
                # as an additive mask in the keys' dtype: what SDPA makes of a bool mask at each
                # call (the same bits), made once a step instead of once a layer
                mask = torch.zeros(seen.shape, dtype=self.k.dtype, device=seen.device)
                mask.masked_fill_(~seen, -torch.inf)
                out.append((rows, widths[start], mask[:, None, None]))
                start = b
        return out

    def select(self, rows) -> "AlignedCache":
        """Only these rows (in this order): every key real, the lengths known on the host, so
        nothing is read from the device."""
        rows = list(rows)
        index = torch.as_tensor(rows, dtype=torch.long, device=self.k.device)
        new = AlignedCache.__new__(AlignedCache)
        new.k, new.v = self.k.index_select(1, index), self.v.index_select(1, index)
        new.next_position = self.next_position.index_select(0, index)
        new.positions = [self.positions[r] for r in rows]
        new.key_mask = self.key_mask.index_select(0, index)
        new.length, new.max_len, new.has_pads = max(new.positions, default=0), self.max_len, False
        new.group, new._groups, new._slots, new.prefill = self.group, None, None, False
        return new


def _four_rows(q: torch.Tensor) -> torch.Tensor:
    """q (..., T, d) with copies of its last row appended up to a multiple of 4 rows. The attention
    kernel works on blocks of a head's query rows in per-thread buffers, and a block of 1-3 rows
    gave a row other bits depending on which thread took it, so on its batch (docstring, 3)."""
    extra = -q.shape[-2] % 4
    return torch.cat([q, q[..., -1:, :].expand(*q.shape[:-2], extra, -1)], dim=-2) if extra else q


def prefill_aligned(model, prompts: list[list[int]], extra: int, prefix_cache=None, dtype=None):
    """(AlignedCache of these prompts' rows with room for `extra` more tokens, logits (P, V) float32
    of each prompt's last token). Each distinct prompt is prefilled alone, from its longest cached
    prefix (whole blocks of serve.prefix_cache), and its new whole blocks are stored there."""
    unique = list(dict.fromkeys(tuple(p) for p in prompts))
    width = padded(max(len(p) for p in unique) + extra)
    cache = AlignedCache(model.config, len(unique), width, dtype or model.dtype, model.device)
    logits = []
    for i, prompt in enumerate(unique):
        prompt, n = list(prompt), len(prompt)
        row = AlignedCache(model.config, 1, padded(n), cache.k.dtype, model.device, prefill=True)
        blocks = prefix_cache.lookup(prompt) if prefix_cache is not None else []
        p = len(blocks) * (prefix_cache.block if blocks else 0)
        if blocks:
            row.k[:, 0, :, :p] = torch.cat([b[0] for b in blocks], dim=2)
            row.v[:, 0, :, :p] = torch.cat([b[1] for b in blocks], dim=2)
            row.length, row.next_position[0], row.positions = p, p, [p]
        ids = torch.tensor([prompt[p:]], dtype=torch.long, device=model.device)
        logits.append(model.lm_head(model.hidden_states(ids, cache=row)[:, -1]).float())
        if prefix_cache is not None:
            prefix_cache.store(prompt, len(blocks), row.k[:, 0, :, p:], row.v[:, 0, :, p:])
        cache.k[:, i, :, :n], cache.v[:, i, :, :n] = row.k[:, 0, :, :n], row.v[:, 0, :, :n]
        cache.next_position[i], cache.positions[i] = n, n
    cache.length = max(len(p) for p in unique)
    return one_row_per_prompt(prompts, unique, cache, torch.cat(logits))


def merge_aligned(a: AlignedCache, b: AlignedCache, room: int) -> AlignedCache:
    """Rows of a, then rows of b, each at its own slots, with room for `room` more tokens after the
    longest."""
    length, k = max(a.length, b.length), a.k
    new = AlignedCache.__new__(AlignedCache)
    shape = (k.shape[0], a.batch_size + b.batch_size, k.shape[2], padded(length + room), k.shape[4])
    new.k, new.v = k.new_zeros(shape), k.new_zeros(shape)
    for part, rows in ((a, slice(0, a.batch_size)), (b, slice(a.batch_size, None))):
        new.k[:, rows, :, :part.length] = part.k[:, :, :, :part.length]
        new.v[:, rows, :, :part.length] = part.v[:, :, :, :part.length]
    new.next_position = torch.cat([a.next_position, b.next_position])
    new.positions = a.positions + b.positions
    new.key_mask = torch.zeros(shape[1], 0, dtype=torch.bool, device=k.device)
    new.length, new.max_len, new.has_pads = length, shape[3], False
    new.group, new._groups, new._slots, new.prefill = a.group, None, None, False
    return new


class TwoRowLinear(nn.Linear):
    """An nn.Linear whose kernel never runs on a single row: one row is computed as two identical
    ones. On the CPU, bfloat16 GEMMs give a row the same bits at every M >= 2 but other bits at
    M = 1 (module docstring, 1), and M = 1 is what a lone request's decoding step asks for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return super().forward(x)
        return super().forward(x.reshape(1, -1).expand(2, -1))[:1].view(*x.shape[:-1], -1)


def pad_single_rows(model):
    """Make `model`'s bfloat16 linear layers TwoRowLinear (in place; names, weights and state dict
    are unchanged). float32 layers stay: their kernels differ at every M anyway; int8 ones are
    invariant."""
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16:
            module.__class__ = TwoRowLinear
    return model
