"""minskill.nn.model against Hugging Face transformers on tiny random checkpoints of each family; loading and
saving them (minskill.nn.weights: load_pretrained / save_pretrained)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from minskill.nn.model import KVCache
from minskill.nn.sampling import generate
from minskill.nn.weights import config_from_hf, config_to_hf, load_pretrained, save_pretrained

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}

CASES = {  # name -> (HF config class, HF model class, extra config)
    "llama3_tied": ("LlamaConfig", "LlamaForCausalLM",
                    dict(rope_scaling=LLAMA3_ROPE, rope_theta=500000.0, tie_word_embeddings=True)),
    "llama_untied_bias": ("LlamaConfig", "LlamaForCausalLM",
                          dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen2_untied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False, rope_theta=1e6)),
    "qwen3_untied": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
    "qwen3_tied_bias": ("Qwen3Config", "Qwen3ForCausalLM",
                        dict(head_dim=24, tie_word_embeddings=True, attention_bias=True)),
}


def make_hf(name):
    config_cls, model_cls, extra = CASES[name]
    config = getattr(transformers, config_cls)(**TINY, **extra)
    torch.manual_seed(list(CASES).index(name))
    hf = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # HF's init (std 0.02, zero biases, unit norms) is too flat to tell models apart
        for p_name, p in hf.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in p_name else 0.15 * torch.randn_like(p))
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (HF model, folder written by HF save_pretrained)."""
    out = {}
    for name in CASES:
        hf = make_hf(name)
        folder = tmp_path_factory.mktemp(name)
        hf.save_pretrained(folder)
        out[name] = (hf, folder)
    hf = out["qwen3_untied"][0]
    folder = tmp_path_factory.mktemp("sharded")
    hf.save_pretrained(folder, max_shard_size="100KB")
    out["sharded"] = (hf, folder)
    return out


def left_pad(prompts, pad=0):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


PROMPTS = [[5, 17, 200, 3, 99, 41, 7, 8, 150, 33, 60, 12], [250, 4, 4, 90], [1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("name", list(CASES) + ["sharded"])
def test_logits_and_greedy_match_transformers(checkpoints, name):
    hf, folder = checkpoints[name]
    if name == "sharded":
        assert (folder / "model.safetensors.index.json").exists() and not (folder / "model.safetensors").exists()
        assert len({*json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()}) > 1
    model = load_pretrained(folder)
    assert ("lm_head.weight" in load_file_keys(folder)) != model.config.tie_word_embeddings
    ids, mask = left_pad(PROMPTS)
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
        ours = model(ids, attention_mask=mask)
        ref_long = hf(torch.arange(100)[None] % 256).logits   # 100 positions: llama3 scaling matters
        ours_long = model(torch.arange(100)[None] % 256)
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max().item() <= 1e-4
    assert (ours_long - ref_long).abs().max().item() <= 1e-4

    # no eos at all: min_new_tokens would instead mask the eos logit and change the greedy path
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        hf_out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                             pad_token_id=0)[:, ids.shape[1]:]
    assert hf_out.shape == (3, 20)
    samples = generate(model, PROMPTS, max_new_tokens=20, temperature=0)
    assert [s.token_ids for s in samples] == hf_out.tolist()
    assert all(s.finish_reason == "length" for s in samples)


def load_file_keys(folder):
    if (folder / "model.safetensors").exists():
        return set(load_file(folder / "model.safetensors"))
    return set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])


def test_kv_cache_decoding_equals_full_forward(checkpoints):
    model = load_pretrained(checkpoints["qwen3_tied_bias"][1])
    ids, mask = left_pad(PROMPTS)
    extra = torch.randint(0, 256, (3, 6))
    full_ids, full_mask = torch.cat([ids, extra], 1), torch.cat([mask, torch.ones_like(extra)], 1)
    with torch.no_grad():
        full = model(full_ids, attention_mask=full_mask)
        cache = model.new_cache(3, 40)
        steps = [model(ids, attention_mask=mask, cache=cache)]
        steps.append(model(extra[:, :2], cache=cache))                 # a 2-token chunk after the prompt
        for t in range(2, 6):                                           # then one token at a time
            steps.append(model(extra[:, t:t + 1], cache=cache))
    incremental = torch.cat(steps, 1)
    real = full_mask.bool()
    assert (incremental[real] - full[real]).abs().max().item() <= 1e-5
    assert cache.length == full_ids.shape[1]
    assert cache.next_position.tolist() == (full_mask.sum(1)).tolist()
    assert cache.key_mask[:, :cache.length].equal(real)


