"""On one CUDA GPU (skipped without one): tiny-model Skill-R1 steps (bf16 autocast, β > 0, full and LoRA with a
bf16 base), SFT steps with gradient checkpointing (full and LoRA), greedy generation equal on CUDA and on the
CPU for a float32 model, the server on CUDA (in process and as the embedded subprocess) answering the official
`openai` client, `rewrite.py apply` on CUDA, and `bench gpu` on a tiny config.

And on a randomly initialised Qwen3-0.6B (its published shapes: 28 layers, 16/8 heads of 128, q/k-norm, a 151,936
vocabulary): a full train_grpo.py step against a scripted task server with the CUDA defaults (bf16
autocast, TF32), full and LoRA with β > 0; the masked attention paths (padded sampling, both update paths) with
SDPA restricted to the fused flash / memory-efficient kernels; gradient checkpointing lowering the update's peak
memory on both update paths; SFT steps, full and LoRA. tests/gpu_check.sh runs this file and `bench gpu`.

The CPU stand-in for the device-placement part of these checks is tests/test_device_placement.py (and the
LoRA case in tests/test_lora.py); this file runs the real thing where a GPU is there. Run it alone with
    python -m pytest -q tests/test_gpu.py
"""
import contextlib
import io
import json
import math

import pytest
import torch
from safetensors.torch import load_file

import rewrite
import train_grpo
from helpers import common_flags, keyword_task_model, read_rows, write_keyword_suite
from minskill.measure import bench
from minskill.sft import sft_throughput
from minskill.nn.lora import ADAPTER_DIR, apply_lora
from minskill.nn.sampling import completion_logprobs, generate
from minskill.nn.shared_prefix import shared_prefix_logprobs
from minskill.nn.weights import load_model
from minskill.serve.embedded import embedded_client
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import ModelBackend, start_server
from minskill.skillsets import SkillSet
from tiny import make_tiny_model_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MESSAGES = [{"role": "user", "content": "What is six times seven?"}]
TASK = "Sums of small numbers."
TARGET = {"common_mistakes": ["Carry the one."]}


# the published config.json of Qwen/Qwen3-0.6B, as make_tiny_model_dir's overrides (its tokenizer stays the tiny one:
# ids past it decode to nothing, which a random editor's reply may hold)
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0,
                 max_position_embeddings=40960, tie_word_embeddings=True)


