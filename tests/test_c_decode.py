"""The decoding step with its small ops in C (minskill.serve.c_decode): each C function against
torch, a row's logits with the same bits in every batch, the same tokens through the engine as
requests join and leave, logits close to the torch step's, and a clear fallback without the
library."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

from minskill.nn.model import rms_norm
from minskill.nn.quantize import PROJECTIONS, quantize_int4
from minskill.nn.weights import load_model
from minskill.serve import c_decode
from minskill.serve.aligned import AlignedCache, padded, prefill_aligned
from minskill.serve.c_decode import CDecoder, kernels
from minskill.serve.lean_decode import LeanDecoder
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine
from helpers import ARRIVALS, engine_tokens, quantized_model
from tiny import make_tiny_model_dir

LIBRARY, WHY_NOT = kernels()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason=f"no C kernels here: {WHY_NOT}")


def _p(tensor):
    return tensor.data_ptr()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("c_decode")
    sizes = {"llama": dict(head_dim=32), "qwen2": dict(hidden_size=128)}
    return {name: make_tiny_model_dir(root / name, family=name, init_std=0.2,
                                      max_position_embeddings=1024, **size)
            for name, size in sizes.items()}


def _bf16_close(got, want, ulps=1):
    """got within `ulps` bfloat16 steps of want (2⁻⁷ relative per step)."""
    want = want.float()
    return bool(((got.float() - want).abs() <= ulps * 2 ** -7 * want.abs() + 1e-6).all())


def test_add_rms_norm_against_torch():
    torch.manual_seed(0)
    x, delta = torch.randn(3, 576).bfloat16(), torch.randn(3, 576).bfloat16()
    weight, out = torch.randn(576).bfloat16(), torch.empty(3, 576, dtype=torch.bfloat16)
    scratch = torch.empty(576)   # (every tensor C reads is named: a temporary would be freed)
    for d in (delta, None):
        got_x = x.clone()
        LIBRARY.add_rms_norm(_p(got_x), None if d is None else _p(d), _p(weight), _p(out), 3, 576,
                             ctypes.c_float(1e-5), _p(scratch))
        want_x = x if d is None else x + d          # bfloat16's add: float32 sum, rounded
        assert torch.equal(got_x, want_x)
        assert _bf16_close(out, rms_norm(want_x, weight, 1e-5))


def test_silu_mul_against_torch():
    torch.manual_seed(0)
    gate_up, out = torch.randn(2, 2 * 96).bfloat16() * 4, torch.empty(2, 96, dtype=torch.bfloat16)
    LIBRARY.silu_mul(_p(gate_up), _p(out), 2, 96)
    gate, up = gate_up.float().split(96, -1)
    assert _bf16_close(out, F.silu(gate) * up)      # rounded once, where torch rounds twice


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).bfloat16()


@pytest.mark.parametrize("d", [32, 64, 128])   # 64 and 128: their own compiled paths
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_attention_against_float64_attention(d, threads):
    """New keys roped and written at each row's slot; each query head reads its kv head's keys up
    to its own position (GQA: heads h·group .. h·group + group − 1), nothing after it."""
    torch.manual_seed(0)
    B, n_h, n_kv, max_len = 3, 6, 2, 96
    qkv = torch.randn(B, (n_h + 2 * n_kv) * d).bfloat16()
    K, V = torch.randn(B, n_kv, max_len, d).bfloat16(), torch.randn(B, n_kv, max_len, d).bfloat16()
    K[:, :, 80:], V[:, :, 80:] = 1e4, 1e4           # slots after every row's position: unread
    positions = torch.tensor([0, 17, 79])
    angles = positions[:, None].float() * 10000 ** -(torch.arange(0, d, 2).float() / d)
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    got_K, got_V, out = K.clone(), V.clone(), torch.empty(B, n_h * d, dtype=torch.bfloat16)
    scratch = torch.empty(LIBRARY.decode_attention_scratch(n_h // n_kv, d, max_len))
    LIBRARY.decode_attention(_p(qkv), _p(cos), _p(sin), _p(got_K), _p(got_V), _p(positions),
                             _p(out), B, n_h, n_kv, d, max_len, _p(scratch), threads)
    for b, p in enumerate(positions.tolist()):
        q = _rope(qkv[b, :n_h * d].view(n_h, d), cos[b], sin[b])
        k = _rope(qkv[b, n_h * d:(n_h + n_kv) * d].view(n_kv, d), cos[b], sin[b])
        want_K, want_V = K[b].clone(), V[b].clone()
        want_K[:, p], want_V[:, p] = k, qkv[b, (n_h + n_kv) * d:].view(n_kv, d)
        assert torch.equal(got_K[b], want_K) and torch.equal(got_V[b], want_V)
        keys = want_K[:, :p + 1].double().repeat_interleave(n_h // n_kv, 0)
        values = want_V[:, :p + 1].double().repeat_interleave(n_h // n_kv, 0)
        weights = torch.softmax(q.double()[:, None] @ keys.transpose(1, 2) / d ** 0.5, -1)
        want = (weights @ values).reshape(-1)
        assert _bf16_close(out[b], want, ulps=2)


def _cache(model, positions, seed):
    """A cache whose rows hold random keys up to their positions."""
    cache = AlignedCache(model.config, len(positions), padded(max(positions) + 40), torch.bfloat16)
    generator = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=generator))
    cache.v.copy_(torch.randn(cache.v.shape, generator=generator))
    cache.next_position[:] = torch.tensor(positions)
    cache.positions, cache.length = list(positions), max(positions)
    return cache


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_logits_have_the_same_bits_in_every_batch(model_dirs, mode, threads):
    """A row alone, and among 8 rows split over `threads` threads (decode_attention)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _rows_alone_and_together(model_dirs, mode)
    finally:
        torch.set_num_threads(before)


