"""Shared prefixes kept once in the engine's running batch (cascade attention), and the prefill
that builds them.

Rollouts under a skill set are many sequences after the same ~1,000-token system prompt. A KVCache
row per sequence holding its own copy of that prefix makes every decoding step read the prefix's
keys/values once per row (16 rows x 1,000 keys: more bytes than the weights), and makes the whole
batch as wide as its longest prompt. `CascadeCache` is a KVCache whose slots hold each row's *own*
tokens, plus `shared`: key -> (k, v) (layers, n_kv, P, d) of a prompt prefix, stored once, and
`group_of[row]`: the key of the prefix the row continues (None: none, its slots hold its whole
prompt). The model's attention reads `prefixes` = [(rows, k, v)] (rows: a slice when consecutive,
else an index tensor) (nn.model.attend_with_prefixes): all the queries of a prefix's rows meet its
keys in one matmul, and the two parts of each row's softmax are merged exactly (log-sum-exp).

Which prefix a prompt continues (`prefill_shared`): the longest run of whole blocks (of
prompt[:-1], as prefix_cache looks up) that it shares with another running or joining sequence (n
samples of one prompt share all of it); when it shares none, its own whole blocks, so that a long
prompt alone does not widen the batch either. A prefix shorter than MIN_SHARED_TOKENS stays in the
row's slots (cheaper than one more matmul per layer). The prefix is computed and stored in the
PrefixCache first when it is not there (prefix_cache.prefill), then taken from it: its key, a block
chain's digest, names exactly its tokens, and a newcomer whose prefix is already running joins that
group.

Invariants.
  * Row i's real slots hold its tokens [P_i, next_position_i) in order (masked pads may lie between
    them), P_i the length of shared[group_of[i]] (0 when None): the cached blocks of its prompt
    after P_i are copied into its slots (laid out as prefix_cache.prefill lays them), the rest is
    computed. Positions are the whole sequence's (next_position counts the prefix), so a row's
    keys, values and scores are those of a row holding its prefix in its slots, to float rounding.
  * `shared` holds exactly the prefixes some row continues; select and merge keep group_of (and so
    `prefixes`) in row order; a cache no row of which has a prefix is a plain KVCache (with_groups).
  * The prefixes' tensors are never written (a row's new keys go to its own slots).
"""
from __future__ import annotations

import collections

import torch

from minskill.nn.model import KVCache
from minskill.serve.prefix_cache import (PrefixCache, block_keys, one_row_per_prompt,
                                         prefill as prefill_blocks)

MIN_SHARED_TOKENS = 64


class CascadeCache(KVCache):
    """A KVCache of the rows' own tokens, plus the shared prefixes they continue (module
    docstring)."""
    shared: dict
    group_of: list
    prefixes: list

    def select(self, rows) -> KVCache:
        rows = [int(r) for r in rows]
        return with_groups(KVCache.select(self, rows), self.shared,
                           [self.group_of[i] for i in rows])

    def repeat_interleave(self, n: int) -> KVCache:
        return with_groups(KVCache.repeat_interleave(self, n), self.shared,
                           [g for g in self.group_of for _ in range(n)])


def groups_of(cache: KVCache) -> tuple[dict, list]:
    """(shared, group_of) of a cache: none for a plain KVCache."""
    if isinstance(cache, CascadeCache):
        return cache.shared, cache.group_of
    return {}, [None] * cache.batch_size


def with_groups(kv: KVCache, shared: dict, group_of: list) -> KVCache:
    """kv's slots with these rows' shared prefixes (a plain KVCache when no row has one)."""
    if all(g is None for g in group_of):
        if isinstance(kv, CascadeCache):
            plain = KVCache.__new__(KVCache)
            plain.__dict__.update({k: v for k, v in kv.__dict__.items()
                                   if k not in ("shared", "group_of", "prefixes")})
            return plain
        return kv
    new = CascadeCache.__new__(CascadeCache)
    new.__dict__.update(kv.__dict__)
    new.group_of = list(group_of)
    rows = collections.defaultdict(list)
    for i, g in enumerate(group_of):
        if g is not None:
            rows[g].append(i)
    new.shared = {g: shared[g] for g in rows}
    # a run of consecutive rows is a slice (a view at each step, no gather), others an index tensor
    new.prefixes = [(slice(r[0], r[-1] + 1) if r[-1] - r[0] == len(r) - 1 else
                     torch.tensor(r, dtype=torch.long, device=kv.k.device),
                     *shared[g]) for g, r in rows.items()]
    return new


