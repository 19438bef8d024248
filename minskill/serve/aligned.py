"""Batch-invariant decoding for the server's engine: every row keeps its keys at the slot of their position.

A greedy reply should not depend on which requests share its batch, or on when they came. In a batch the
model's linear layers see M = (rows x tokens) inputs and attention sees every row's keys side by side, so a
row's arithmetic can depend on its companions in three ways (the kernels measured on this project's CPU build,
`python -m minskill.bench server` and tests/test_batch_invariance.py):

  1. a matmul kernel chosen by M: float32 GEMMs (MKL) give a row slightly different sums at M = 1, 2, 4, ...;
     bfloat16 GEMMs (oneDNN) and int8 weights (`torch._weight_int8pack_mm`) give every row the same bits
     whatever M is and wherever the row sits;
  2. the layout of a row's keys: a left-padded batch (nn.model.KVCache: all rows share one write offset) puts
     row b's key of position p at slot p + pad_b, and the attention kernel sums exp(s) and exp(s)·v in lanes
     and blocks fixed by slot, so the same keys are summed in another order when the padding changes;
  3. how a prompt's keys were computed: alone, beside other prompts, from a cached prefix, or as a prefix kept
     once for several rows (serve.cascade) whose softmax is merged with the row's own part.

This module removes 2 and 3; 1 is the kernels' (float32 keeps differences of ~1e-5 in the logits: a greedy
token changes only where two logits are that close). `AlignedCache` holds row b's key of position p at slot p,
the slots after the row's last position masked (trailing keys add exact zeros: the kernel's sums do not move):

    decode:   o_b = softmax(q_b K_b[0:n_b]ᵀ / √d) V_b[0:n_b]      one SDPA call for the batch, mask slot < n_b
    prefill:  one prompt at a time (a batch of one row, no padding), its first p tokens copied from the prefix
              cache (blocks that an earlier single-row prefill computed in exactly the same way)

so the bits a row sees are those it would see alone. Cost: prompts are prefilled one by one (their linear
layers stream the weights once per prompt instead of once per batch), and no prefix is kept once for several
rows (each row reads its own copy of a shared system prompt at every step).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minskill.nn.model import KVCache
from minskill.serve.prefix_cache import one_row_per_prompt


ALIGN = 64     # attention reads slots in multiples of this (module docstring: the kernels' tails)


def padded(n: int) -> int:
    """n rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


