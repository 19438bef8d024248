"""minskill.nn.sampling: sampling properties checked against the model's own logits, and completion log-probs."""
import pytest
import torch

from minskill.nn import sampling
from minskill.nn.model import Transformer
from minskill.nn.sampling import Sample, completion_logprobs, generate
from minskill.nn.weights import config_from_hf, load_pretrained, save_pretrained

torch.set_num_threads(1)

PROMPTS = [[3, 14, 15, 92, 65, 35], [89, 79], [32, 38, 46, 26]]


@pytest.fixture(scope="module")
def model():
    config = config_from_hf(dict(
        model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True))
    torch.manual_seed(0)
    m = Transformer(config).eval()
    with torch.no_grad():   # a moderately peaked next-token distribution: top-k / top-p cut something
        m.model.embed_tokens.weight.normal_(0, 0.2)
    return m


class CharTokenizer:
    """Token t decodes to the letter chr(97 + t % 26); enough to test text, stop tokens and stop strings."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + t % 26) for t in ids)


def next_token_logits(model, prompt, tokens):
    """(len(tokens), V) float32 logits of a full forward, at the positions that chose each token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens]))[0].float()
    return logits[len(prompt) - 1:len(prompt) - 1 + len(tokens)]


def test_top_k_never_leaves_the_k_best(model):
    samples = generate(model, PROMPTS, n=4, max_new_tokens=12, temperature=1.5, top_k=3, seed=1)
    emitted_outside_top1 = 0
    for s in samples:
        logits = next_token_logits(model, PROMPTS[s.prompt_index], s.token_ids)
        top3 = logits.topk(3).indices
        for t, tok in enumerate(s.token_ids):
            assert tok in top3[t].tolist()
            emitted_outside_top1 += tok != top3[t, 0].item()
    assert emitted_outside_top1 > 0          # it really sampled


def test_top_p_stays_in_the_nucleus(model):
    top_p = 0.6
    samples = generate(model, PROMPTS, n=3, max_new_tokens=10, temperature=1.0, top_p=top_p, seed=2)
    for s in samples:
        logits = next_token_logits(model, PROMPTS[s.prompt_index], s.token_ids)
        probs, order = logits.softmax(-1).sort(-1, descending=True)
        for t, tok in enumerate(s.token_ids):
            nucleus = order[t][(probs[t].cumsum(0) - probs[t]) < top_p]
            assert tok in nucleus.tolist()


def test_tiny_temperature_equals_greedy(model):
    greedy = generate(model, PROMPTS, max_new_tokens=15, temperature=0)
    cold = generate(model, PROMPTS, max_new_tokens=15, temperature=1e-4, seed=3)
    assert [s.token_ids for s in cold] == [s.token_ids for s in greedy]
    for s in greedy:    # greedy = argmax of the model's logits at every step
        logits = next_token_logits(model, PROMPTS[s.prompt_index], s.token_ids)
        assert logits.argmax(-1).tolist() == s.token_ids


def test_same_seed_same_samples_and_independent_of_companions(model):
    kw = dict(n=3, max_new_tokens=10, temperature=1.0, top_p=0.9)
    a = generate(model, [PROMPTS[0]], seed=7, **kw)
    b = generate(model, [PROMPTS[0]], seed=7, **kw)
    c = generate(model, [PROMPTS[0]], seed=8, **kw)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [s.token_ids for s in a] != [s.token_ids for s in c]
    assert len({tuple(s.token_ids) for s in a}) > 1           # the n samples differ from each other
    # same request inside a batch with other prompts (other lengths -> padding) and other parameters
    mixed = generate(model, [PROMPTS[1], PROMPTS[0], PROMPTS[2]], n=3, seed=[None, 7, 5],
                     temperature=[0.0, 1.0, 0.8], top_p=[1.0, 0.9, 1.0], top_k=[0, 0, 5],
                     max_new_tokens=[4, 10, 12])
    assert [s.token_ids for s in mixed[3:6]] == [s.token_ids for s in a]