def prefill_shared(model, prompts: list[list[int]], extra: int, cache: PrefixCache, pad_id: int,
                   dtype, running: list[list[int]] = (), shared: dict | None = None):
    """(cache of these prompts' rows, room for `extra` more tokens; logits (P, V) float32 of their
    last tokens). running: the prompts of the rows already decoding (a prefix they share with a
    newcomer is shared); shared: their prefixes (reused, so a newcomer joins a group already
    running)."""
    block, shared = cache.block, dict(shared or {})
    chains = [block_keys(p, (len(p) - 1) // block, block) for p in prompts]
    count = collections.Counter(
        key
        for chain in chains + [block_keys(p, (len(p) - 1) // block, block) for p in running]
        for key in set(chain)
    )
    depth = []
    for chain in chains:
        d = max((i + 1 for i, key in enumerate(chain) if count[key] > 1), default=0) or len(chain)
        depth.append(d if d * block >= MIN_SHARED_TOKENS else 0)
    missing = {chain[d - 1]: p[:d * block] for p, chain, d in zip(prompts, chains, depth)
               if d and chain[d - 1] not in cache.blocks and chain[d - 1] not in shared}
    if missing:   # the prefixes computed first (each once: prefix_cache.prefill shares within a
                  # batch) and stored
        prefill_blocks(model, list(missing.values()), 0, cache, pad_id, dtype)
    unique = list(dict.fromkeys(tuple(p) for p in prompts))
    group_of, prefix, own = [], [], []
    for p in unique:
        i = prompts.index(list(p))
        d, key = depth[i], None
        found = cache.lookup(list(p))               # the longest cached prefix (fewer blocks when
                                                    # evicted)
        if d and chains[i][d - 1] in shared:
            key = chains[i][d - 1]
        elif d and min(d, len(found)) * block >= MIN_SHARED_TOKENS:
            d = min(d, len(found))
            key = chains[i][d - 1]
            shared[key] = (torch.cat([b[0] for b in found[:d]], dim=2),
                           torch.cat([b[1] for b in found[:d]], dim=2))
        group_of.append(key)
        prefix.append(0 if key is None else shared[key][0].shape[2])
        own.append(found[prefix[-1] // block:])     # cached blocks after the shared prefix: into
        # the row's slots
    cached = [len(o) * block for o in own]
    suffix = [list(p[n + c:]) for p, n, c in zip(unique, prefix, cached)]
    C, S = max(cached), max(len(s) for s in suffix)
    kv = with_groups(model.new_cache(len(unique), C + S + extra, dtype=dtype), shared, group_of)
    device = kv.k.device
    for i, blocks in enumerate(own):                # row i: [C - c_i, C) cached, [C + S - s_i, C +
                                                    # S) computed
        if blocks:
            kv.k[:, i, :, C - cached[i]:C] = torch.cat([b[0] for b in blocks], dim=2)
            kv.v[:, i, :, C - cached[i]:C] = torch.cat([b[1] for b in blocks], dim=2)
            kv.key_mask[i, C - cached[i]:C] = True
    kv.next_position = torch.tensor([n + c for n, c in zip(prefix, cached)], dtype=torch.long,
                                    device=device)
    kv.length, kv.has_pads = C, C > 0 and min(cached) < C
    ids = torch.tensor([[pad_id] * (S - len(s)) + s for s in suffix], dtype=torch.long,
                       device=device)
    mask = torch.tensor([[0] * (S - len(s)) + [1] * len(s) for s in suffix], dtype=torch.long,
                        device=device)
    logits = model.lm_head(model.hidden_states(ids, mask, kv)[:, -1]).float()
    for i, (p, s) in enumerate(zip(unique, suffix)):
        lo = C + S - len(s)
        cache.store(list(p), (prefix[i] + cached[i]) // block, kv.k[:, i, :, lo:C + S],
                    kv.v[:, i, :, lo:C + S])
    return one_row_per_prompt(prompts, unique, kv, logits)
