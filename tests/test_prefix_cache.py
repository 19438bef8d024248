"""The server's prefix cache (minskill.serve.prefix_cache): shared prefixes computed once, replies unchanged."""
import pytest
import torch

from minskill.nn.quantize import quantize_int8
from minskill.nn.sampling import generate
from minskill.nn.weights import load_model
from minskill.serve.backends import CompletionRequest, ModelBackend
from minskill.serve.prefix_cache import BLOCK_TOKENS, PrefixCache, block_keys, prefill
from minskill.serve.scheduler import Engine, sequences_for
from tiny import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("pc") / "m", family="llama", chat_format="chatml",
                               init_std=0.2)   # large enough that greedy replies depend on the prompt


def _model(tiny_dir, dtype="float32"):
    model, tokenizer = load_model(str(tiny_dir), dtype=torch.bfloat16 if dtype == "bf16" else None)
    if dtype == "int8":
        quantize_int8(model)
    return model.eval(), tokenizer


def mixed_prompts():
    """Prompts that share a 70-token prefix, share part of it (40 or 33 tokens), are it, or share nothing."""
    g = torch.Generator().manual_seed(0)
    base = torch.randint(3, 300, (70,), generator=g).tolist()
    other = torch.randint(3, 300, (23,), generator=g).tolist()
    return [base + [5, 6, 7], base[:40] + [9] * 5, base + [8], other, base[:33], base, base + [5, 6, 7]]


def _engine_replies(model, tokenizer, prompts, cache, joins=(3,), max_new_tokens=12):
    """Greedy replies through the engine; the prompts from each index in `joins` on join after two steps."""
    engine, out, sequences = Engine(model, tokenizer, [], tokenizer.pad_token_id, cache), {}, []
    for i, prompt in enumerate(prompts):
        [s] = sequences_for(prompt, 1, None, max_new_tokens=max_new_tokens, temperature=0.0)
        s.on_done = lambda s, i=i: out.__setitem__(i, s.tokens)
        sequences.append(s)
    cuts = [0, *joins, len(prompts)]
    for lo, hi in zip(cuts, cuts[1:]):
        engine.add(sequences[lo:hi])
        for _ in range(2):
            engine.step()
    while engine.rows:
        engine.step()
    return [out[i] for i in range(len(prompts))]


