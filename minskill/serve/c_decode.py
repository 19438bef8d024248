"""The batch-invariant engine's decoding step with its small ops in C: the same step as
serve.lean_decode, fewer calls, other bits.

On a CPU, one request's decoding step of the 135M default model spends most of its time around its
weight products: the norms, RoPE, the key writes and attention are some 35 small torch ops a layer,
each a Python call and a dispatch (docs/benchmarks.md: the profile). Here each of them is one C
call a layer (serve/decode_kernels.c, compiled once with the machine's C compiler), and the weight
products stay torch's int4/int8 kernels. For x (B, H) the rows' bfloat16 hidden states, per layer:

    x ← x + δ;  h = RMSNorm(x)                           add_rms_norm (δ: last layer's output)
    [q | k | v] = h [W_q | W_k | W_v]ᵀ                   torch's kernel (quantize.stacked)
    [q | k] ← RoPE([q | k]);  K[b, p_b], V[b, p_b] ← k, v
    o = Σ_{s ≤ p_b} softmax_s(q·K_s / √d) V_s             decode_attention
    δ = o W_oᵀ;  x ← x + δ;  h = RMSNorm(x)              add_rms_norm
    [g | u] = h [W_gate | W_up]ᵀ;  δ = (silu(g) ⊙ u) W_downᵀ    silu_mul between two products

Every sum runs in float32 in an order fixed by the row's own data (lanes by index, a fixed tree
of lanes), so a row's logits do not depend on its batch: the server's guarantee (docs/http-api.md)
holds, with bits of their own: they are not lean_decode's (attention reads exactly the row's
p_b + 1 keys, where the torch path reads an aligned width; e^x is its own polynomial), and greedy
tokens agree with the plain step's except where two logits are about as close as bfloat16's
rounding (tests/test_c_decode.py). The library is built into $MINSKILL_CACHE (else
~/.cache/minskill)/kernels, named by a hash of its source and flags, written atomically; without a
C compiler, or with MINSKILL_C_KERNELS=0, the server keeps the torch step and says so.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from minskill.nn.weights import cache_root
from minskill.serve.aligned import AlignedCache
from minskill.serve.lean_decode import LeanDecoder, check_room

SOURCE = Path(__file__).with_name("decode_kernels.c")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC"]
LANES = 16   # decode_kernels.c: a head's width must be a multiple of it


class CDecoder(LeanDecoder):
    """`step(ids, cache)`: the next-token logits (B, V) float32 of a decoding step (module
    docstring). `CDecoder.of(model)` says None where the model is not a case it covers (those of
    LeanDecoder.of, a model off the CPU or with activations other than bfloat16, a head width not a
    multiple of 16) or the library cannot be built (`CDecoder.why_not` says why)."""

    why_not: str | None = None

    @classmethod
    def of(cls, model, lean: LeanDecoder | None = None) -> "CDecoder | None":
        """`lean`: the model's LeanDecoder where the caller has built it already."""
        lean = lean or LeanDecoder.of(model)
        if lean is None:
            return None
        config, weight = model.config, model.model.embed_tokens.weight
        if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or \
                config.head_dim % LANES or config.num_attention_heads % config.num_key_value_heads:
            cls.why_not = "a model on a CPU with bfloat16 activations and heads of a multiple " \
                          "of 16 values"
            return None
        library, cls.why_not = kernels()
        if library is None:
            return None
        decoder = cls(model, lean.layers)
        decoder.library = library
        return decoder

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, cache: AlignedCache) -> torch.Tensor:
        """ids (B, 1): each row's new token -> (B, V) float32 logits of the token after it."""
        B, n_h, n_kv, d = ids.shape[0], self.n_heads, self.n_kv_heads, self.head_dim
        check_room(cache)
        if not cache.k.is_contiguous() or cache.k.dtype != torch.bfloat16:   # C reads it flat
            raise ValueError(f"the C decoding step needs a contiguous bfloat16 cache, got "
                             f"{cache.k.dtype}, strides {cache.k.stride()}")
        lib, eps = self.library, ctypes.c_float(self.eps)
        x = self.model.model.embed_tokens(ids[:, 0]).contiguous()                    # (B, H)
        hidden, max_len = x.shape[1], cache.max_len
        positions = cache.next_position.contiguous()         # each row's new token's slot
        angles = positions[:, None].float() * self.model.rope_inv_freq               # (B, d/2)
        cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
        norm_scratch = torch.empty(hidden, dtype=torch.float32)
        attention_scratch = torch.empty(lib.decode_attention_scratch(n_h // n_kv, d, max_len),
                                        dtype=torch.float32)
        threads = torch.get_num_threads()
        h, o = torch.empty_like(x), x.new_empty(B, n_h * d)
        act = x.new_empty(B, self.intermediate)
        delta = None
        for i, (norm_in, qkv_proj, o_proj, norm_post, gate_up_proj, down_proj) in \
                enumerate(self.layers):
            lib.add_rms_norm(_ptr(x), _ptr(delta), _ptr(norm_in), _ptr(h), B, hidden, eps,
                             _ptr(norm_scratch))
            qkv = qkv_proj.rows(h).contiguous()
            lib.decode_attention(_ptr(qkv), _ptr(cos), _ptr(sin), _ptr(cache.k[i]),
                                 _ptr(cache.v[i]), _ptr(positions), _ptr(o), B, n_h, n_kv, d,
                                 max_len, _ptr(attention_scratch), threads)
            delta = o_proj.rows(o).contiguous()
            lib.add_rms_norm(_ptr(x), _ptr(delta), _ptr(norm_post), _ptr(h), B, hidden, eps,
                             _ptr(norm_scratch))
            gate_up = gate_up_proj.rows(h).contiguous()   # (named: C reads it after the call)
            lib.silu_mul(_ptr(gate_up), _ptr(act), B, self.intermediate)
            delta = down_proj.rows(act).contiguous()
        lib.add_rms_norm(_ptr(x), _ptr(delta), _ptr(self.model.model.norm.weight), _ptr(h), B,
                         hidden, eps, _ptr(norm_scratch))
        # the cache's bookkeeping, as AlignedCache.attend and the plain step keep it
        cache.next_position += 1
        cache.positions = [n + 1 for n in cache.positions]
        cache.length += 1
        return self.model.lm_head(h).float()


def _ptr(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


_LIBRARY: tuple = ()


def kernels() -> tuple[ctypes.CDLL | None, str | None]:
    """(the compiled decode_kernels.c, None), or (None, why not); built once a process."""
    global _LIBRARY
    if not _LIBRARY:
        _LIBRARY = _build()
    return _LIBRARY


def _build() -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get("MINSKILL_C_KERNELS", "1") == "0":
        return None, "MINSKILL_C_KERNELS=0"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc or gcc) on PATH"
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join([compiler] + FLAGS).encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"decode_kernels-{digest}.so"
    if not target.is_file():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                subprocess.run([compiler, *FLAGS, "-o", str(built), str(SOURCE), "-lm",
                                "-lpthread"], check=True, capture_output=True, text=True,
                               timeout=120)
                os.replace(built, target)
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            return None, f"{compiler} could not build {SOURCE.name}: {detail.strip()[:300]}"
    try:
        library = ctypes.CDLL(str(target))
    except OSError as e:
        return None, f"{target} did not load: {e}"
    pointer, size, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    library.add_rms_norm.argtypes = [pointer] * 4 + [size, size, f32, pointer]
    library.silu_mul.argtypes = [pointer, pointer, size, size]
    library.decode_attention.argtypes = [pointer] * 7 + [size] * 5 + [pointer, size]
    library.decode_attention_scratch.argtypes = [size] * 3
    library.decode_attention_scratch.restype = size
    for name in ("add_rms_norm", "silu_mul", "decode_attention"):
        getattr(library, name).restype = None
    return library, None