@pytest.fixture
def no_tf32():
    """float32 matmuls in float32: train_grpo.py's set-up turns TF32 on for the whole process (docs/gpu.md)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("gpu-tiny") / "model", family="llama", chat_format="chatml",
                               max_position_embeddings=4096)


# ------------------------------------------------------------------------------------------ Skill-R1


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    return write_keyword_suite(tmp_path_factory.mktemp("gpu-suite") / "keywords.jsonl")


@pytest.fixture(scope="module")
def task_url():
    with start_server(ScriptedBackend(keyword_task_model, name="keywords")) as server:
        yield server.url


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_skill_r1_steps_on_cuda_bf16_with_a_kl_reference(tiny_dir, suite_file, task_url, tmp_path, lora):
    out = tmp_path / "run"
    flags = common_flags(tiny_dir, suite_file, task_url, out) + [
        "--steps", "2", "--bf16", "--beta", "0.1", "--ppo-epochs", "2", "--lr", "1e-2", "--grad-checkpointing"]
    if lora:
        flags += ["--lora-rank", "4", "--lora-base-dtype", "bfloat16", "--lr", "3e-2"]
    torch.cuda.reset_peak_memory_stats()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train_grpo.main(flags) == 0
    assert torch.cuda.max_memory_allocated() > 0                        # the editor did run on the GPU
    rows = read_rows(out)
    assert len(rows) == 2
    for row in rows:
        assert row["kl"] > 0 and row["ratio_mean"] != 1.0             # epoch 2 moved away from the reference
        assert all(0.0 <= r <= 1.0 for r in row["reward_per_generation"]) and math.isfinite(row["loss"])
    expected = "the editor with its LoRA adapters off" if lora else "frozen copy of the editor"
    assert f"reference model: {expected}" in printed.getvalue()
    editor, tokenizer = load_model(str(out / "checkpoint"))            # the checkpoint loads on the CPU
    assert torch.isfinite(editor(torch.tensor([tokenizer.encode("Solve task 1")]))).all()
    assert (out / "checkpoint" / ADAPTER_DIR / "adapter_model.safetensors").is_file() == lora


# ------------------------------------------------------------------------------------------ SFT and rewrite.py


def run_rewrite(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = rewrite.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("gpu-rewrite")
    records = [{"model_card": {"name": name}, "skills_in": {"common_mistakes": []}, "task_description": TASK,
                "skills_out": TARGET} for name in ("alpha", "beta")]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "card.json").write_text(json.dumps({"name": "alpha"}))
    (root / "skills_in.json").write_text(json.dumps({"common_mistakes": []}))
    return root


def train_flags(sft_files, tiny_dir, out, *extra):
    return ["train", str(sft_files / "sft.jsonl"), "--base-model", str(tiny_dir), "--out", str(out),
            "--batch-size", "2", "--micro-batch", "1", "--val-fraction", "0", "--save-every", "1000",
            "--log-every", "1000", "--device", "cuda", "--grad-checkpointing", *extra]


@pytest.fixture(scope="module")
def trained_rewriter(sft_files, tiny_dir):
    """The CPU test's memorising recipe (test_rewrite.py: lr 2e-2, 40 epochs), float32, on CUDA, with gradient
    checkpointing."""
    out = sft_files / "rewriter"
    code, stdout, stderr = run_rewrite(train_flags(sft_files, tiny_dir, out, "--lr", "2e-2", "--epochs", "40"))
    assert code == 0, stderr
    return out


def test_sft_steps_on_cuda_with_gradient_checkpointing(trained_rewriter):
    losses = [json.loads(line)["loss"] for line in (trained_rewriter / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 40 and losses[-1] < 0.1 * losses[0]
    assert (trained_rewriter / "final" / "model.safetensors").is_file()


def test_lora_sft_steps_on_cuda_bf16_with_gradient_checkpointing(sft_files, tiny_dir):
    out = sft_files / "lora-rewriter"
    code, _, stderr = run_rewrite(train_flags(sft_files, tiny_dir, out, "--lr", "2e-2", "--epochs", "4", "--bf16",
                                              "--lora-rank", "4", "--lora-base-dtype", "bfloat16"))
    assert code == 0, stderr
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and torch.isfinite(torch.tensor(losses)).all()
    merged = load_file(str(out / "final" / "model.safetensors"))
    assert set(merged) == set(load_file(str(tiny_dir / "model.safetensors")))
    assert all(t.dtype == torch.float32 for t in merged.values())     # merged in float32, whatever the base
    assert (out / "final" / ADAPTER_DIR / "adapter_config.json").is_file()


def test_rewrite_apply_on_cuda_writes_the_memorised_skills(trained_rewriter, sft_files, tmp_path):
    out = tmp_path / "adapted"
    code, stdout, stderr = run_rewrite(["apply", "--rewriter", str(trained_rewriter), "--model-card",
                                        str(sft_files / "card.json"), "--skills", str(sft_files / "skills_in.json"),
                                        "--task", TASK, "--out", str(out), "--max-new-tokens", "40",
                                        "--device", "cuda"])
    assert code == 0, stderr
    assert SkillSet.load(out).to_json() == TARGET


# ------------------------------------------------------------------------------------------ sampling, server


def test_greedy_generation_is_the_same_on_cuda_and_cpu(tiny_dir, no_tf32):
    cpu, tokenizer = load_model(str(tiny_dir), dtype=torch.float32, device="cpu")
    cuda, _ = load_model(str(tiny_dir), dtype=torch.float32, device="cuda")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
               for text in ("What is six times seven?", "Name a city.", "hello")]
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        torch.testing.assert_close(cuda(ids.cuda()).cpu(), cpu(ids), rtol=0, atol=1e-4)
    on_cpu = generate(cpu, prompts, max_new_tokens=16, temperature=0.0, tokenizer=tokenizer,
                      pad_id=tokenizer.pad_token_id)
    on_cuda = generate(cuda, prompts, max_new_tokens=16, temperature=0.0, tokenizer=tokenizer,
                       pad_id=tokenizer.pad_token_id)
    assert [s.token_ids for s in on_cuda] == [s.token_ids for s in on_cpu]


def test_the_server_on_cuda_answers_the_openai_client(tiny_dir, no_tf32):
    openai = pytest.importorskip("openai")
    model, tokenizer = load_model(str(tiny_dir), dtype=torch.float32, device="cuda")
    with start_server(ModelBackend(model.eval(), tokenizer, name="tiny")) as server:
        reply = openai.OpenAI(base_url=server.url, api_key="none").chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    in_process = reply.choices[0].message.content
    assert isinstance(in_process, str) and reply.choices[0].finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= 8 and reply.usage.prompt_tokens > 0
    # the embedded server (a subprocess, as the scripts start it) on CUDA gives the same greedy reply
    with embedded_client(model_spec=str(tiny_dir), api_key="gpu-test", device="cuda",
                         server_args=("--dtype", "float32")) as client:   # its CUDA default: bf16 weights
        reply = openai.OpenAI(base_url=client.base_url, api_key="gpu-test").chat.completions.create(
            model=client.model, messages=MESSAGES, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == in_process


def test_bench_gpu_runs_on_cuda():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench.main(["gpu", "--config", "tiny", "--decode-tokens", "4", "--repeats", "1", "--sft-length", "64",
                    "--skill-tokens", "8", "--context-tokens", "32"])
    text = printed.getvalue()
    assert torch.cuda.get_device_name() in text and "out of memory" not in text
    assert "| Skill-R1 update peak MiB (LoRA r=16, bf16 base) |" in text


# ------------------------------------------------------------------------------------------ Qwen3-0.6B shapes


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("gpu-qwen3") / "qwen3-0.6b", family="qwen3",
                               chat_format="chatml", init_std=0.02, **QWEN3_06B)


@pytest.fixture(scope="module")
def qwen3(qwen3_dir):
    """The float32 master copy on the GPU, as train_grpo.py loads its editor."""
    model, tokenizer = load_model(str(qwen3_dir), dtype=torch.float32, device="cuda")
    return model, tokenizer


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-beta"])
def test_a_train_grpo_step_on_qwen3_shapes_with_the_cuda_defaults(qwen3_dir, suite_file, task_url, tmp_path, lora):
    """No --bf16 and no --device: on CUDA the step runs bf16 autocast over float32 weights, with TF32, and says so."""
    out = tmp_path / "run"
    flags = common_flags(qwen3_dir, suite_file, task_url, out) + ["--steps", "1", "--lr", "1e-5"]
    if lora:
        flags += ["--lora-rank", "8", "--lora-base-dtype", "bfloat16", "--beta", "0.04"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train_grpo.main(flags) == 0
    assert "device cuda, bf16 autocast compute, float32 weights + TF32" in printed.getvalue()
    assert torch.backends.cuda.matmul.allow_tf32
    [row] = read_rows(out)
    assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) and row["logp_mismatch"] < 0.5
    assert math.isfinite(row["kl"]) and (out / "checkpoint" / ADAPTER_DIR).is_dir() == lora


def fused_only():
    """SDPA restricted to the fused kernels: a call that only the math kernel could run raises."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def test_masked_attention_runs_on_fused_kernels(qwen3):
    """Padded batched sampling (masked prefill and decode) and both update paths (the shared-prefix completion pass,
    the padded --no-shared-prefix pass), forward and backward, under bf16 autocast, with no math kernel; the KV cache
    is bf16."""
    model, _ = qwen3
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 151936, (n,), generator=g).tolist() for n in (300, 17, 128)]
    completions = torch.randint(10, 151936, (4, 24), generator=g).tolist()
    made, new_cache = [], model.new_cache
    model.new_cache = lambda *a, **k: made.append(new_cache(*a, **k)) or made[-1]
    try:
        with fused_only(), torch.autocast("cuda", dtype=torch.bfloat16):
            samples = generate(model, prompts, n=2, max_new_tokens=12, temperature=1.0, seed=0)
            model.train()
            logp, mask = shared_prefix_logprobs(model, prompts[0], completions)
            logp2, mask2 = completion_logprobs(model, [prompts[0], prompts[1], prompts[2], prompts[1]], completions)
            ((logp * mask).sum() + (logp2 * mask2).sum()).backward()
    finally:
        model.new_cache = new_cache
        model.eval().zero_grad(set_to_none=True)
    assert [len(s.token_ids) for s in samples] == [12] * 6 and made[0].k.dtype == torch.bfloat16
    assert torch.isfinite(logp[mask]).all() and torch.isfinite(logp2[mask2]).all()
    # the same values as the unrestricted (math-capable) kernels, to bf16 rounding
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        ref, _ = completion_logprobs(model, [prompts[0]] * 4, completions)
    torch.testing.assert_close(logp.detach(), ref, atol=0.15, rtol=0.05)