def test_greedy_float32_replies_equal_generate_with_the_cache_cold_and_warm(tiny_dir):
    model, tokenizer = _model(tiny_dir)
    prompts = mixed_prompts()
    expected = [s.token_ids for s in generate(model, prompts, max_new_tokens=12, temperature=0,
                                              pad_id=tokenizer.pad_token_id)]
    assert len({tuple(e) for e in expected}) > 3           # replies differ: the test can tell prompts apart
    cache = PrefixCache(4)
    cold = _engine_replies(model, tokenizer, prompts, cache)
    hits_cold = cache.hits
    warm = _engine_replies(model, tokenizer, prompts, cache, joins=(1, 5))
    assert cold == expected and warm == expected
    assert hits_cold > 0 and cache.hits - hits_cold >= sum((len(p) - 1) // BLOCK_TOKENS for p in prompts) - 1


def test_a_prefix_shared_within_a_batch_is_prefilled_once(tiny_dir):
    model, tokenizer = _model(tiny_dir)
    prompts = mixed_prompts()
    calls = []
    real = model.hidden_states

    def counting(ids, mask=None, cache=None):
        calls.append(int(mask.sum()) if mask is not None else ids.numel())
        return real(ids, mask, cache)
    model.hidden_states = counting
    _, logits = prefill(model, prompts, 4, PrefixCache(4), tokenizer.pad_token_id)
    # without the cache the 6 distinct prompts are 315 tokens. With it: base's first 64 tokens (shared by 3
    # prompts) and the first 32 (shared by 5) run once, themselves sharing 16: 16 + 16 + 48, then each
    # prompt's suffix: 9 + 13 + 7 + 23 + 1 + 6 = 59
    assert sum(len(p) for p in {tuple(p) for p in prompts}) == 315
    assert sum(calls) == 16 + 16 + 48 + 59
    model.hidden_states = real
    plain, plain_logits = prefill(model, prompts, 4, None, tokenizer.pad_token_id)
    assert torch.allclose(logits, plain_logits, atol=1e-4)
    assert plain.batch_size == len(prompts)


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_the_cache_serves_every_dtype_with_the_keys_values_a_fresh_prefill_computes(tiny_dir, dtype):
    model, tokenizer = _model(tiny_dir, dtype)
    prompts = mixed_prompts()
    cache = PrefixCache(4)
    first = _engine_replies(model, tokenizer, prompts, cache)
    second = _engine_replies(model, tokenizer, prompts, cache)
    assert cache.hits > 0 and [len(r) for r in first] == [len(r) for r in second] == [12] * len(prompts)
    # a cached block holds what prefilling its prefix alone gives, to the dtype's rounding
    kv, _ = prefill(model, [prompts[5] + [1]], 0, None, tokenizer.pad_token_id)
    [key] = block_keys(prompts[5], 1)
    k, v = cache.blocks[key]
    assert k.dtype == kv.k.dtype
    assert torch.allclose(k.float(), kv.k[:, 0, :, :BLOCK_TOKENS].float(), atol=0.05, rtol=0.05)
    assert torch.allclose(v.float(), kv.v[:, 0, :, :BLOCK_TOKENS].float(), atol=0.05, rtol=0.05)


def test_the_cache_stays_within_its_bound_and_evicts_leaves_before_their_roots():
    block = torch.zeros(2, 1, 4, 8)                                    # 2 layers, 1 kv head, 4 tokens, d 8
    size = 2 * block.numel() * 4
    cache = PrefixCache(3.5 * size / 2**20, block=4)
    chain = list(range(100, 113))                                      # 13 tokens: 3 full blocks
    cache.store(chain, 0, torch.zeros(2, 1, 12, 8), torch.zeros(2, 1, 12, 8))
    assert len(cache) == 3 and cache.bytes == 3 * size
    assert len(cache.lookup(chain)) == 3
    other = list(range(200, 209))                                      # 2 blocks more: over the bound
    cache.store(other, 0, torch.zeros(2, 1, 8, 8), torch.zeros(2, 1, 8, 8))
    assert cache.bytes <= cache.capacity_bytes and len(cache) == 3
    # the old chain lost its leaves, not its root: its first block is still found
    assert len(cache.lookup(chain)) == 1 and len(cache.lookup(other)) == 2
    with pytest.raises(ValueError, match="capacity_mb"):
        PrefixCache(0)


def test_block_keys_name_the_whole_prefix():
    a, b = block_keys([1] * 16 + [2] * 16, 2), block_keys([3] * 16 + [2] * 16, 2)
    assert a[1] != b[1] and a[0] != b[0] and block_keys([1] * 16 + [2] * 16 + [7], 2) == a


@pytest.mark.parametrize("scheduler", ["static", "continuous"])
def test_a_backend_with_the_cache_answers_chats_as_without_it(tiny_dir, scheduler):
    model, tokenizer = _model(tiny_dir)
    system = {"role": "system", "content": "You follow these skills. " + "Check every step twice. " * 12}
    requests = lambda: [CompletionRequest([system, {"role": "user", "content": f"task {i} " * (1 + i % 3)}],  # noqa
                                          temperature=0.0, max_tokens=10) for i in range(6)]
    plain = ModelBackend(model, tokenizer, "tiny").complete(requests())
    cached = ModelBackend(model, tokenizer, "tiny", prefix_cache_mb=2, scheduler=scheduler)
    for _ in range(2):                                                 # cold, then warm
        assert [[c.text for c in r] for r in cached.complete(requests())] == [[c.text for c in r] for r in plain]
    assert cached.prefix_cache.hits > 0


def test_a_prefix_the_running_rows_share_is_kept_once_and_replies_are_unchanged(tiny_dir):
    """As rollouts under a long skill library: one request arrives first (cold), the others join it later, some
    leave early; the library's keys/values are in the batch once (cascade), not in every row's slots."""
    model, tokenizer = _model(tiny_dir)
    g = torch.Generator().manual_seed(1)
    library = torch.randint(3, 300, (120,), generator=g).tolist()
    prompts = [library + torch.randint(3, 300, (3 + 5 * i,), generator=g).tolist() for i in range(5)]
    prompts.append(torch.randint(3, 300, (90,), generator=g).tolist())     # shares nothing: its own prefix
    budgets = [12, 4, 12, 7, 12, 12]
    expected = [s.token_ids for s in generate(model, prompts, max_new_tokens=budgets, temperature=0,
                                              pad_id=tokenizer.pad_token_id)]
    assert len({tuple(e) for e in expected}) > 3
    engine, out, widths = Engine(model, tokenizer, [], tokenizer.pad_token_id, PrefixCache(4)), {}, []
    sequences = []
    for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
        [s] = sequences_for(prompt, 1, None, max_new_tokens=budget, temperature=0.0)
        s.on_done = lambda s, i=i: out.__setitem__(i, s.tokens)
        sequences.append(s)
    engine.add(sequences[:1])
    engine.step()
    engine.add(sequences[1:])
    while engine.rows:
        widths.append(engine.cache.length)
        engine.step()
    assert [out[i] for i in range(len(prompts))] == expected
    # every row's slots hold what follows its prefix: at most its prompt's last partial block, its replies
    assert max(widths) <= BLOCK_TOKENS + 3 + 5 * 4 + 12 + 1 < len(library)
