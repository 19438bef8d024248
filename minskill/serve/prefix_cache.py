"""Prefix caching for the server's engine: the keys/values of a prompt prefix are computed once.

A prompt is cut into blocks of BLOCK_TOKENS tokens; block i is named by a chained digest

    key_0 = H(b"" , tokens[0:B]),   key_i = H(key_{i-1}, tokens[iB:(i+1)B])     (H = blake2b, 16
                                    bytes)

so a key names the whole prefix tokens[0:(i+1)B], not the block alone. Under causal attention the
keys/values of a token depend only on the tokens up to it, and positions start at 0 for every
prompt, so the cached keys/values of a prefix are those any prompt starting with it would compute
(to float rounding: the same matmuls on other shapes). `PrefixCache` maps key -> that block's
keys/values, (layers, n_kv, B, d) each, in the engine's cache dtype (float32, bf16, and bf16 for
the int8 model alike).

Invariants.
  * Bounded: the stored blocks' bytes never exceed `capacity_bytes` (a block that alone exceeds it
    is not kept).
  * LRU with roots last: a lookup or a store touches a chain's blocks leaf first, root last, so a
    block is never less recently used than its descendants; eviction (least recently used first)
    removes leaves before their parents, and a cached chain stays reachable from its root.
  * A prompt always leaves at least one token to compute (the logits of its last token are needed):
    lookups cover at most (len - 1) // B blocks.

`prefill(model, prompts, extra, prefix_cache, pad_id, dtype)` prefills a batch into a KVCache in
`dtype` (the engine's compute dtype; None: the model's): identical prompts run once; with a cache,
a prefix shared by two prompts of the batch and not cached yet is prefilled first and stored
(recursively), then each prompt runs from its longest cached prefix. Layout of the returned
KVCache, for row i with a cached prefix of p_i tokens and a suffix of s_i: slots [Pmax - p_i, Pmax)
hold the prefix, [Pmax + Smax - s_i, Pmax + Smax) the suffix, every other slot is a masked pad
(positions count real tokens only, model.hidden_states). """
from __future__ import annotations

import collections
import hashlib

import torch

BLOCK_TOKENS = 16


def block_keys(tokens: list[int], blocks: int, block: int = BLOCK_TOKENS) -> list[bytes]:
    """The chained digests of the first `blocks` full blocks of `tokens`."""
    keys, parent = [], b""
    for i in range(blocks):
        chunk = b"".join(int(t).to_bytes(4, "little") for t in tokens[i * block:(i + 1) * block])
        parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
        keys.append(parent)
    return keys