def _rows_alone_and_together(model_dirs, mode):
    model, _ = quantized_model(model_dirs["llama"], mode)
    decoder = CDecoder.of(model)
    assert decoder is not None
    positions = [5, 66, 130, 7, 300, 31, 64, 190]
    ids = torch.randint(3, 300, (8, 1), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        together = _cache(model, positions, 0)
        batch = [decoder.step(ids, together) for _ in range(3)]
        for b in (0, 4, 7):
            alone = _cache(model, positions, 0).select([b])
            for step in range(3):
                assert torch.equal(decoder.step(ids[b:b + 1], alone)[0], batch[step][b])
            assert torch.equal(alone.k[:, 0], together.k[:, b])
    assert together.positions == [p + 3 for p in positions] and together.length == 303
    assert torch.equal(together.next_position, torch.tensor(positions) + 3)


def _float_twin(path):
    """The int4 model's function computed in float32 throughout: its dequantized weights (those
    torch's kernel reads), its bfloat16 norms and embeddings made float32 (a reference for both
    decoding steps)."""
    twin, _ = load_model(str(path), dtype=torch.float32)
    quantized, _ = load_model(str(path), dtype=torch.float32)
    quantize_int4(quantized, use_kernel=False)      # the same codes, dequantizable
    for ours, theirs in zip(twin.model.layers, quantized.model.layers):
        for block, other in ((ours.self_attn, theirs.self_attn), (ours.mlp, theirs.mlp)):
            for name in PROJECTIONS:
                if hasattr(block, name):
                    getattr(block, name).weight.data = getattr(other, name).dequantized()
        for norm in ("input_layernorm", "post_attention_layernorm"):
            getattr(ours, norm).weight.data = getattr(theirs, norm).weight.float()
    twin.model.norm.weight.data = quantized.model.norm.weight.float()
    twin.model.embed_tokens.weight = torch.nn.Parameter(quantized.model.embed_tokens.weight.float())
    twin.lm_head = torch.nn.Linear(1, 1, bias=False)
    twin.lm_head.weight = torch.nn.Parameter(quantized.lm_head.dequantized())
    return twin.eval()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_logits_are_as_close_to_float32_arithmetic_as_the_torch_steps(model_dirs, family):
    """Other bits than the torch step, not a worse approximation: from one prefilled prompt, 20
    steps of each (fed the torch step's tokens), set against the same weights in float32."""
    model, _ = quantized_model(model_dirs[family], "int4")
    twin = _float_twin(model_dirs[family])
    lean, fast = LeanDecoder.of(model), CDecoder.of(model)
    tokens = torch.randint(3, 300, (150,), generator=torch.Generator().manual_seed(2)).tolist()
    errors = {"torch": [], "C": []}
    with torch.inference_mode():
        (lean_cache, logits), (fast_cache, _) = (prefill_aligned(model, [tokens], 30)
                                                 for _ in range(2))
        for _ in range(20):
            tokens.append(int(logits.argmax()))
            ids = torch.tensor([[tokens[-1]]])
            logits, other = lean.step(ids, lean_cache), fast.step(ids, fast_cache)
            exact = twin(torch.tensor([tokens]))[:, -1]
            errors["torch"].append((logits - exact).abs().max())
            errors["C"].append((other - exact).abs().max())
    torch_error, c_error = (torch.stack(e).mean() for e in errors.values())
    assert c_error <= 1.2 * torch_error, (c_error, torch_error)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_engine_gives_each_request_its_tokens_alone_as_requests_come_and_go(model_dirs, mode):
    model, tokenizer = quantized_model(model_dirs["qwen2"], mode)

    def tokens(arrivals) -> list[list[int]]:
        engine = Engine(model, tokenizer, [], tokenizer.pad_token_id, PrefixCache(4),
                        batch_invariant=True, c_kernels=True)
        assert isinstance(engine.lean, CDecoder)
        return engine_tokens(engine, arrivals)

    together = tokens(ARRIVALS)
    alone = [tokens({0: [request]})[0] for step in sorted(ARRIVALS) for request in ARRIVALS[step]]
    assert together == alone and len({tuple(t) for t in together}) == 6


def test_without_the_library_the_torch_step_is_kept_and_says_why(model_dirs, monkeypatch,
                                                                  tmp_path):
    model, tokenizer = quantized_model(model_dirs["llama"], "int4")
    monkeypatch.setattr(c_decode, "_LIBRARY", ())
    monkeypatch.setenv("MINSKILL_C_KERNELS", "0")
    assert CDecoder.of(model) is None and CDecoder.why_not == "MINSKILL_C_KERNELS=0"
    engine = Engine(model, tokenizer, batch_invariant=True, c_kernels=True)
    assert type(engine.lean) is LeanDecoder
    monkeypatch.setattr(c_decode, "_LIBRARY", ())
    monkeypatch.setenv("MINSKILL_C_KERNELS", "1")
    monkeypatch.setenv("MINSKILL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")           # a compiler that fails
    assert CDecoder.of(model) is None
    assert CDecoder.why_not.startswith("false could not build decode_kernels.c")
    assert not list(tmp_path.rglob("*.so"))      # nothing half-built left in the cache
    monkeypatch.setattr(c_decode, "_LIBRARY", ())
    monkeypatch.delenv("CC")
    assert CDecoder.of(model) is not None and CDecoder.why_not is None
    assert len(list((tmp_path / "kernels").glob("decode_kernels-*.so"))) == 1
    float_model, _ = load_model(str(model_dirs["llama"]), dtype=torch.float32)
    assert CDecoder.of(float_model) is None       # float weights: the plain step


def test_the_start_up_line_names_the_decoding_step(model_dirs, monkeypatch):
    from minskill.serve.backends import ModelBackend
    from minskill.serve.server import decoding_step
    model, tokenizer = quantized_model(model_dirs["llama"], "int4")
    on = ModelBackend(model, tokenizer, batch_invariant=True, c_kernels=True)
    assert decoding_step(on, "on") == "decoding step in C (--c-kernels off: torch ops)"
    off = ModelBackend(model, tokenizer, batch_invariant=True, c_kernels=False)
    assert decoding_step(off, "off") == "decoding step in torch ops"
    monkeypatch.setattr(CDecoder, "why_not", "no C compiler (cc or gcc) on PATH")
    assert decoding_step(off, "on") == \
        "decoding step in torch ops (C kernels: no C compiler (cc or gcc) on PATH)"
    float_model, tokenizer = load_model(str(model_dirs["llama"]), dtype=torch.float32)
    assert decoding_step(ModelBackend(float_model, tokenizer, batch_invariant=True), "on") == \
        "the model's own decoding step"
