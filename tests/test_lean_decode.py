"""The lean decoding step (minskill.serve.lean_decode) against the plain one: the same logits and
keys, bit for bit, at every batch and width, and the same tokens through the engine while requests
join and leave; quantize.stacked against the layers it stacks."""
import pytest
import torch

from minskill.nn.quantize import Int4Linear, Int8Linear, stacked
from minskill.nn.weights import load_model
from minskill.serve.aligned import AlignedCache, padded
from minskill.serve.lean_decode import LeanDecoder
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine
from helpers import engine_tokens, quantized_model
from tiny import make_tiny_model_dir


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lean")
    # k and v of 64 rows: the int4 kernel packs rows in blocks of 64 (quantize.stacked)
    sizes = {"llama": dict(head_dim=32), "qwen2": dict(hidden_size=128), "qwen3": {},
             "small-heads": dict(head_dim=16)}
    return {name: make_tiny_model_dir(root / name, family=name.replace("small-heads", "llama"),
                                      init_std=0.2, max_position_embeddings=1024, **size)
            for name, size in sizes.items()}


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
@pytest.mark.parametrize("bias", [False, True])
def test_stacked_layers_give_each_output_the_bits_it_had_alone(kind, bias):
    torch.manual_seed(0)
    layers = [kind(torch.nn.Linear(64, n, bias=bias)) for n in (64, 128, 48)]
    x = torch.randn(8, 64).to(torch.bfloat16)
    alone = [[layer(x[:m]) for layer in layers] for m in (1, 2, 3, 8)]
    both = stacked(layers)
    assert both.out_features == 240
    for m, outputs in zip((1, 2, 3, 8), alone):
        assert torch.equal(both(x[:m]), torch.cat(outputs, dim=-1))
        # the layers now read views of the stacked codes: same outputs, no second copy
        assert all(torch.equal(layer(x[:m]), out) for layer, out in zip(layers, outputs))
    assert all(layer.codes.untyped_storage().data_ptr() == both.codes.untyped_storage().data_ptr()
               for layer in layers)


def test_layers_that_cannot_be_stacked_are_refused():
    torch.manual_seed(0)
    assert stacked([Int8Linear(torch.nn.Linear(64, 16)), Int4Linear(torch.nn.Linear(64, 16))]) \
        is None                                                           # two formats
    assert stacked([Int8Linear(torch.nn.Linear(64, 16)), Int8Linear(torch.nn.Linear(32, 16))]) \
        is None                                                           # two input widths
    # int4 rows packed in blocks: a layer of 32 rows, then another, would be read across a block
    assert stacked([Int4Linear(torch.nn.Linear(64, 32)), Int4Linear(torch.nn.Linear(64, 32))]) \
        is None
    assert stacked([Int8Linear(torch.nn.Linear(64, 16), use_kernel=False)] * 2) is None
    assert stacked([torch.nn.Linear(64, 16)] * 2) is None


def _cache(model, rows: int, seed: int) -> AlignedCache:
    """A cache whose rows sit at positions of several key widths, holding random keys."""
    positions = [5 + 61 * b for b in range(rows)]      # widths 64, 128, 192...: several runs
    cache = AlignedCache(model.config, rows, padded(max(positions) + 40), torch.bfloat16)
    generator = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=generator))
    cache.v.copy_(torch.randn(cache.v.shape, generator=generator))
    cache.next_position[:] = torch.tensor(positions)
    cache.positions = list(positions)
    cache.length = max(positions)
    return cache


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_lean_step_gives_the_plain_steps_bits(model_dirs, family, mode, rows):
    model, _ = quantized_model(model_dirs[family], mode)
    lean = LeanDecoder.of(model)
    assert lean is not None
    plain_cache, lean_cache = _cache(model, rows, 0), _cache(model, rows, 0)
    ids = torch.randint(3, 300, (rows, 1), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for _ in range(30):       # 30 steps: rows cross into wider keys on the way
            plain = model(ids, cache=plain_cache)[:, -1].float()
            assert torch.equal(lean.step(ids, lean_cache), plain)
            ids = plain.argmax(-1, keepdim=True)
    assert torch.equal(lean_cache.k, plain_cache.k) and torch.equal(lean_cache.v, plain_cache.v)
    assert torch.equal(lean_cache.next_position, plain_cache.next_position)
    assert lean_cache.length == plain_cache.length


def test_models_it_does_not_cover_keep_the_plain_step(model_dirs):
    float_model, _ = load_model(str(model_dirs["llama"]), dtype=torch.float32)
    assert LeanDecoder.of(float_model) is None                       # float weights
    assert LeanDecoder.of(quantized_model(model_dirs["qwen3"], "int8")[0]) is None   # q/k norms
    # k of 32 rows then v: stacked across an int4 block, refused (int8 has no blocks)
    assert LeanDecoder.of(quantized_model(model_dirs["small-heads"], "int4")[0]) is None
    assert LeanDecoder.of(quantized_model(model_dirs["small-heads"], "int8")[0]) is not None
    model, tokenizer = quantized_model(model_dirs["llama"], "int4")
    assert Engine(model, tokenizer, batch_invariant=True).lean is not None
    assert Engine(model, tokenizer, batch_invariant=True, lean=False).lean is None
    assert Engine(model, tokenizer, batch_invariant=False).lean is None


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_engine_decodes_the_same_tokens_either_way_as_requests_come_and_go(model_dirs, mode):
    model, tokenizer = quantized_model(model_dirs["qwen2"], mode)

    def tokens(lean: bool) -> list[list[int]]:
        engine = Engine(model, tokenizer, [], tokenizer.pad_token_id, PrefixCache(4),
                        batch_invariant=True, lean=lean)
        assert (engine.lean is not None) == lean
        return engine_tokens(engine)

    assert tokens(True) == tokens(False)
