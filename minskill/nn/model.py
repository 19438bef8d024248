"""A decoder-only transformer (Llama, Qwen2/2.5, Qwen3): config, layers, KV cache and forward.

One module covers the three families; the checkpoint's config.json says which switches are on.
Module and parameter names equal Hugging Face's (model.embed_tokens,
model.layers.i.self_attn.q_proj, ...), so a checkpoint loads with a strict load_state_dict and a
saved model is read by any HF-compatible tool. Reading config.json and the safetensors files, and
writing them back, is minskill.nn.weights' job (`load_pretrained` / `save_pretrained`); this module
imports nothing else from minskill.

Per layer, with x of shape (B, T, H), n_h query heads, n_kv key/value heads, head size d:

    RMSNorm(x)   = w * x / sqrt(mean(x^2) + eps)                    (computed in float32)
    h            = x + Attention(RMSNorm(x))
    out          = h + MLP(RMSNorm(h)),   MLP(x) = W_down (silu(W_gate x) * W_up x)      (SwiGLU)

Attention (grouped-query: query head j reads key/value head j // (n_h / n_kv)):

    q = W_q x (+ b_q),  k = W_k x (+ b_k),  v = W_v x (+ b_v)   biases: qwen2; else attention_bias
    q, k = RMSNorm_head(q), RMSNorm_head(k)                      qwen3 only (q_norm, k_norm over d)
    q, k = RoPE(q, p), RoPE(k, p)                                p = position of the token
    o    = softmax(q k^T / sqrt(d) + causal/padding mask) v,   out = W_o o

RoPE, split-half convention (HF's: the released weights need no permutation), x = [x1, x2] halves:
    inv_freq_i = theta^(-2i/d),  angle_i = p * inv_freq_i,  c = cos(angle), s = sin(angle)
    RoPE(x, p) = [x1 * c - x2 * s,  x2 * c + x1 * s]
Llama 3 rope scaling rescales inv_freq by wavelength lambda_i = 2 pi / inv_freq_i, with context L0
(original_max_position_embeddings), factor f, low/high frequency factors a/b:
    lambda_i < L0 / b : unchanged;   lambda_i > L0 / a : inv_freq_i / f;
    otherwise smooth  = (L0 / lambda_i - a) / (b - a),
              inv_freq_i = (1 - smooth) inv_freq_i / f + smooth inv_freq_i

Logits = W_lm RMSNorm(h_last); tied embeddings: W_lm is the embedding matrix (no lm_head.weight on
disk).

Batches are LEFT padded: attention_mask (B, T) is 1 for tokens and 0 for padding, positions are
p = cumsum(mask) - 1, padded keys are masked out, and every query also sees itself (a pad row that
sees nothing would make softmax 0/0 = NaN). A preallocated KVCache makes decoding incremental.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# -----------------------------------------------------------------------------------------------
# config

@dataclass
class ModelConfig:
    """The fields of a HF config.json that this model reads (weights.config_from_hf reads the file,
    in all its historical layouts); `extra` keeps the whole original dict so that saving loses
    nothing."""
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None       # None, or {"rope_type": "llama3", factor,
                                           # low/high_freq_factor, ...}
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def qkv_bias(self) -> bool:   # Qwen2 always has q/k/v biases, whatever attention_bias says
        return self.model_type == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.model_type != "qwen2" and self.attention_bias

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """inv_freq_i = theta^(-2i/d), i < d/2, float32 on CPU; Llama 3 scaling applied when
    configured."""
    d = config.head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64, device="cpu").float() / d
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    if config.rope_scaling is None:
        return inv_freq
    s = config.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Split-half rotation. x (B, heads, T, d); cos, sin (B, 1, T, d/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# ------------------------------------------------------------------------------------------------
# cache

class KVCache:
    """Preallocated keys/values for all layers: k[i], v[i] have shape (B, n_kv_heads, max_len,
    head_dim).

    All rows share one write offset `length` (batches are left padded); `key_mask` marks which
    cached slots hold real tokens and `next_position` is each row's next RoPE position. Attention
    uses a cache through `update(layer, k, v)` and those fields only (gradient checkpointing also
    reads slots 0..length-1 of `k[layer]`, `v[layer]`: `checkpointed_layer`), so another store of
    keys/values can stand in for it; a store with a non-empty `prefixes` (the server's
    serve/cascade.py) adds prefixes that several rows share, kept once (attend_with_prefixes).
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int, dtype=torch.float32,
                 device=None):
        shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, max_len,
                 config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.next_position = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length, self.max_len = 0, max_len
        self.has_pads = False   # a slot below `length` holds a pad: kept on the host, so decoding
                                # never asks the device

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def update(self, layer: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write T new keys/values (B, n_kv, T, d) into slots length..length+T-1; return slots
        0..length+T-1."""
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def _with_rows(self, pick) -> "KVCache":
        new = KVCache.__new__(KVCache)
        new.k, new.v = pick(self.k, 1), pick(self.v, 1)
        new.key_mask, new.next_position = pick(self.key_mask, 0), pick(self.next_position, 0)
        new.length, new.max_len, new.has_pads = self.length, self.max_len, self.has_pads
        return new

    def repeat_interleave(self, n: int) -> "KVCache":
        """Row b becomes rows b*n .. b*n+n-1: n samples continue from one prefilled prompt."""
        return self._with_rows(lambda t, dim: t.repeat_interleave(n, dim=dim))

    def select(self, rows) -> "KVCache":
        """A cache holding only the given rows (in that order): drops finished samples from a
        batch."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.k.device)
        new = self._with_rows(lambda t, dim: t.index_select(dim, index))
        new.has_pads = not bool(new.key_mask[:, :new.length].all())   # the padded rows may be gone
        return new

    def mark_keys(self, T: int, attention_mask) -> bool:
        """Slots length..length+T-1 hold these tokens (all real when attention_mask is None);
        returns whether every key so far is real. Only a padded input looks at the device (once, at
        prefill), not a decoding step."""
        new_slots = slice(self.length, self.length + T)
        self.key_mask[:, new_slots] = True if attention_mask is None else attention_mask
        if attention_mask is not None:
            self.has_pads = self.has_pads or not bool(attention_mask.all())
        return not self.has_pads


# -----------------------------------------------------------------------------------------------
# layers

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """w * x / sqrt(mean(x^2) + eps), computed in float32, returned in x's dtype."""
    y = x.float()
    normed = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"config: num_attention_heads={self.n_heads} is not a multiple of "
                             f"num_key_value_heads={self.n_kv_heads}")
        self.group = self.n_heads // self.n_kv_heads
        H, hd = config.hidden_size, self.head_dim
        self.q_proj = nn.Linear(H, self.n_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(H, self.n_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(H, self.n_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, H, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, is_causal, cache: KVCache | None, layer: int):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        # (B, n_kv, T, d)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        # (B, n_h, T, d)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        # (B, n_kv, T, d)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        # one compute dtype for q, k, v: under autocast v_proj's output is bf16 while RoPE and
        # q/k-norm left q and k in float32; the fused SDPA kernels take one dtype (and a cache in
        # that dtype is not re-cast each step)
        q, k = q.to(v.dtype), k.to(v.dtype)
        # a cache that lays out keys its own way and attends over them itself
        if hasattr(cache, "attend"):
            o = cache.attend(layer, q, k, v)  # (serve/aligned.py: batch-invariant decoding)
            return self.o_proj(o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
        if cache is not None:  # the cache keeps this step's keys/values and returns all of them
            # (B, n_kv, S, d)
            k, v = cache.update(layer, k, v)
            k, v = k.to(q.dtype), v.to(q.dtype)      # a no-op unless a caller made the cache in
                                                     # another dtype
        prefixes = getattr(cache, "prefixes", None)
        if prefixes:   # some rows continue a shared prefix kept once (serve/cascade.py):
                       # attend_with_prefixes
            o = attend_with_prefixes(q, k, v, mask, is_causal, self.group, prefixes, layer)
            o = o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        elif T == 1 and self.group > 1:
            # One new token: the `group` query heads sharing a kv head become `group` query rows of
            # that head (same keys, same mask) -- one small matmul instead of a GQA kernel; fastest
            # on CPU.
            q = q.view(B, self.n_kv_heads, self.group, self.head_dim)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            o = o.reshape(B, 1, self.n_heads * self.head_dim)
        else:
            # (B, n_h, T, d)
            o = attend(q, k, v, mask, is_causal, self.group)
            o = o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(o)


# devices where a masked GQA attention repeats k/v to the query heads: a mask with enable_gqa rules
# out CUDA's fused kernels (flash takes no mask, memory-efficient no GQA), leaving the math kernel
# and its float32 (B, H, T, S) scores; on the CPU the GQA call is as fast and stays as it was
# (tests/test_model.py checks both agree)
EXPAND_KV_FOR_MASK = ("cuda",)


def attend(q, k, v, mask, is_causal: bool, group: int):
    """SDPA of q (B, n_h, T, d) over k, v (B, n_kv, S, d), n_h = group * n_kv; mask: None or bool,
    broadcast to (B, n_h, T, S). With a mask on CUDA, k and v are repeated per query head so that
    the memory-efficient kernel can run (docs/gpu.md); without one, flash takes GQA directly."""
    if group > 1 and mask is not None and q.device.type in EXPAND_KV_FOR_MASK:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        group = 1
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                          enable_gqa=group > 1)


def attend_with_prefixes(q, k, v, mask, is_causal: bool, group: int, prefixes, layer: int):
    """Attention of q (B, n_h, T, d) over each row's own keys k, v (B, n_kv, S, d) (mask,
    is_causal: as for SDPA) and, for the rows of each shared prefix, over that prefix's keys first:
    prefixes is a list of (rows: a slice or an (R,) long tensor, pk, pv (layers, n_kv, P, d)), a
    row in at most one; every query sees all of its prefix (it comes first).

    At decoding (T = 1) the prefix's keys/values are read once for all its rows (one matmul of all
    their queries), not once per row; a prefill (T > 1) copies them before each row's keys for
    SDPA's fused kernel. Exactly softmax over [prefix keys, own keys]: each part gives its running
    max m, sum l = sum exp(s - m) and unnormalised output o = sum exp(s - m) v, merged as m =
    max(m1, m2), l = l1 e^(m1-m) + l2 e^(m2-m), o likewise, out = o / l (log-sum-exp merge; scores
    and sums in float32)."""
    B, n_h, T, d = q.shape
    n_kv, scale = k.shape[1], 1.0 / math.sqrt(d)
    if T > 1:   # a prefill (once per join): each row's prefix copied before its keys, one fused
                # SDPA call
        return _attend_prefix_copied(q, k, v, mask, is_causal, group, prefixes, layer)
    # scores in float32 whatever the cache's dtype (a bf16 matmul would round them to 8 bits first)
    qf = q.float().reshape(B, n_kv, group * T, d)  # row g*T + t of kv head h: query head h*group +
                                                   # g, token t
    # (B, n_kv, group*T, S)
    s = (qf @ k.float().transpose(-1, -2)) * scale
    if mask is not None:   # one query a row, so never is_causal; (T, S) or (B, 1, T, S), repeated
                           # per group row
        s = s.masked_fill(~mask.repeat(*[1] * (mask.dim() - 2), group, 1), float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    # (.., 1), (.., d)
    l, o = e.sum(-1, keepdim=True), e @ v.float()
    for rows, pk, pv in prefixes:
        qr = qf[rows]                               # rows: a slice (a view) or an index tensor
        R = qr.shape[0]
        qr = qr.transpose(0, 1).reshape(n_kv, R * group * T, d)
        # (n_kv, R*group*T, P)
        sp = (qr @ pk[layer].float().transpose(-1, -2)) * scale
        mp = sp.amax(-1, keepdim=True)
        ep = torch.exp(sp - mp)
        lp, op = ep.sum(-1, keepdim=True), ep @ pv[layer].float()
        mp, lp, op = (x.view(n_kv, R, group * T, x.shape[-1]).transpose(0, 1) for x in (mp, lp, op))
        m_r = m[rows]
        top = torch.maximum(m_r, mp)
        a, b = torch.exp(m_r - top), torch.exp(mp - top)
        # m, l, o are this call's own tensors
        l[rows], o[rows] = l[rows] * a + lp * b, o[rows] * a + op * b
        m[rows] = top
    return (o / l).to(q.dtype).view(B, n_h, T, d)


def _attend_prefix_copied(q, k, v, mask, is_causal: bool, group: int, prefixes, layer: int):
    """attend_with_prefixes for T > 1 queries a row: [prefix (right-aligned in Pmax slots, the rest
    masked), own keys] per row, then `attend` (SDPA's fused kernels do many queries faster than the
    split softmax)."""
    B, _, T, _ = q.shape
    S, P = k.shape[2], max(pk.shape[2] for _, pk, _ in prefixes)
    kf, vf = k.new_zeros(B, k.shape[1], P + S, k.shape[3]), v.new_zeros(B, v.shape[1], P + S,
                                                                        v.shape[3])
    kf[:, :, P:], vf[:, :, P:] = k, v
    seen = torch.zeros(B, P, dtype=torch.bool, device=q.device)
    for rows, pk, pv in prefixes:
        n = pk.shape[2]
        kf[rows, :, P - n:P] = pk[layer].to(k.dtype).unsqueeze(0)
        vf[rows, :, P - n:P] = pv[layer].to(v.dtype).unsqueeze(0)
        seen[rows, P - n:] = True
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device) if not is_causal else \
            torch.arange(S, device=q.device)[None, :] <= torch.arange(S - T, S,
                                                                      device=q.device)[:, None]
    own = mask.expand(B, 1, T, S)                 # (T, S) or (B, 1, T, S)
    full = torch.cat([seen[:, None, None, :].expand(B, 1, T, P), own], dim=-1)
    return attend(q, kf, vf, full, False, group)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        H, I, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(H, I, bias=bias)
        self.up_proj = nn.Linear(H, I, bias=bias)
        self.down_proj = nn.Linear(I, H, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, is_causal, cache=None, layer=0):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, is_causal, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def attention_mask_for(key_mask: torch.Tensor | None, T: int, offset: int,
                       all_real: bool | None = None):
    """(mask, is_causal) for SDPA: T queries at slots offset..offset+T-1 over keys 0..offset+T-1.

    key_mask (B, S) marks real keys (None = all real; all_real: whether it is all True, when the
    caller knows). Returns None masks where SDPA's fast paths apply.
    """
    device = key_mask.device if key_mask is not None else None
    if key_mask is None or (bool(key_mask.all()) if all_real is None else all_real):
        if T == 1:
            return None, False          # a single new token may see every cached one
        if offset == 0:
            return None, True           # plain causal prefill
        key_mask = None
    S = offset + T
    q_pos = torch.arange(offset, S, device=device)[:, None]
    k_pos = torch.arange(S, device=device)[None, :]
    allowed = k_pos <= q_pos                                                   # (T, S) causal
    if key_mask is None:
        return allowed, False
    # (B, T, S); pads see themselves
    allowed = (allowed & key_mask[:, None, :]) | (k_pos == q_pos)
    return allowed[:, None], False                                             # (B, 1, T, S)


class _NewKeysValues:
    """Stands in for a cache inside a checkpointed layer: attention sees the cached keys/values
    plus this step's, nothing is stored, and this step's keys/values are kept for the caller to
    store (once)."""

    def __init__(self, past_k, past_v):
        self.past_k, self.past_v, self.new = past_k, past_v, None

    def update(self, layer, k, v):
        self.new = (k, v)
        if self.past_k is None:
            return k, v
        return torch.cat([self.past_k, k], dim=2), torch.cat([self.past_v, v], dim=2)


def checkpointed_layer(layer: DecoderLayer, x, cos, sin, mask, is_causal, cache,
                       i: int) -> torch.Tensor:
    """`layer(x, ...)` with its activations recomputed in the backward instead of kept (gradient
    checkpointing).

    With a cache, the recomputation must not store this step's keys/values a second time, so the
    checkpointed function has no side effect: it takes the cached keys/values (slots 0..length-1 of
    `cache.k[i]`, `cache.v[i]`: KVCache and shared_prefix.DifferentiableKV both keep them so) as
    inputs and returns the layer output with this step's keys/values, which the cache stores here,
    outside the checkpoint."""
    if cache is None:
        return checkpoint(layer, x, cos, sin, mask, is_causal, use_reentrant=False)
    past = (cache.k[i][:, :, :cache.length], cache.v[i][
                                                        :, :,
                                                        :cache.length]) if cache.length else (None,
                                                                None)

    def run(x, cos, sin, mask, past_k, past_v):
        step_kv = _NewKeysValues(past_k, past_v)
        return (layer(x, cos, sin, mask, is_causal, step_kv, i), *step_kv.new)

    out, k, v = checkpoint(run, x, cos, sin, mask, *past, use_reentrant=False)
    cache.update(i, k, v)
    return out


# ------------------------------------------------------------------------------------------------
# model

class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope_inv_freq = rope_inv_freq(config)  # plain float32 tensor, not a buffer: .to(bf16)
                                                    # must not round it
        self.gradient_checkpointing = False

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def new_cache(self, batch_size: int, max_len: int, dtype=None, device=None) -> KVCache:
        return KVCache(self.config, batch_size, max_len, dtype or self.dtype, device or self.device)

    def hidden_states(self, input_ids, attention_mask=None,
                      cache: KVCache | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, H) final-normed hidden states. See the module docstring for
        padding."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, time), got shape {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids "
                                 f"shape {tuple(input_ids.shape)}")
            attention_mask = attention_mask.to(device=input_ids.device, dtype=torch.bool)
        offset, all_real = 0, None
        if cache is not None:
            offset = cache.length
            if cache.batch_size != B:
                raise ValueError(f"cache holds {cache.batch_size} rows but input_ids has {B}")
            if offset + T > cache.max_len:
                raise ValueError(f"cache overflow: {offset} cached + {T} new tokens > max_len "
                                 f"{cache.max_len}")
            if isinstance(cache, KVCache):
                all_real = cache.mark_keys(T, attention_mask)
            else:   # another store of keys/values (nn/shared_prefix.py): attention_mask_for looks
                cache.key_mask[:, offset:offset
                               + T] = True if attention_mask is None else attention_mask
            key_mask = cache.key_mask[:, :offset + T]
        else:
            key_mask = attention_mask

        # positions p = (cache offset) + cumsum(mask) - 1; pads get a harmless clamp to >= 0
        if attention_mask is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        else:
            positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)
        if cache is not None:
            positions = positions + cache.next_position[:, None]
            cache.next_position += T if attention_mask is None else attention_mask.sum(1)

        if self.rope_inv_freq.device != input_ids.device:
            self.rope_inv_freq = self.rope_inv_freq.to(input_ids.device)
        # (B, 1, T, d/2), once per call
        angles = positions[:, None, :, None].float() * self.rope_inv_freq
        x = self.model.embed_tokens(input_ids)                                   # (B, T, H)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        mask, is_causal = attention_mask_for(key_mask, T, offset, all_real)

        for i, layer in enumerate(self.model.layers):
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpointed_layer(layer, x, cos, sin, mask, is_causal, cache, i)
            else:
                x = layer(x, cos, sin, mask, is_causal, cache, i)
        if cache is not None:
            cache.length += T
        return self.model.norm(x)

    def forward(self, input_ids, attention_mask=None, cache: KVCache | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) logits in the model's dtype."""
        return self.lm_head(self.hidden_states(input_ids, attention_mask, cache))