class PrefixCache:
    """key -> (k, v) of one block, least recently used out, at most capacity_bytes in all (module
    docstring)."""

    def __init__(self, capacity_mb: float, block: int = BLOCK_TOKENS):
        if capacity_mb <= 0 or block < 1:
            raise ValueError(f"PrefixCache: need capacity_mb > 0 and block >= 1, got "
                             f"{capacity_mb}, {block}")
        self.capacity_bytes, self.block = int(capacity_mb * 2**20), block
        self.blocks: collections.OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = (
            collections.OrderedDict()
        )
        self.bytes = 0
        self.hits = self.misses = 0          # blocks found / not found by lookups (a figure for
        # logs and tests)

    def __len__(self):
        return len(self.blocks)

    def lookup(self, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The cached blocks of the longest cached prefix of tokens[:-1] (whole blocks), root
        first."""
        found = []
        for key in block_keys(tokens, (len(tokens) - 1) // self.block, self.block):
            kv = self.blocks.get(key)
            if kv is None:
                break
            found.append((key, kv))
        wanted = (len(tokens) - 1) // self.block
        self.hits, self.misses = self.hits + len(found), self.misses + wanted - len(found)
        for key, _ in reversed(found):       # leaf first, root last
            self.blocks.move_to_end(key)
        return [kv for _, kv in found]

    def store(self, tokens: list[int], first: int, k: torch.Tensor, v: torch.Tensor):
        """Keep blocks `first`.. of `tokens` (the full ones): k, v (layers, n_kv, T, d) hold tokens
        [first * block, first * block + T) of the prompt."""
        blocks = min(len(tokens) // self.block, first + k.shape[2] // self.block)
        keys = block_keys(tokens, blocks, self.block)
        for i in range(first, blocks):
            lo = (i - first) * self.block
            size = 2 * k[:, :, lo:lo + self.block].numel() * k.element_size()
            if keys[i] not in self.blocks and size <= self.capacity_bytes:
                self.blocks[keys[i]] = (k[:, :, lo:lo + self.block].clone(),
                                        v[:, :, lo:lo + self.block].clone())
                self.bytes += size
        for key in reversed(keys):                 # leaf first, root last (module docstring)
            if key in self.blocks:
                self.blocks.move_to_end(key)
        while self.bytes > self.capacity_bytes:
            _, (bk, _) = self.blocks.popitem(last=False)
            self.bytes -= 2 * bk.numel() * bk.element_size()


def _shared_uncached(prompts: list[list[int]], cache: PrefixCache) -> list[list[int]]:
    """The longest prefixes (whole blocks) that two or more prompts share and the cache lacks:
    prefilled first, so that a batch computes each shared prefix once."""
    chains = [block_keys(p, (len(p) - 1) // cache.block, cache.block) for p in prompts]
    count = collections.Counter(key for chain in chains for key in set(chain))
    wanted = {}
    for prompt, chain in zip(prompts, chains):
        depth = max((i + 1 for i, key in enumerate(chain) if count[key] > 1), default=0)
        if depth and chain[depth - 1] not in cache.blocks:
            wanted[chain[depth - 1]] = prompt[:depth * cache.block]
    return list(wanted.values())


def prefill(model, prompts: list[list[int]], extra: int, cache: PrefixCache | None, pad_id: int,
            dtype=None):
    """(KVCache with room for `extra` more tokens, logits (P, V) float32 of each prompt's last
    token)."""
    unique = list(dict.fromkeys(tuple(p) for p in prompts))
    if cache is not None:
        shared = _shared_uncached([list(p) for p in unique], cache)
        if shared:   # recursively: a prefix two of these share is computed once too (each level is
                     # shorter)
            prefill(model, shared, 0, cache, pad_id, dtype)
    kv, logits = _prefill_unique(model, [list(p) for p in unique], extra, cache, pad_id, dtype)
    return one_row_per_prompt(prompts, unique, kv, logits)


def one_row_per_prompt(prompts: list[list[int]], unique: list[tuple], kv, logits):
    """(kv, logits) of the distinct prompts `unique` (in that order) -> one row per prompt of
    `prompts`: identical prompts are prefilled once and their rows repeated."""
    where = {p: i for i, p in enumerate(unique)}
    rows = [where[tuple(p)] for p in prompts]
    if rows == list(range(len(unique))):
        return kv, logits
    return kv.select(rows), logits[torch.tensor(rows, device=logits.device)]


def _prefill_unique(model, prompts: list[list[int]], extra: int, cache: PrefixCache | None,
                    pad_id: int, dtype):
    device = model.device
    found = [cache.lookup(p) if cache is not None else [] for p in prompts]
    prefix = [len(f) * (cache.block if cache is not None else 0) for f in found]
    suffix = [p[n:] for p, n in zip(prompts, prefix)]
    P, S = max(prefix), max(len(s) for s in suffix)
    kv = model.new_cache(len(prompts), P + S + extra, dtype=dtype)
    for i, blocks in enumerate(found):
        if blocks:
            kv.k[:, i, :, P - prefix[i]:P] = torch.cat([b[0] for b in blocks], dim=2)
            kv.v[:, i, :, P - prefix[i]:P] = torch.cat([b[1] for b in blocks], dim=2)
            kv.key_mask[i, P - prefix[i]:P] = True
    kv.next_position = torch.tensor(prefix, dtype=torch.long, device=device)
    kv.length, kv.has_pads = P, P > 0 and min(prefix) < P
    ids = torch.tensor([[pad_id] * (S - len(s)) + s for s in suffix], dtype=torch.long,
                       device=device)
    mask = torch.tensor([[0] * (S - len(s)) + [1] * len(s) for s in suffix], dtype=torch.long,
                        device=device)
    hidden = model.hidden_states(ids, mask, kv)[:, -1]
    logits = model.lm_head(hidden).float()
    if cache is not None:
        for i, (p, s) in enumerate(zip(prompts, suffix)):
            lo = P + S - len(s)
            cache.store(p, prefix[i] // cache.block, kv.k[:, i, :, lo:P + S],
                        kv.v[:, i, :, lo:P + S])
    return kv, logits