def test_left_padded_batch_equals_one_by_one(checkpoints):
    model = load_pretrained(checkpoints["llama3_tied"][1])
    ids, mask = left_pad(PROMPTS)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        for i, p in enumerate(PROMPTS):
            alone = model(torch.tensor([p]))
            assert (batch[i, -len(p):] - alone[0]).abs().max().item() <= 1e-5
            assert not batch[i].isnan().any()           # pad rows attend to themselves: no NaN
    together = generate(model, PROMPTS, max_new_tokens=15, temperature=0)
    alone = [generate(model, [p], max_new_tokens=15, temperature=0)[0] for p in PROMPTS]
    assert [s.token_ids for s in together] == [s.token_ids for s in alone]


def test_cache_repeat_and_select(checkpoints):
    model = load_pretrained(checkpoints["qwen2_tied"][1])
    ids, mask = left_pad(PROMPTS[:2])
    with torch.no_grad():
        cache = model.new_cache(2, 30)
        model(ids, attention_mask=mask, cache=cache)
        rep = cache.repeat_interleave(3)
        assert rep.batch_size == 6 and rep.length == cache.length
        assert rep.k[:, 3].equal(cache.k[:, 1]) and rep.next_position.tolist() == [12] * 3 + [4] * 3
        sel = rep.select([5, 0])
        assert sel.k[:, 0].equal(cache.k[:, 1]) and sel.key_mask[1].equal(cache.key_mask[0])
        with pytest.raises(ValueError, match="cache overflow"):
            model(torch.zeros(2, 30, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip_is_bit_identical(checkpoints, tmp_path, dtype):
    name = "llama3_tied" if dtype == torch.float32 else "qwen3_untied"
    model = load_pretrained(checkpoints[name][1], dtype=dtype)
    assert all(p.dtype == dtype for p in model.parameters())
    save_pretrained(model, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    again = load_pretrained(tmp_path / "out", dtype=dtype)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ("lm_head.weight" in load_file(tmp_path / "out" / "model.safetensors")) != model.config.tie_word_embeddings
    assert again.lm_head.weight is again.model.embed_tokens.weight or not model.config.tie_word_embeddings
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    original = json.loads((checkpoints[name][1] / "config.json").read_text())
    assert {k for k in original if k not in ("dtype", "torch_dtype")} <= set(saved)   # unknown keys kept
    assert saved["torch_dtype"] == str(dtype).removeprefix("torch.")
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))


def test_saved_checkpoint_loads_in_transformers(checkpoints, tmp_path):
    hf, folder = checkpoints["llama3_tied"]
    save_pretrained(load_pretrained(folder), tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        assert (reloaded(ids).logits - hf(ids).logits).abs().max().item() <= 1e-6


def test_old_style_config_keys(checkpoints, tmp_path):
    """Released checkpoints write rope_theta + rope_scaling (with "type" or "rope_type"), not rope_parameters."""
    hf, folder = checkpoints["llama3_tied"]
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {("type" if k == "rope_type" else k): v for k, v in rope.items()}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    model = load_pretrained(tmp_path)
    assert model.config.rope_theta == 500000.0 and model.config.rope_scaling["rope_type"] == "llama3"
    ids = torch.tensor([list(range(60))])
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() <= 1e-4
    assert config_from_hf({**config, "rope_scaling": None}).rope_scaling is None
    assert config_from_hf({**config, "rope_scaling": {"rope_type": "default"}}).rope_scaling is None
    assert "rope_scaling" in config_to_hf(config_from_hf(config))


def test_tied_checkpoint_that_also_stores_lm_head_loads(checkpoints, tmp_path):
    folder = checkpoints["qwen2_tied"][1]
    state = load_file(folder / "model.safetensors")
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    model = load_pretrained(tmp_path, dtype=torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not any(t.is_meta for t in model.state_dict().values()) and model.rope_inv_freq.dtype == torch.float32


def test_missing_and_unexpected_tensors_are_named(checkpoints, tmp_path):
    folder = checkpoints["qwen2_untied"][1]
    state = load_file(folder / "model.safetensors")
    state.pop("model.layers.1.self_attn.k_proj.bias")
    state["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ValueError) as err:
        load_pretrained(tmp_path)
    assert "model.layers.1.self_attn.k_proj.bias" in str(err.value)
    assert "model.layers.0.mlp.extra_proj.weight" in str(err.value)

    state = load_file(folder / "model.safetensors")
    state["model.norm.weight"] = torch.ones(65)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(65,\)"):
        load_pretrained(tmp_path)


def test_bad_configs_raise_naming_the_problem(tmp_path):
    base = {"model_type": "llama", **TINY}
    with pytest.raises(ValueError, match="'mistral'"):
        config_from_hf({**base, "model_type": "mistral"})
    with pytest.raises(ValueError, match="'yarn'"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="hidden_size"):
        config_from_hf({k: v for k, v in base.items() if k != "hidden_size"})
    (tmp_path / "config.json").write_text(json.dumps({**base, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="'gpt2'"):
        load_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path / "nowhere")


def test_gradient_checkpointing_gives_the_same_gradients(checkpoints):
    grads = []
    for flag in (False, True):
        model = load_pretrained(checkpoints["qwen3_untied"][1]).train()
        model.gradient_checkpointing = flag
        ids, mask = left_pad(PROMPTS)
        model(ids, attention_mask=mask)[mask.bool()].logsumexp(-1).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().sum() > 0 and torch.allclose(grads[0], grads[1], atol=1e-6)


def test_bfloat16_forward_is_close_to_float32(checkpoints):
    folder = checkpoints["qwen2_tied"][1]
    ids, mask = left_pad(PROMPTS)
    with torch.no_grad():
        f32 = load_pretrained(folder)(ids, attention_mask=mask)
        bf16 = load_pretrained(folder, dtype=torch.bfloat16)(ids, attention_mask=mask)
    assert bf16.dtype == torch.bfloat16
    real = mask.bool()
    assert (bf16.float()[real] - f32[real]).abs().max().item() < 0.1 * f32.abs().max().item()


def test_kvcache_shapes():
    config = config_from_hf({"model_type": "qwen3", **TINY, "head_dim": 8})
    cache = KVCache(config, batch_size=3, max_len=10, dtype=torch.bfloat16, device="cpu")
    assert cache.k[0].shape == (3, 2, 10, 8) and cache.k.dtype == torch.bfloat16
    assert cache.key_mask.shape == (3, 10) and cache.next_position.tolist() == [0, 0, 0] and cache.length == 0


def test_masked_attention_with_kv_repeated_per_head_equals_the_gqa_call(monkeypatch):
    """On CUDA a masked GQA attention repeats k/v to the query heads (fused memory-efficient kernel instead of the
    math one); the same code forced on the CPU gives the CPU's GQA results (padded prefill, decode, a cache)."""
    from minskill.nn import model as model_module
    config = config_from_hf(dict(model_type="qwen3", vocab_size=97, hidden_size=64, intermediate_size=96,
                                 num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=16))
    torch.manual_seed(0)
    m = model_module.Transformer(config).eval()
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]])
    calls = []
    original = model_module.F.scaled_dot_product_attention
    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: calls.append((q.shape[1], k.shape[1], kw.get("enable_gqa"))) or
                        original(q, k, v, **kw))

    def run():
        with torch.no_grad():
            cache = m.new_cache(3, 10)
            prefill = m(ids, mask, cache)
            step = m(torch.tensor([[1], [2], [3]]), cache=cache)
            return prefill, step, generate(m, [[5, 6, 7], [8]], n=2, max_new_tokens=4, temperature=1.0, seed=0)
    gqa = run()
    assert (8, 2, True) in calls and (8, 8, False) not in calls
    calls.clear()
    monkeypatch.setattr(model_module, "EXPAND_KV_FOR_MASK", ("cuda", "cpu"))
    repeated = run()
    assert (8, 8, False) in calls and (8, 2, True) not in calls    # the masked prefill took the repeated path
    assert torch.allclose(gqa[0], repeated[0], atol=1e-5) and torch.allclose(gqa[1], repeated[1], atol=1e-5)
    assert [s.token_ids for s in gqa[2]] == [s.token_ids for s in repeated[2]]