def test_should_stop_ends_only_that_prompts_samples(model):
    kw = dict(n=2, max_new_tokens=12, temperature=1.0, seed=3)
    alone = generate(model, [PROMPTS[0]], **kw)
    asked = []

    def should_stop(prompt_index):      # asked once per sample per step: prompt 1 stops before its 5th token
        asked.append(prompt_index)
        return prompt_index == 1 and asked.count(1) > 2 * 4

    mixed = generate(model, [PROMPTS[0], PROMPTS[1]], should_stop=should_stop, **kw)
    assert [s.token_ids for s in mixed[:2]] == [s.token_ids for s in alone]   # the other prompt is untouched
    assert all(s.finish_reason == "length" for s in mixed[:2])
    assert [(len(s.token_ids), s.finish_reason) for s in mixed[2:]] == [(4, "cancelled")] * 2


def test_prompt_is_prefilled_once_and_samples_are_prompt_major(model, monkeypatch):
    prefills = []
    original = model.hidden_states

    def spy(input_ids, attention_mask=None, cache=None):
        if cache is not None and cache.length == 0:
            prefills.append(tuple(input_ids.shape))
        return original(input_ids, attention_mask, cache)

    monkeypatch.setattr(model, "hidden_states", spy)
    samples = generate(model, PROMPTS, n=4, max_new_tokens=[3, 5, 2], temperature=1.0, seed=0)
    assert prefills == [(3, 6)]                     # one prefill of the 3 prompts, not of 12 rows
    assert [s.prompt_index for s in samples] == [0] * 4 + [1] * 4 + [2] * 4
    assert [len(s.token_ids) for s in samples] == [3] * 4 + [5] * 4 + [2] * 4
    assert all(isinstance(s, Sample) and s.finish_reason == "length" for s in samples)


def test_stop_tokens_stop_strings_and_early_exit(model, monkeypatch):
    greedy = generate(model, PROMPTS, max_new_tokens=12, temperature=0)
    stop_tok = greedy[0].token_ids[4]
    first = greedy[0].token_ids.index(stop_tok)
    tok = CharTokenizer()
    out = generate(model, PROMPTS[:1], max_new_tokens=12, temperature=0, stop_token_ids=[stop_tok], tokenizer=tok)
    assert out[0].token_ids == greedy[0].token_ids[:first + 1] and out[0].finish_reason == "stop"
    assert out[0].text == tok.decode(greedy[0].token_ids[:first])            # text without the stop token
    assert len(out[0].logprobs) == len(out[0].token_ids)

    full_text = tok.decode(greedy[1].token_ids)
    stop_string = full_text[3:5]
    out = generate(model, PROMPTS, max_new_tokens=12, temperature=0, tokenizer=tok,
                   stop_strings=[[], [stop_string], ["@@", tok.decode(greedy[2].token_ids[:2])]])
    assert out[1].finish_reason == "stop" and out[1].text == full_text[:full_text.find(stop_string)]
    assert len(out[1].token_ids) == len(out[1].logprobs) < 12
    assert out[0].text == tok.decode(greedy[0].token_ids) and out[0].finish_reason == "length"
    assert out[2].finish_reason == "stop" and out[2].text == "" and out[2].token_ids == greedy[2].token_ids[:2]

    calls = []
    original = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    # every row stops at its first token -> no decoding step at all
    firsts = [s.token_ids[0] for s in greedy]
    out = generate(model, PROMPTS, max_new_tokens=12, temperature=0, stop_token_ids=firsts)
    assert [len(s.token_ids) for s in out] == [1, 1, 1] and calls == []
    assert generate(model, PROMPTS[:1], max_new_tokens=0)[0].token_ids == []


def test_bad_arguments_are_named(model):
    with pytest.raises(ValueError, match="temperature has 2 values for 3 prompts"):
        generate(model, PROMPTS, temperature=[0.5, 0.5])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(model, [[1], []])
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        generate(model, PROMPTS, stop_strings=["x"])
    with pytest.raises(ValueError, match="top_p"):
        generate(model, PROMPTS, top_p=0)


