"""Opt-in compiled decoding (`generate(..., compiled=True)`, `--compile-decode`): a static KV cache
and one `torch.compile`d decoding step, as gpt-fast does, so that a step's element-wise ops run as
a few fused kernels and, on a GPU, the whole step is one CUDA-graph replay (a Qwen3-0.6B shape's
step: 466 kernel calls instead of 1,712 on the CPU, docs/gpu.md). Off the teaching path: the eager
step in nn/model.py is the reference, and this one computes the same equations with the same
layers and weights (no copy of the model).

Why it is fast: a compiled program needs tensors whose shapes do not change, so
  1. the cache is static: keys/values (R, n_kv, S_max, d) a layer, with S_max the prompt width plus
     the new tokens rounded up to LENGTH_BUCKET, kept between calls (one per R, while S_max still
     fits: new tensors would re-record the CUDA graph; the memory stays held);
  2. a step feeds one token to every one of the R rows (a finished row gets a pad; its output is
     ignored) and never drops rows, where the eager loop shrinks the batch as rows finish;
  3. the slot written and each row's position are device tensors that the step advances itself,
     so no Python number changes between steps.
Then `torch.compile(step, fullgraph=True)`: on CUDA with mode "reduce-overhead" (CUDA graphs: the
whole step is one replay), on the CPU inductor's C++ kernels. Inductor fuses the element-wise ops:
RMSNorm's square, mean, rsqrt, scale and cast become part of one kernel (the fused RMSNorm), as do
RoPE and SwiGLU's silu(g) * u; the matrix products and attention stay library calls.

The step, for tokens x_b at slot s (one slot for all rows: batches are left padded) and row
positions p_b, with each layer's own modules (DecoderLayer.forward, unchanged):
    key_mask[b, s] = 1;   cos, sin = RoPE angles of p_b
    per layer: q, k, v as in Attention.forward;   K[b, :, s] = k_b,  V[b, :, s] = v_b
               o = softmax(q K^T / sqrt(d) + log key_mask) V    over all S_max slots (unfilled
               slots are masked, so the sum is the eager one over slots 0..s)
    logits = W_lm RMSNorm(h);   s += 1,  p_b += 1
The attention is the eager decoding step's (a kv head's `group` query heads as `group` query rows),
the sampling rule is sampling.py's own (_sample_step runs on these logits, eager): greedy tokens
equal the eager path's up to float rounding (tests/test_compiled_decode.py).

Not covered, refused by name (`check_model`): LoRA adapters and int8/int4 weights (their layers
are not what this was checked on), devices other than CPU and CUDA. On the CPU inductor needs a
C++ compiler; a failed compile says so (`CompiledDecodeError`).
"""
from __future__ import annotations

import collections
import weakref

import torch
import torch.nn.functional as F

LENGTH_BUCKET = 256    # S_max is a multiple of this: prompts of other widths reuse the program
_STATIC = weakref.WeakKeyDictionary()   # model -> {rows R: its StaticKV}, reused while they fit
_COMPILED = {}                          # device type -> the compiled step


class CompiledDecodeError(ValueError):
    """Compiled decoding cannot run here; the message names why and the way out (a ValueError: the
    scripts print it as they print bad input)."""


class StaticDecoder:
    """Stands in for generate()'s KVCache after the prefill: `step(ids)` feeds one token (R, 1) to
    every row and returns the logits (R, V) float32. Its rows never change (sampling.py keeps the
    finished ones)."""

    def __init__(self, model, cache):
        check_model(model)
        self.model = model
        self.kv = StaticKV.holding(model, cache)
        self.length, self.max_len = cache.length, self.kv.k[0].shape[2]

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        if self.length >= self.max_len:
            raise ValueError(f"compiled decoding: cache overflow: {self.length} cached + 1 > "
                             f"max_len {self.max_len}")
        self.length += 1
        if ids.device.type == "cuda":   # the last step's output is read (indexed: a copy) already
            torch.compiler.cudagraph_mark_step_begin()
        return compiled_step(self.model.device)(self.model, self.kv, ids)