@pytest.mark.parametrize("path", ["shared-prefix", "no-shared-prefix"])
def test_gradient_checkpointing_lowers_the_update_peak(qwen3_dir, path):
    """The update's peak above the weights (LoRA r = 8 on a bf16 base: the adapters' gradients are small, so the
    peak is the saved activations and the logits chunks): with --grad-checkpointing at most 60% of without, on both
    update paths (the shared-prefix one passes a cache)."""
    model, _ = load_model(str(qwen3_dir), dtype=torch.bfloat16, device="cuda")
    apply_lora(model, 8)
    model.train()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, 151936, (1024,), generator=g).tolist()
    completions = torch.randint(10, 151936, (8, 128), generator=g).tolist()
    peaks = {}
    for checkpointing in (False, True):
        model.gradient_checkpointing = checkpointing
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if path == "shared-prefix":
                logp, mask = shared_prefix_logprobs(model, prompt, completions)
            else:
                logp, mask = completion_logprobs(model, [prompt] * 8, completions)
        (logp * mask).sum().backward()
        torch.cuda.synchronize()
        peaks[checkpointing] = torch.cuda.max_memory_allocated() - base
        model.zero_grad(set_to_none=True)
        del logp, mask
    assert peaks[True] < 0.6 * peaks[False], {k: f"{v / 2**20:.0f} MiB" for k, v in peaks.items()}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_steps_on_qwen3_shapes(qwen3_dir, lora):
    model, _ = load_model(str(qwen3_dir), dtype=torch.bfloat16 if lora else torch.float32, device="cuda")
    if lora:
        apply_lora(model, 16)
    ids = torch.randint(10, 151936, (2, 1024), generator=torch.Generator().manual_seed(2))
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, 512:] = True
    result = sft_throughput(model, ids, loss_mask, steps=2, bf16=True, gradient_checkpointing=True)
    assert result["tokens_per_s"] > 0 and math.isfinite(result["loss"])
    assert all(torch.isfinite(p).all() for p in model.parameters() if p.requires_grad)
