"""minskill.nn.compiled_decode (generate(compiled=True), --compile-decode): the same tokens as the eager
path on a tiny random model, fewer kernel calls per decoding step (counted by torch.profiler), and a
clear refusal of what it does not cover. One compile for the whole file: every call has 6 rows."""
import pytest
import torch

import train_grpo

from minskill.nn.compiled_decode import CompiledDecodeError, kernels_per_step
from minskill.nn.lora import apply_lora
from minskill.nn.model import Transformer
from minskill.nn.sampling import generate
from minskill.nn.weights import config_from_hf
from tiny import make_tiny_model_dir

torch.set_num_threads(1)

PROMPTS = [[3, 14, 15, 92, 65, 35], [89, 79], [32, 38, 46, 26]]   # 3 prompts x n=2: 6 rows


def tiny_model():
    config = config_from_hf(dict(
        model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False))
    torch.manual_seed(0)
    model = Transformer(config).eval()
    with torch.no_grad():   # a peaked next-token distribution: greedy tokens are no near-ties
        model.model.embed_tokens.weight.normal_(0, 0.2)
    return model


@pytest.fixture(scope="module")
def model():
    m = tiny_model()
    try:   # the one compile of this file
        generate(m, PROMPTS, n=2, max_new_tokens=2, temperature=0.0, compiled=True)
    except CompiledDecodeError as error:
        pytest.skip(f"torch.compile cannot run here: {error}")
    return m


def both(model, prompts, **kw):
    eager = generate(model, prompts, n=2, **kw)
    return eager, generate(model, prompts, n=2, compiled=True, **kw)


def assert_same(eager, compiled):
    for e, c in zip(eager, compiled):
        assert (c.token_ids, c.finish_reason) == (e.token_ids, e.finish_reason)
        assert c.logprobs == pytest.approx(e.logprobs, abs=1e-4)


def test_compiled_tokens_equal_eager_as_rows_finish_at_different_steps(model):
    free = generate(model, PROMPTS, n=2, max_new_tokens=12, temperature=0.0)
    stop = free[0].token_ids[3]                       # prompt 0 stops at its 4th token (or earlier)
    kw = dict(max_new_tokens=[12, 5, 9], temperature=0.0, stop_token_ids=[stop])
    eager, compiled = both(model, PROMPTS, **kw)
    assert len({len(s.token_ids) for s in eager}) >= 3 and "stop" in {s.finish_reason for s in eager}
    assert_same(eager, compiled)


def test_compiled_sampled_rows_draw_the_same_tokens(model):
    eager, compiled = both(model, PROMPTS, max_new_tokens=10, temperature=[0.0, 0.8, 1.0],
                           top_p=[1.0, 1.0, 0.9], seed=[1, 2, 3])
    assert eager[2].token_ids != eager[3].token_ids          # it really sampled
    assert_same(eager, compiled)


def test_the_static_cache_is_reused_across_calls_of_other_prompt_widths(model):
    """The second call reuses the first call's static cache (same rows, same bucket): what the first
    left in slots past the new prefill must stay masked."""
    generate(model, [[5] * 40, [6] * 30, [7] * 20], n=2, max_new_tokens=30, temperature=0.0,
             compiled=True)
    assert_same(*both(model, [[9, 8, 7], [200], [1, 2, 3, 4, 5]], max_new_tokens=8,
                      temperature=0.0))


def test_compiled_decoding_makes_fewer_kernel_calls_per_step_and_fuses_rmsnorm(model):
    def decoding(compiled):
        return lambda tokens: generate(model, PROMPTS, n=2, max_new_tokens=tokens, temperature=0.0,
                                       compiled=compiled)
    eager, compiled = kernels_per_step(decoding(False)), kernels_per_step(decoding(True))
    assert sum(compiled.values()) < sum(eager.values())
    # RMSNorm (4 a Qwen3 layer: input, post-attention, q and k; + the final one) is
    # aten::pow/mean/rsqrt/mul eagerly, inside fused kernels compiled
    assert eager.get("aten::rsqrt", 0) == 2 * 4 + 1 and compiled.get("aten::rsqrt", 0) == 0
    assert any("cpp_fused" in name for name in compiled)
    assert compiled.get("aten::mm", 0) == eager.get("aten::mm", 0)   # the products stay library calls


def test_the_editor_of_train_grpo_compile_decode_decodes_compiled(model, tmp_path, monkeypatch):
    """--compile-decode sets the editor's compile_decode, generate()'s default when compiled is not
    given; --lora-rank with it is refused at parse time."""
    from minskill.nn import sampling
    from minskill.skill_r1 import run_setup
    made = []

    class Spy(sampling.StaticDecoder):
        def __init__(self, *args):
            made.append(1)
            super().__init__(*args)
    monkeypatch.setattr(sampling, "StaticDecoder", Spy)
    args = train_grpo.parse_args(["--compile-decode", "--editor", str(make_tiny_model_dir(tmp_path)),
                                  "--device", "cpu"])
    assert run_setup.build_editor(args, None, args.editor)[0].compile_decode
    assert not run_setup.build_editor(train_grpo.parse_args(["--editor", args.editor, "--device", "cpu"]),
                                      None, args.editor)[0].compile_decode
    model.compile_decode = True
    try:
        generate(model, PROMPTS, n=2, max_new_tokens=3, temperature=0.0)
    finally:
        del model.compile_decode
    generate(model, PROMPTS, n=2, max_new_tokens=3, temperature=0.0)
    assert made == [1]
    with pytest.raises(SystemExit) as exit_:
        train_grpo.parse_args(["--compile-decode", "--lora-rank", "4"])
    assert exit_.value.code == 2


def test_lora_adapters_are_refused_by_name():
    model = tiny_model()
    apply_lora(model, 4)
    with pytest.raises(CompiledDecodeError, match="LoRA adapters.*LoRALinear.*--compile-decode"):
        generate(model, PROMPTS, n=2, max_new_tokens=3, temperature=0.0, compiled=True)


def test_a_failed_compile_says_why_and_how_to_run_without():
    """No C++ compiler for inductor on a CPU (here: a compiler path that does not exist)."""
    from minskill.nn.compiled_decode import _failing_clearly
    step = _failing_clearly(torch.compile(lambda x: (x * 2).sin() + 1, fullgraph=True), "cpu")
    with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/g++",), "fx_graph_cache": False}):
        with pytest.raises(CompiledDecodeError, match="C\\+\\+ compiler.*run without --compile-decode"):
            step(torch.randn(4))
