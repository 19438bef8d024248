"""The batch-invariant engine's decoding step in a fraction of the plain step's ops, with its bits.

The plain step, `Transformer(ids, cache=AlignedCache)` (nn.model, serve.aligned), is written for
every case the model meets: prefill or decoding, padded rows, LoRA, training. A decoding step of a
quantized model on the server meets one case: B rows, one new token each, every key real. On a
CPU, the step of the 135M default model is then mostly Python and op dispatch around small
kernels (docs/benchmarks.md: the profile). `LeanDecoder.step` computes the same thing with the
same arithmetic in fewer ops. For x (B, H) the rows' hidden states, per layer:

    h = RMSNorm(x)                                       (the same formula: nn.model.RMSNorm)
    [q | k | v] = h [W_q | W_k | W_v]ᵀ                   one product for three (quantize.stacked)
    [q | k] ← [q | k] ⊙ cos' + roll([q | k]) ⊙ sin'      RoPE on q and k at once
    K[b, p_b], V[b, p_b] ← k_b, v_b                      row b's new key at its position p_b
    o = Attention(q, K, V)                               as AlignedCache.attend decodes
    x ← x + o W_oᵀ
    [g | u] = RMSNorm(x) [W_gate | W_up]ᵀ                one product for two
    x ← x + (silu(g) ⊙ u) W_downᵀ

with cos' = [cos, cos] and sin' = [−sin, sin] over the two halves of a head, so that each output
is apply_rope's x₁·cos − x₂·sin (or x₂·cos + x₁·sin): the same two products and one sum, rounded
the same way. A stacked product gives each output the bits it had alone (both weight-only kernels
compute an output from its own row of codes), so every logit equals the plain step's, bit for bit,
at every batch (tests/test_lean_decode.py). Prefill stays on the plain path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minskill.nn.model import rms_norm
from minskill.nn.quantize import WeightOnlyLinear, stacked
from minskill.serve.aligned import AlignedCache


class LeanDecoder:
    """`step(ids, cache)`: the next-token logits (B, V) float32 of a decoding step (module
    docstring). Build it with `LeanDecoder.of(model)`, which says None where the model is not a
    case it covers."""

    @classmethod
    def of(cls, model) -> "LeanDecoder | None":
        """A decoder for `model`, or None: weights not quantized with a kernel (float weights keep
        the plain step: their GEMMs change bits with the product's shape), q/k norms (Qwen3)."""
        layers = []
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            if hasattr(attention, "q_norm"):
                return None
            qkv = stacked([attention.q_proj, attention.k_proj, attention.v_proj])
            gate_up = stacked([mlp.gate_proj, mlp.up_proj])
            if qkv is None or gate_up is None or not all(
                    isinstance(p, WeightOnlyLinear) and p.use_kernel
                    for p in (attention.o_proj, mlp.down_proj)):
                return None
            layers.append((layer.input_layernorm.weight, qkv, attention.o_proj,
                           layer.post_attention_layernorm.weight, gate_up, mlp.down_proj))
        return cls(model, layers)

    def __init__(self, model, layers: list):
        self.model, self.layers = model, layers
        config = model.config
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.eps = config.head_dim, config.rms_norm_eps
        self.intermediate = config.intermediate_size

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, cache: AlignedCache) -> torch.Tensor:
        """ids (B, 1): each row's new token -> (B, V) float32 logits of the token after it."""
        B, n_h, n_kv, d = ids.shape[0], self.n_heads, self.n_kv_heads, self.head_dim
        check_room(cache)
        x = self.model.model.embed_tokens(ids[:, 0])                                # (B, H)
        angles = cache.next_position[:, None].float() * self.model.rope_inv_freq      # (B, d/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        cos, sin = torch.cat([cos, cos], -1)[:, None], torch.cat([-sin, sin], -1)[:, None]
        cache.next_position += 1   # as the plain step does before its layers (cache.attend)
        for i, (norm_in, qkv_proj, o_proj, norm_post, gate_up_proj, down_proj) in \
                enumerate(self.layers):
            qkv = qkv_proj.rows(rms_norm(x, norm_in, self.eps))
            qk = qkv[:, :(n_h + n_kv) * d].view(B, n_h + n_kv, d)
            qk = qk * cos + qk.roll(d // 2, -1) * sin
            v = qkv[:, (n_h + n_kv) * d:].view(B, n_kv, 1, d)
            o = cache.attend(i, qk[:, :n_h, None], qk[:, n_h:, None], v)        # (B, n_h, 1, d)
            x = x + o_proj.rows(o.reshape(B, n_h * d))
            gate, up = gate_up_proj.rows(rms_norm(x, norm_post, self.eps)).split(
                self.intermediate, dim=-1)
            x = x + down_proj.rows(F.silu(gate) * up)
        cache.length += 1
        return self.model.lm_head(rms_norm(x, self.model.model.norm.weight, self.eps)).float()


def check_room(cache: AlignedCache) -> None:
    """A decoding step writes one key a row: the cache must have a slot for it."""
    if cache.length + 1 > cache.max_len:
        raise ValueError(f"cache overflow: {cache.length} cached + 1 new token > max_len "
                         f"{cache.max_len}")
