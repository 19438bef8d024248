"""int8 and int4 weight-only quantization (minskill.nn.quantize): the codes and scales by hand, the
layer against its equation, the kernel path against the dequantized fallback, rows that do not move
with their batch, and a quantized tiny model that still decodes like its float original."""
import pytest
import torch
from torch import nn

from minskill.nn.quantize import (INT4_GROUP, Int4Linear, Int8Linear, apply_quantization,
                                  has_int4_kernel, has_int8_kernel, quantize_groups, quantize_int4,
                                  quantize_int8, quantize_rows, weight_format)
from minskill.nn.sampling import generate
from minskill.nn.weights import load_model
from tiny import make_tiny_model_dir


def test_rows_are_scaled_by_their_largest_weight_rounded_up_to_bfloat16():
    w = torch.tensor([[0.5, -1.27, 0.0], [0.0, 0.0, 0.0], [2.54, 1.0, -2.54]])
    codes, scales = quantize_rows(w)
    exact = torch.tensor([0.01, 1.0, 0.02])                      # max|W_o·| / 127; an all-zero row gets 1
    assert torch.equal(scales.bfloat16().float(), scales)        # bfloat16 numbers: what the kernel keeps
    assert (scales >= exact).all() and (scales <= exact * (1 + 2 ** -7)).all()
    assert codes.dtype == torch.int8 and codes.tolist() == [[50, -127, 0], [0, 0, 0], [127, 50, -127]]


def test_the_error_of_each_weight_used_is_at_most_half_a_step():
    """The bound holds for the weights both paths use, s·Q with s the bfloat16 scale, not a rounding of it."""
    w = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 64)[:, None]
    codes, scales = quantize_rows(w)
    assert ((codes.float() * scales[:, None] - w).abs() <= scales[:, None] / 2 * (1 + 1e-6)).all()
    for use_kernel in (True, False):   # what each path stores is those same codes and scales, exactly
        layer = Int8Linear(weight=w, use_kernel=use_kernel)
        assert torch.equal(layer.codes, codes) and torch.equal(layer.scales.float(), scales)


@pytest.mark.parametrize("use_kernel", [True, False])
def test_layer_computes_s_times_x_q_plus_b(use_kernel):
    if use_kernel and not has_int8_kernel("cpu"):
        pytest.skip("no int8 kernel in this torch build")
    g = torch.Generator().manual_seed(1)
    linear = nn.Linear(32, 24, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(24, 32, generator=g))
        linear.bias.copy_(torch.randn(24, generator=g))
    layer = Int8Linear(linear, use_kernel=use_kernel)
    x = torch.randn(2, 3, 32, generator=g)
    codes, scales = quantize_rows(linear.weight)
    by_hand = (x.bfloat16().float() @ codes.float().T) * scales + linear.bias
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 24)
    assert torch.allclose(y.float(), by_hand, rtol=2e-2, atol=5e-2)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("q"), family="qwen2", chat_format="chatml")


def test_quantized_model_keeps_only_embeddings_and_norms_in_float(tiny_dir):
    model, _ = load_model(str(tiny_dir), dtype=torch.float32)
    quantize_int8(model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    int8 = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert linears == [] and len(int8) == 7 * model.config.num_hidden_layers + 1
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not any(p.requires_grad for p in model.parameters())


def test_quantized_model_logits_follow_the_float_model(tiny_dir):
    model, tokenizer = load_model(str(tiny_dir), dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode("the quick brown fox jumps over the lazy dog")])
    with torch.no_grad():
        reference = model(ids).float()
        quantized = quantize_int8(model)(ids).float()
    cos = torch.nn.functional.cosine_similarity(reference.flatten(), quantized.flatten(), dim=0)
    assert cos > 0.99 and (reference.argmax(-1) == quantized.argmax(-1)).float().mean() > 0.9


def test_kernel_path_equals_the_dequantized_fallback_and_decodes(tiny_dir):
    if not has_int8_kernel("cpu"):
        pytest.skip("no int8 kernel in this torch build")
    logits = []
    for use_kernel in (True, False):
        model, tokenizer = load_model(str(tiny_dir), dtype=torch.float32)
        quantize_int8(model, use_kernel=use_kernel)
        ids = torch.tensor([tokenizer.encode("a b c d e f g")])
        with torch.no_grad():
            logits.append(model(ids).float())
    # the same weights s·Q; the outputs differ only by the rounding of the accumulations (kernel bf16,
    # fallback float32 then bf16)
    assert torch.allclose(logits[0], logits[1], atol=2e-2 * logits[1].abs().max().item())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    samples = generate(model, [prompt, prompt[:5]], max_new_tokens=6, tokenizer=tokenizer,
                       pad_id=tokenizer.pad_token_id)
    assert [len(s.token_ids) for s in samples] == [6, 6]


def test_auto_quantizes_on_a_cpu_with_the_kernel(tiny_dir):
    model, _ = load_model(str(tiny_dir), dtype=torch.float32, device="cpu")
    apply_quantization(model, "auto")
    assert isinstance(model.lm_head, Int8Linear) == has_int8_kernel("cpu")


def test_apply_quantization_names_the_choices():
    assert apply_quantization("model", "none") == "model"
    with pytest.raises(ValueError, match="choose one of auto, none, int8, int4"):
        apply_quantization(None, "int2")


