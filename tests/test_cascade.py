"""Cascade attention (nn.model.attend_with_prefixes, serve.cascade): a prefix shared by rows, kept once, gives
the attention of each row over [its prefix, its own keys]."""
import pytest
import torch
import torch.nn.functional as F

from minskill.nn.model import attend_with_prefixes
from minskill.nn.quantize import quantize_int8
from minskill.nn.weights import load_model
from minskill.serve.cascade import CascadeCache
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine, sequences_for
from tiny import make_tiny_model_dir


@pytest.mark.parametrize("dtype, T", [(torch.float32, 1), (torch.float32, 3), (torch.bfloat16, 1)])
def test_attention_with_prefixes_is_attention_over_the_prefix_then_the_own_keys(dtype, T):
    g = torch.Generator().manual_seed(0)
    B, n_kv, group, d, S = 4, 2, 3, 8, 5
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    q, k, v = rand(B, n_kv * group, T, d), rand(B, n_kv, S, d), rand(B, n_kv, S, d)
    own = torch.ones(B, S, dtype=torch.bool)
    own[1, :2] = own[3, :1] = False                                   # left pads
    causal = torch.arange(S)[None, :] <= torch.arange(S - T, S)[:, None]
    mask = ((causal & own[:, None, :]) | (torch.arange(S)[None, :] == torch.arange(S - T, S)[:, None]))[:, None]
    layers = 2
    prefixes = [(torch.tensor([0, 2]), rand(layers, n_kv, 7, d), rand(layers, n_kv, 7, d)),
                (slice(3, 4), rand(layers, n_kv, 4, d), rand(layers, n_kv, 4, d))]   # rows as a slice; row 1: none
    got = attend_with_prefixes(q, k, v, mask, False, group, prefixes, layer=1)
    by_row = {int(r): (pk[1], pv[1]) for rows, pk, pv in prefixes
              for r in (range(B)[rows] if isinstance(rows, slice) else rows)}
    for b in range(B):
        pk, pv = by_row.get(b, (k[b, :, :0], v[b, :, :0]))
        keys, values = torch.cat([pk, k[b]], 1), torch.cat([pv, v[b]], 1)
        full = torch.cat([torch.ones(T, pk.shape[1], dtype=torch.bool), mask[b, 0]], 1)
        expected = F.scaled_dot_product_attention(q[b].float(), keys.repeat_interleave(group, 0).float(),
                                                  values.repeat_interleave(group, 0).float(), attn_mask=full)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert got.dtype == dtype and torch.allclose(got[b].float(), expected, atol=tol, rtol=tol), b


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_the_engine_keeps_a_shared_prefix_once_on_every_dtype(tmp_path, dtype):
    path = make_tiny_model_dir(tmp_path / "m", family="llama", chat_format="chatml", init_std=0.2)
    model, tokenizer = load_model(str(path), dtype=torch.bfloat16 if dtype == "bf16" else None)
    if dtype == "int8":
        quantize_int8(model)
    model.eval()
    g = torch.Generator().manual_seed(2)
    library = torch.randint(3, 300, (100,), generator=g).tolist()
    prompts = [library + torch.randint(3, 300, (4 + i,), generator=g).tolist() for i in range(4)]
    engine, widths, kinds = Engine(model, tokenizer, [], tokenizer.pad_token_id, PrefixCache(4)), [], set()
    sequences = [sequences_for(p, 1, None, max_new_tokens=6, temperature=0.0)[0] for p in prompts]
    with torch.inference_mode():
        engine.add(sequences[:1])
        engine.step()
        engine.add(sequences[1:])
        while engine.rows:
            widths.append(engine.cache.length)
            kinds.add(type(engine.cache))
            engine.step()
    assert kinds == {CascadeCache} and max(widths) < len(library)
    assert [len(s.tokens) for s in sequences] == [6] * 4
    assert all(0 <= t < model.config.vocab_size for s in sequences for t in s.tokens)
