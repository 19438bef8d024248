"""Batch-invariant decoding (minskill.serve.aligned): a greedy request's logits, bit for bit, do not
depend on which requests share its batch, when they join or leave, or what the prefix cache held
when it came."""
import pytest
import torch

from minskill.nn.quantize import apply_quantization
from minskill.nn.weights import load_model
from minskill.serve.aligned import ALIGN, TwoRowLinear, pad_single_rows
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine, sequences_for
from tiny import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("inv") / "m", family="llama",
                               chat_format="chatml", init_std=0.2, max_position_embeddings=1024)


def _model(path, mode):
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    model, tokenizer = load_model(str(path), dtype=dtype)
    model.eval()
    if mode in ("int8", "int4"):
        apply_quantization(model, mode)
    return pad_single_rows(model), tokenizer


def _prompt(seed, length):
    return torch.randint(3, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


LIBRARY = _prompt(99, 40)            # a shared system prompt: more than two prefix-cache blocks
MINE = LIBRARY + _prompt(7, 13)


def _decode(model, tokenizer, companions, invariant=True, warm=()):
    """The target's tokens and its logits at every step. companions: (join step, prompt,
    max_new_tokens);
    warm: prompts run to the end first (they fill the prefix cache)."""
    cache = PrefixCache(4)
    engine = Engine(model, tokenizer, [], tokenizer.pad_token_id, cache, batch_invariant=invariant)
    with torch.inference_mode():
        for prompt in warm:
            engine.run(sequences_for(prompt, 1, None, max_new_tokens=3))
        mine = sequences_for(MINE, 1, None, max_new_tokens=14)[0]
        joins = {2: [mine]}
        for step, prompt, new in companions:
            joins.setdefault(step, []).extend(sequences_for(prompt, 1, None, max_new_tokens=new))
        logits = []
        for step in range(200):
            engine.add(joins.pop(step, []))
            if not engine.rows and not joins:
                break
            if mine in engine.rows:
                logits.append(engine.logits[engine.rows.index(mine)].clone())
            engine.step()
    return mine.tokens, logits


COMPANIONS = [
    [(0, _prompt(3, 30), 9)],                                               # running before it came
    [(2, LIBRARY + _prompt(4, 5), 4)],                               # joins with it, same library
    [(0, LIBRARY + _prompt(5, 70), 20), (4, _prompt(6, 9), 2), (6, LIBRARY + _prompt(8, 1), 30)],
    [(0, _prompt(9, 300), 12), (1, LIBRARY[:32] + _prompt(10, 150), 25)],   # rows of other widths
    [(2, MINE, 14)],                                                        # the same prompt twice
]


@pytest.mark.parametrize("mode", ["bf16", "int8", "int4"])
def test_a_greedy_row_has_the_same_bits_whatever_shares_its_batch(tiny_dir, mode):
    model, tokenizer = _model(tiny_dir, mode)
    alone_tokens, alone = _decode(model, tokenizer, [])
    assert len(alone) == 14
    for companions in COMPANIONS:
        tokens, logits = _decode(model, tokenizer, companions)
        assert tokens == alone_tokens
        assert all(torch.equal(a, b) for a, b in zip(alone, logits))
    # when it comes after its library was cached by another request, or after itself
    for warm in ([LIBRARY + _prompt(11, 20)], [MINE],
                 [LIBRARY[:16] + _prompt(12, 3), LIBRARY[:32] + _prompt(13, 90)]):
        tokens, logits = _decode(model, tokenizer, COMPANIONS[2], warm=warm)
        assert all(torch.equal(a, b) for a, b in zip(alone, logits))


def test_without_it_the_bits_move_with_the_batch(tiny_dir):
    """The left-padded engine (cascade, one write offset) is what the aligned one fixes: its logits
    for the same request differ with its companions (so the test above tests something)."""
    model, tokenizer = _model(tiny_dir, "bf16")
    _, alone = _decode(model, tokenizer, [], invariant=False)
    moved = [not all(torch.equal(a, b)
                     for a, b in zip(alone, _decode(model, tokenizer, c, invariant=False)[1]))
             for c in COMPANIONS[:3]]
    assert any(moved)


def test_float32_tokens_agree_and_logits_agree_to_rounding(tiny_dir):
    model, tokenizer = _model(tiny_dir, "fp32")
    alone_tokens, alone = _decode(model, tokenizer, [])
    for companions in COMPANIONS:
        tokens, logits = _decode(model, tokenizer, companions)
        assert tokens == alone_tokens
        assert max(float((a - b).abs().max()) for a, b in zip(alone, logits)) < 1e-4


@pytest.mark.parametrize("mode", ["fp32", "bf16", "int8", "int4"])
def test_the_aligned_engine_decodes_what_generate_decodes_alone(tiny_dir, mode):
    """Same tokens, while others join and leave, as sampling.generate for the request alone (the
    plain path), at every dtype the server offers."""
    from minskill.nn.sampling import generate
    model, tokenizer = _model(tiny_dir, mode)
    tokens, _ = _decode(model, tokenizer, COMPANIONS[2])
    expected = generate(model, [MINE], max_new_tokens=14, temperature=0.0)[0].token_ids
    assert tokens[:len(expected)] == expected


def test_one_row_runs_as_two_and_a_batch_as_it_is():
    linear = torch.nn.Linear(8, 3).to(torch.bfloat16)
    pad_single_rows(torch.nn.Sequential(linear))
    assert type(linear) is TwoRowLinear
    x = torch.randn(5, 1, 8, dtype=torch.bfloat16)
    assert linear(x[:1]).shape == (1, 1, 3)
    two = torch.nn.functional.linear(x[:2], linear.weight, linear.bias)
    assert torch.equal(linear(x[:1])[0], two[0])
    assert linear(x).shape == (5, 1, 3)
    assert ALIGN % 16 == 0          # a multiple of every SIMD width the attention kernels use