def test_server_serves_a_quantized_model_over_http(tiny_dir):
    from minskill.nn.quantize import Int8Linear as Int8
    from minskill.serve.server import ModelBackend, start_server
    backend = ModelBackend.from_spec(str(tiny_dir), quantize="int8", name="tiny-int8")
    assert isinstance(backend.model.lm_head, Int8)
    with start_server(backend) as server:
        result = server.client().chat([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0)
    assert result.completion_tokens >= 1 and isinstance(result.text, str)


def test_int4_groups_hold_their_range_in_sixteen_steps():
    """One group of G inputs from lo to hi: s = (hi − lo) / 15 and z = lo + 8 s as bfloat16
    numbers, the codes 0..15 and every weight used, (Q − 8)·s + z, within s / 2 (plus z's bfloat16
    rounding)."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(3, 2 * INT4_GROUP, generator=g) * torch.tensor([[1e-3], [1.0], [50.0]])
    w[1, :INT4_GROUP] = 0.25                                     # a constant group: s = 1, exact
    codes, scales, zeros = quantize_groups(w)
    groups = w.reshape(3, 2, INT4_GROUP)
    assert torch.equal(scales.bfloat16().float(), scales)
    assert torch.equal(zeros.bfloat16().float(), zeros)
    assert scales[1, 0] == 1 and codes[1, :INT4_GROUP].tolist() == [8] * INT4_GROUP
    steps = (groups.amax(-1) - groups.amin(-1)) / 15
    assert torch.allclose(scales[steps > 0], steps[steps > 0], rtol=2 ** -8)
    assert codes.min() >= 0 and codes.max() <= 15
    used = (codes.float().reshape(3, 2, INT4_GROUP) - 8) * scales[..., None] + zeros[..., None]
    bound = scales / 2 + zeros.abs() * 2 ** -8 + scales * 2 ** -7
    assert ((used - groups).abs() <= bound[..., None]).all()


@pytest.mark.parametrize("use_kernel", [True, False])
def test_int4_layer_computes_its_equation(use_kernel):
    if use_kernel and not has_int4_kernel("cpu"):
        pytest.skip("no int4 kernel in this torch build")
    g = torch.Generator().manual_seed(3)
    linear = nn.Linear(2 * INT4_GROUP, 40, bias=True)     # 40 rows: packed as 48, cut back to 40
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 2 * INT4_GROUP, generator=g))
        linear.bias.copy_(torch.randn(40, generator=g))
    layer = Int4Linear(linear, use_kernel=use_kernel)
    codes, scales, zeros = quantize_groups(linear.weight)
    weight = (codes.float() - 8) * scales.repeat_interleave(INT4_GROUP, 1) + \
        zeros.repeat_interleave(INT4_GROUP, 1)
    x = torch.randn(2, 3, 2 * INT4_GROUP, generator=g)
    by_hand = x.bfloat16().float() @ weight.T + linear.bias
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 40)
    assert torch.allclose(y.float(), by_hand, rtol=2e-2, atol=5e-2)


def test_int4_refuses_a_layer_it_cannot_group():
    with pytest.raises(ValueError, match="multiple of 32.*--quantize int8"):
        Int4Linear(nn.Linear(48, 16))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_row_gets_the_same_bits_whatever_rows_share_its_product(kind):
    """What the server's batch-invariant engine relies on (serve.aligned): row i's output is the
    same alone (M = 1) as beside 1 to 11 other rows."""
    if not (has_int8_kernel if kind == "int8" else has_int4_kernel)("cpu"):
        pytest.skip(f"no {kind} kernel in this torch build")
    g = torch.Generator().manual_seed(4)
    linear = nn.Linear(4 * INT4_GROUP, 96)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(96, 4 * INT4_GROUP, generator=g))
    layer = (Int8Linear if kind == "int8" else Int4Linear)(linear)
    x = torch.randn(12, 4 * INT4_GROUP, generator=g)
    alone = torch.cat([layer(x[i:i + 1]) for i in range(12)])
    for m in range(2, 13):
        assert torch.equal(layer(x[:m]), alone[:m]), m


def test_int4_model_logits_follow_the_float_model(tiny_dir):
    model, tokenizer = load_model(str(tiny_dir), dtype=torch.float32)
    ids = torch.tensor([tokenizer.encode("the quick brown fox jumps over the lazy dog")])
    with torch.no_grad():
        reference = model(ids).float()
        quantized = apply_quantization(model, "int4")(ids).float()
    assert weight_format(model) == "int4"
    assert isinstance(model.model.layers[0].mlp.up_proj, Int4Linear)
    assert isinstance(model.lm_head, Int8Linear) == has_int8_kernel("cpu")   # the head stays 8-bit
    cos = torch.nn.functional.cosine_similarity(reference.flatten(), quantized.flatten(), dim=0)
    assert cos > 0.98 and (reference.argmax(-1) == quantized.argmax(-1)).float().mean() > 0.8


def test_int4_kernel_path_equals_the_dequantized_fallback(tiny_dir):
    if not has_int4_kernel("cpu"):
        pytest.skip("no int4 kernel in this torch build")
    logits = []
    for use_kernel in (True, False):
        model, tokenizer = load_model(str(tiny_dir), dtype=torch.float32)
        quantize_int4(model, use_kernel=use_kernel)
        with torch.no_grad():
            logits.append(model(torch.tensor([tokenizer.encode("a b c d e f g")])).float())
    assert torch.allclose(logits[0], logits[1], atol=2e-2 * logits[1].abs().max().item())


def test_server_names_an_int4_model_so(tiny_dir):
    from minskill.serve.server import ModelBackend
    backend = ModelBackend.from_spec(str(tiny_dir), quantize="int4")
    assert backend.name.endswith("-int4") and weight_format(backend.model) == "int4"