class AlignedCache(KVCache):
    """Keys/values (layers, B, n_kv, max_len, d) with row b's position p at slot p; `next_position[b]` is the
    row's length. The model calls `attend` instead of `update` (nn.model.Attention): the cache writes the new
    keys at the rows' own positions and computes attention over each row's slots 0..n_b-1."""

    def __init__(self, config, batch_size: int, max_len: int, dtype=torch.float32, device=None):
        super().__init__(config, batch_size, max_len, dtype, device)
        self.key_mask = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)   # unused: see attend
        self.group = config.num_attention_heads // config.num_key_value_heads
        self._mask = None                     # this forward's decoding mask, built at layer 0

    def mark_keys(self, T: int, attention_mask) -> bool:
        """The model's hook before a forward: inputs are never padded here (one prompt a prefill, one token a
        row a decoding step), so every key is real and no mask is built by the model."""
        if attention_mask is not None:
            raise ValueError("AlignedCache takes unpadded input: one prompt per prefill, one token per row")
        return True

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, n_h, T, d), this forward's k, v (B, n_kv, T, d) -> attention output (B, n_h, T, d). The model
        has already advanced next_position by T, and advances `length` (= the longest row) after the layers."""
        B, n_h, T, d = q.shape
        width = padded(self.length + T)         # the longest row's slots, and masked ones to a multiple of ALIGN
        start = self.next_position - T                                      # (B,) each row's first new slot
        if T == 1:   # decoding: one new key per row, at its own position
            rows = torch.arange(B, device=q.device)
            self.k[layer, rows, :, start] = k[:, :, 0]
            self.v[layer, rows, :, start] = v[:, :, 0]
            if layer == 0:
                self._mask = (torch.arange(width, device=q.device) < self.next_position[:, None])[:, None, None]
            # the `group` query heads of a kv head are `group` query rows of it (as nn.model does for T = 1)
            o = F.scaled_dot_product_attention(q.reshape(B, -1, self.group, d), self.k[layer, :, :, :width],
                                               self.v[layer, :, :, :width], attn_mask=self._mask)
            return o.reshape(B, n_h, 1, d)
        if B != 1:
            raise ValueError(f"AlignedCache prefills one prompt at a time, got {B} rows")
        p = self.length                                                     # tokens already cached
        self.k[layer, :, :, p:p + T], self.v[layer, :, :, p:p + T] = k, v
        keys, values = self.k[layer, :, :, :width], self.v[layer, :, :, :width]
        # an explicit mask even from position 0: is_causal would stop each query's sum at its own position,
        # another tail than a prefill from a cached prefix gives the same query
        causal = torch.arange(width, device=q.device)[None, :] <= torch.arange(p, p + T, device=q.device)[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=causal, enable_gqa=self.group > 1)

    def select(self, rows) -> "AlignedCache":
        new = KVCache.select(self, rows)
        new.__class__, new.group, new._mask = AlignedCache, self.group, None
        new.length = int(new.next_position.max()) if new.batch_size else 0
        return new


def prefill_aligned(model, prompts: list[list[int]], extra: int, prefix_cache=None, dtype=None):
    """(AlignedCache of these prompts' rows with room for `extra` more tokens, logits (P, V) float32 of each
    prompt's last token). Each distinct prompt is prefilled alone, from its longest cached prefix (whole
    blocks of serve.prefix_cache), and its new whole blocks are stored there for the next prompt."""
    unique = list(dict.fromkeys(tuple(p) for p in prompts))
    width = padded(max(len(p) for p in unique) + extra)
    cache = AlignedCache(model.config, len(unique), width, dtype or model.dtype, model.device)
    logits = []
    for i, prompt in enumerate(unique):
        prompt = list(prompt)
        row = AlignedCache(model.config, 1, padded(len(prompt)), cache.k.dtype, model.device)
        blocks = prefix_cache.lookup(prompt) if prefix_cache is not None else []
        p = len(blocks) * (prefix_cache.block if blocks else 0)
        if blocks:
            row.k[:, 0, :, :p] = torch.cat([b[0] for b in blocks], dim=2)
            row.v[:, 0, :, :p] = torch.cat([b[1] for b in blocks], dim=2)
            row.length, row.next_position[0] = p, p
        ids = torch.tensor([prompt[p:]], dtype=torch.long, device=model.device)
        logits.append(model.lm_head(model.hidden_states(ids, cache=row)[:, -1]).float())
        if prefix_cache is not None:
            prefix_cache.store(prompt, len(blocks), row.k[:, 0, :, p:], row.v[:, 0, :, p:])
        n = len(prompt)
        cache.k[:, i, :, :n], cache.v[:, i, :, :n] = row.k[:, 0, :, :n], row.v[:, 0, :, :n]
        cache.next_position[i] = n
    cache.length = max(len(p) for p in unique)
    return one_row_per_prompt(prompts, unique, cache, torch.cat(logits))


def merge_aligned(a: AlignedCache, b: AlignedCache, room: int) -> AlignedCache:
    """Rows of a, then rows of b, each at its own slots, with room for `room` more tokens after the longest."""
    length = max(a.length, b.length)
    k = a.k
    new = AlignedCache.__new__(AlignedCache)
    shape = (k.shape[0], a.batch_size + b.batch_size, k.shape[2], padded(length + room), k.shape[4])
    new.k, new.v = k.new_zeros(shape), k.new_zeros(shape)
    for part, rows in ((a, slice(0, a.batch_size)), (b, slice(a.batch_size, None))):
        new.k[:, rows, :, :part.length] = part.k[:, :, :, :part.length]
        new.v[:, rows, :, :part.length] = part.v[:, :, :, :part.length]
    new.next_position = torch.cat([a.next_position, b.next_position])
    new.key_mask = torch.zeros(shape[1], 0, dtype=torch.bool, device=k.device)
    new.length, new.max_len, new.has_pads = length, shape[3], False
    new.group, new._mask = a.group, None
    return new


class TwoRowLinear(nn.Linear):
    """An nn.Linear whose kernel never runs on a single row: one row is computed as two identical ones.
    On the CPU, bfloat16 GEMMs give a row the same bits at every M >= 2 but other bits at M = 1 (another
    kernel: module docstring, 1), and M = 1 is what a lone request's decoding step asks for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return super().forward(x)
        return super().forward(x.reshape(1, -1).expand(2, -1))[:1].view(*x.shape[:-1], -1)


def pad_single_rows(model):
    """Make `model`'s bfloat16 linear layers TwoRowLinear (in place; names, weights and state dict are
    unchanged). float32 layers stay: their kernels differ at every M anyway; int8 ones are invariant."""
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16:
            module.__class__ = TwoRowLinear
    return model