def test_completion_logprobs_match_full_forward_and_generate(model):
    temperature = 0.7
    samples = generate(model, PROMPTS, n=2, max_new_tokens=[6, 9, 4], temperature=temperature, seed=11)
    prompts = [PROMPTS[s.prompt_index] for s in samples]
    completions = [s.token_ids for s in samples]
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, prompts, completions, temperature=temperature, chunk_tokens=5)
    assert logprobs.dtype == torch.float32 and logprobs.shape == mask.shape == (6, 9)
    assert mask.sum(1).tolist() == [len(c) for c in completions]
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ref = torch.log_softmax(next_token_logits(model, p, c) / temperature, -1)
        ref = ref.gather(1, torch.tensor(c)[:, None]).squeeze(1)
        assert (logprobs[i, :len(c)] - ref).abs().max() <= 1e-5
        assert (logprobs[i, :len(c)] - torch.tensor(samples[i].logprobs)).abs().max() <= 1e-4
        assert (logprobs[i, len(c):] == 0).all()


def test_completion_logprobs_gradient_flows(model):
    prompts, completions = [PROMPTS[0], PROMPTS[1]], [[1, 2, 3], [4, 5, 6, 7, 8]]
    model.zero_grad()
    logprobs, mask = completion_logprobs(model, prompts, completions, chunk_tokens=3)
    logprobs[mask].sum().backward()
    chunked = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = 0
    for p, c in zip(prompts, completions):     # the naive (B, T, V) computation
        logits = model(torch.tensor([p + c]))[0, len(p) - 1:-1].float()
        ref = ref + torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None]).sum()
    ref.backward()
    assert any(g.abs().sum() > 0 for g in chunked.values())
    for n, p in model.named_parameters():
        assert torch.allclose(chunked[n], p.grad, atol=1e-5), n
    model.zero_grad()


def test_bfloat16_generation_runs(model, tmp_path):
    save_pretrained(model, tmp_path)
    bf16 = load_pretrained(tmp_path, dtype=torch.bfloat16)
    samples = generate(bf16, PROMPTS, n=2, max_new_tokens=5, temperature=1.0, top_k=10, seed=0)
    assert [len(s.token_ids) for s in samples] == [5] * 6
    assert all(-1e9 < lp <= 0 for s in samples for lp in s.logprobs)


def test_chat_command_prints_the_reply(model, monkeypatch, capsys):
    class ChatTokenizer(CharTokenizer):
        stop_token_ids, pad_token_id = [0], 0

        def apply_chat_template(self, messages, add_generation_prompt=True):
            assert messages == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Capital of France?"}]
            return PROMPTS[0]

    loaded = []
    monkeypatch.setattr(sampling, "load_model",
                        lambda spec, dtype=None, device=None: loaded.append((spec, dtype)) or (model, ChatTokenizer()))
    sampling.main(["--model", "tiny", "--prompt", "Capital of France?", "--system", "Be brief.",
                   "--max-new-tokens", "6"])
    expected = generate(model, [PROMPTS[0]], max_new_tokens=6, temperature=0, stop_token_ids=[0],
                        tokenizer=ChatTokenizer())[0].text
    assert capsys.readouterr().out.strip() == expected.strip() and loaded == [("tiny", torch.float32)]


MIXED = dict(n=3, seed=[4, 7, 5], temperature=[0.0, 1.0, 0.8], top_p=[1.0, 0.9, 1.0], top_k=[0, 0, 5],
             max_new_tokens=[4, 13, 11])