def check_model(model) -> None:
    """Refuse, by name, what the compiled step does not cover (module docstring)."""
    where = "compiled decoding (--compile-decode)"
    kinds = {type(m).__name__ for m in model.modules()}
    if "LoRALinear" in kinds:
        raise CompiledDecodeError(f"{where} does not cover LoRA adapters (LoRALinear): merge them "
                                  f"(lora.merged_model) or run without --compile-decode")
    quantized = sorted(kinds & {"Int8Linear", "Int4Linear"})
    if quantized:
        raise CompiledDecodeError(f"{where} does not cover quantized weights ({quantized[0]}): "
                                  f"run without --compile-decode")
    if model.device.type not in ("cpu", "cuda"):
        raise CompiledDecodeError(f"{where} runs on cpu or cuda, not {model.device.type}: run "
                                  f"without --compile-decode")


class StaticKV:
    """The static cache: k, v (a list of layers of (R, n_kv, S_max, d)), key_mask (R, S_max),
    next_position (R,), slot (1,): the slot the next token is written to. Attention.forward hands
    a cache that has `attend` the new q, k, v of a layer (as for serve/aligned.py)."""

    @classmethod
    def holding(cls, model, cache) -> "StaticKV":
        """The model's static cache of R rows (one per R: a training step's rows and a probe's
        alternate, and new tensors would re-record the CUDA graph), (re)allocated when its dtype or
        length do not fit, holding a copy of the prefilled `cache` (slots past its length
        masked)."""
        rows, need = cache.k.shape[1], cache.max_len
        kv = _STATIC.setdefault(model, {}).get(rows)
        if kv is None or kv.k[0].shape[2] < need or kv.k[0].dtype != cache.k.dtype or \
                kv.k[0].device != cache.k.device:
            kv = cls(cache, -(-need // LENGTH_BUCKET) * LENGTH_BUCKET)
            _STATIC[model][rows] = kv
        n = cache.max_len
        for layer, (k, v) in enumerate(zip(kv.k, kv.v)):
            k[:, :, :n], v[:, :, :n] = cache.k[layer], cache.v[layer]
        kv.key_mask.zero_()
        kv.key_mask[:, :n] = cache.key_mask
        kv.next_position.copy_(cache.next_position)
        kv.slot.fill_(cache.length)
        return kv

    def __init__(self, cache, max_len: int):
        layers, rows, n_kv, _, d = cache.k.shape
        device = cache.k.device
        # one tensor a layer (as gpt-fast): a step's write into a graph input, not into a view of
        # one, which inductor would copy back whole
        self.k = [torch.zeros(rows, n_kv, max_len, d, dtype=cache.k.dtype, device=device)
                  for _ in range(layers)]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.key_mask = torch.zeros(rows, max_len, dtype=torch.bool, device=device)
        self.next_position = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        for t in (*self.k, *self.v, self.key_mask, self.next_position, self.slot):
            # CUDA graphs read them in place, not copied (new tensors: the graph is re-recorded)
            torch._dynamo.mark_static_address(t)

    def attend(self, layer: int, q, k, v):
        """Write this step's k, v (R, n_kv, 1, d) at `slot`; attend q (R, n_h, 1, d) over all S_max
        slots, the unfilled ones masked; (R, n_h, 1, d)."""
        keys, values = self.k[layer], self.v[layer]
        keys.index_copy_(2, self.slot, k.to(keys.dtype))
        values.index_copy_(2, self.slot, v.to(values.dtype))
        R, n_h, _, d = q.shape
        n_kv = keys.shape[1]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        o = F.scaled_dot_product_attention(q.reshape(R, n_kv, n_h // n_kv, d), keys, values,
                                           attn_mask=self.key_mask[:, None, None, :])
        return o.reshape(R, n_h, 1, d)


def compiled_step(device: torch.device):
    """decode_step compiled for the device type (once per process; torch.compile guards on the
    model and shapes, recompiling only when they change)."""
    kind = device.type
    if kind not in _COMPILED:
        # CUDA graphs on a GPU; on a CPU the fused kernels show in torch.profiler (kernel_calls)
        how = dict(mode="reduce-overhead") if kind == "cuda" else \
            dict(options={"cpp.enable_kernel_profile": True})
        _COMPILED[kind] = _failing_clearly(torch.compile(decode_step, fullgraph=True, **how), kind)
    return _COMPILED[kind]


def _failing_clearly(step, kind: str):
    """`step`, its compile's failures (tracing, inductor, the C++ or Triton compiler) raised as a
    CompiledDecodeError that says how to run without; errors of the run itself pass through."""
    def run(*args):
        try:
            return step(*args)
        except torch._dynamo.exc.TorchDynamoException as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            hint = " (on a CPU, inductor needs a C++ compiler: gcc or clang on PATH)" \
                if kind == "cpu" else ""
            raise CompiledDecodeError(f"compiled decoding failed on {kind}{hint}: "
                                      f"{type(error).__name__}: {first}; run without "
                                      f"--compile-decode") from error
    return run


def decode_step(model, kv: StaticKV, ids: torch.Tensor) -> torch.Tensor:
    """One token per row, ids (R, 1) -> logits (R, V) float32 (module docstring); advances the
    slot and the positions in place."""
    kv.key_mask.index_fill_(1, kv.slot, True)
    angles = kv.next_position[:, None, None, None].float() * model.rope_inv_freq   # (R, 1, 1, d/2)
    x = model.model.embed_tokens(ids)                                                # (R, 1, H)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    for i, layer in enumerate(model.model.layers):
        x = layer(x, cos, sin, None, False, kv, i)
    kv.next_position.add_(1)
    kv.slot.add_(1)
    return model.lm_head(model.model.norm(x))[:, 0].float()


# -----------------------------------------------------------------------------------------------
# measuring: kernel calls per decoding step (tests/test_compiled_decode.py, docs/gpu.md)

# ops that compute nothing (views, metadata, allocation): no kernel on a GPU either
_NO_KERNEL = {"aten::" + name for name in (
    "view", "as_strided", "_reshape_alias", "_unsafe_view", "reshape", "t", "transpose", "expand",
    "unsqueeze", "squeeze", "select", "slice", "alias", "detach", "detach_", "lift_fresh",
    "resolve_conj", "resolve_neg", "empty", "empty_strided", "empty_like", "result_type",
    "permute", "split", "chunk", "narrow", "unbind", "contiguous", "to", "_to_copy", "linear",
    "matmul", "numpy_T", "split_with_sizes", "expand_as", "view_as",
    "_has_compatible_shallow_copy_type", "resize_")}
_OWN_KERNEL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::sum"}


def kernel_calls(events) -> collections.Counter:
    """The kernels in a CPU profile's events, by name: aten ops that compute (not in _NO_KERNEL)
    and inductor's fused C++ kernels (compiled_step has them recorded). An op that calls others
    that compute counts as its callees only (aten::mean as its sum and div_), except the products
    and sums that also run their own kernel (_OWN_KERNEL: aten::mm beside the clone of an input)."""
    found = collections.Counter()

    def count(event) -> int:
        below = sum(count(child) for child in event.cpu_children)
        name = event.name
        computes = "cpp_fused" in name or (name.startswith("aten::") and name not in _NO_KERNEL)
        if computes and (not below or name in _OWN_KERNEL):
            found[name] += 1
            return below + 1
        return below
    for event in events:
        if event.cpu_parent is None:
            count(event)
    return found


def kernels_per_step(decode, steps: tuple = (4, 12)) -> dict[str, float]:
    """Kernel calls by name per decoding step: decode(tokens) generates `tokens` tokens a row (a
    generate() call); the difference of two profiled calls of steps[0] and steps[1] tokens, over
    their difference, leaves the prefill out."""
    def profiled(tokens: int) -> collections.Counter:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            decode(tokens)
        return kernel_calls(profile.events())
    decode(2)   # warm: the compile, the static cache
    short, long = profiled(steps[0]), profiled(steps[1])
    return {name: (long[name] - short[name]) / (steps[1] - steps[0])
            for name in long | short if long[name] != short[name]}
