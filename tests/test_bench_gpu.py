"""`python -m minskill.measure.bench gpu`: the published Qwen3 architectures it builds (parameter counts), the rows it
prints (smoke-tested on the CPU with --config tiny), and exit code 2 with a clear message without CUDA."""
import contextlib
import io
import re

import pytest
import torch

from minskill.measure import bench
from minskill.nn.lora import apply_lora, trainable_parameters


@pytest.mark.parametrize("name, params, adapter_params", [
    ("qwen3-0.6b", 596_049_920, 10_092_544), ("qwen3-1.7b", 1_720_574_976, 17_432_576),
    ("qwen3-4b", 4_022_468_096, 33_030_144), ("qwen3-8b", 8_190_735_360, 43_646_976)])
def test_the_published_architectures_have_their_parameter_counts(name, params, adapter_params):
    """Built on `meta` (no memory): the totals of Qwen3-0.6B/1.7B/4B/8B (0.6B, 1.7B, 4.0B, 8.2B: tied embeddings up
    to 4B), and the LoRA r = 16 adapter size on all 7 projections (33,030,144 for 4B, as PEFT counts it)."""
    model = bench.random_model(name, "meta")
    assert sum(p.numel() for p in model.parameters()) == params
    cfg = model.config
    assert (cfg.vocab_size, cfg.head_dim, cfg.model_type, cfg.qk_norm) == (151936, 128, "qwen3", True)
    apply_lora(model, 16)
    assert sum(p.numel() for p in trainable_parameters(model)) == adapter_params


def test_bench_gpu_prints_its_rows_on_a_cpu_smoke_run():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main(["gpu", "--device", "cpu", "--config", "tiny", "--decode-tokens", "4", "--repeats", "1",
                    "--sft-length", "64", "--skill-tokens", "8", "--context-tokens", "32", "--micro-batch", "2"])
    text = out.getvalue()
    assert text.startswith("bench gpu: tiny (") and "on CPU" in text
    rows = dict(re.findall(r"^\| (.+?) \| ([0-9.]+) \|$", text, flags=re.M))
    for mode in ("full, float32 weights + AdamW", "LoRA r=16, bf16 base"):
        for name in (f"Skill-R1 update s ({mode})", f"Skill-R1 update peak MiB ({mode})",
                     f"SFT tok/s, grad checkpointing ({mode})", f"SFT peak MiB ({mode})"):
            assert name in rows, name
        for update in (", micro-batch 2, β = 0.04", ", masked: a prompt per candidate"):   # both update paths
            assert float(rows[f"Skill-R1 update s{update} ({mode})"]) > 0
    for decode in ("batch 1 (bf16 weights)", "batch 8 (bf16 weights)", "n = K = 4 from one prompt (bf16 weights)",
                   "n = K = 4, bf16 autocast, float32 weights"):
        assert float(rows[f"decode tok/s, {decode}"]) > 0
    assert float(rows["Skill-R1 update s (full, float32 weights + AdamW)"]) > 0
    assert float(rows["SFT tok/s, grad checkpointing (LoRA r=16, bf16 base)"]) > 0


def test_bench_gpu_without_cuda_exits_2_saying_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        bench.main(["gpu", "--config", "qwen3-4b"])
    assert exit_.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