@pytest.mark.parametrize("sync_every", [2, 5, 8, 64])
def test_samples_do_not_depend_on_how_often_the_host_looks(model, sync_every):
    """A GPU decodes blocks of sync_every tokens between two looks at the host: the samples (tokens, stop by token
    and by string, lengths, streamed tokens; log-probs to rounding) are the CPU's token-by-token ones."""
    tok = CharTokenizer()
    greedy = generate(model, PROMPTS, max_new_tokens=12, temperature=0)
    kw = dict(MIXED, stop_token_ids=[greedy[0].token_ids[5]], tokenizer=tok,
              stop_strings=[[], [tok.decode(greedy[1].token_ids[2:4])], ["q"]])
    streamed = {1: [], sync_every: []}
    by_step = generate(model, PROMPTS, sync_every=1, on_token=lambda r, t: streamed[1].append((r, t)), **kw)
    blocks = generate(model, PROMPTS, sync_every=sync_every,
                      on_token=lambda r, t: streamed[sync_every].append((r, t)), **kw)
    assert [(s.token_ids, s.text, s.finish_reason) for s in blocks] == \
        [(s.token_ids, s.text, s.finish_reason) for s in by_step] and streamed[1] == streamed[sync_every]
    for a, b in zip(blocks, by_step):   # finished rows leave the batch at other steps: float rounding only
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert {s.finish_reason for s in by_step} == {"stop", "length"}     # both ways of ending are exercised


def test_a_decoding_block_reads_the_device_once(model, monkeypatch):
    """No per-token host sync: with sync_every=8, 24 tokens of sampled (top-k) and greedy rows read device values
    on the host a few times per block (tokens and log-probs), not several times a token as before."""
    reads = []
    for name in ("tolist", "item", "__bool__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name: reads.append(_n) or _o(self, *a))
    generate(model, PROMPTS, n=2, max_new_tokens=24, temperature=[1.0, 0.0, 0.7], top_k=[0, 0, 8], seed=1,
             sync_every=8)
    assert len(reads) <= 3 * 4 + 2                   # 3 blocks x (tokens, log-probs, a cache drop) + the prefill


def test_under_bf16_autocast_the_kv_cache_is_kept_in_bf16(model, monkeypatch):
    made = []
    original = model.new_cache
    monkeypatch.setattr(model, "new_cache", lambda *a, **k: made.append(original(*a, **k)) or made[-1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        samples = generate(model, PROMPTS, n=2, max_new_tokens=6, temperature=1.0, seed=0)
    assert made[0].k.dtype == torch.bfloat16 and [len(s.token_ids) for s in samples] == [6] * 6
    generate(model, PROMPTS, max_new_tokens=2, temperature=0)
    assert made[1].k.dtype == torch.float32              # no autocast: the weights' dtype, as before


@pytest.mark.parametrize("sync_every", [1, 8])
def test_top_logprobs_are_the_k_most_likely_of_the_drawn_distribution(model, sync_every):
    """top_logprobs=k keeps, per token, the k most likely tokens of log_softmax(logits / T) (before top-k/top-p),
    per prompt (0: none); the tokens drawn are those drawn without it."""
    kw = dict(MIXED, stop_token_ids=[7], sync_every=sync_every)
    plain = generate(model, PROMPTS, **kw)
    with_top = generate(model, PROMPTS, top_logprobs=[0, 3, 5], **kw)
    assert [s.token_ids for s in with_top] == [s.token_ids for s in plain]
    for s in with_top:
        k, temperature = [0, 3, 5][s.prompt_index], MIXED["temperature"][s.prompt_index] or 1.0
        if k == 0:
            assert s.top_logprobs is None
            continue
        assert len(s.top_logprobs) == len(s.token_ids)
        expected = torch.log_softmax(next_token_logits(model, PROMPTS[s.prompt_index], s.token_ids) / temperature, -1)
        for t, top in enumerate(s.top_logprobs):
            best = expected[t].topk(k)
            assert [i for i, _ in top] == best.indices.tolist()
            assert [v for _, v in top] == pytest.approx(best.values.tolist(), abs=1e-4)
            assert s.logprobs[t] == pytest.approx(float(expected[t, s.token_ids[t]]), abs=1e-4)
