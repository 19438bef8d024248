"""On one CUDA GPU (skipped without one): tiny-model Skill-R1 steps (bf16 autocast, β > 0, full and LoRA with a
bf16 base), SFT steps with gradient checkpointing (full and LoRA), greedy generation equal on CUDA and on the
CPU for a float32 model, the server on CUDA (in process and as the embedded subprocess) answering the official
`openai` client, `rewrite.py apply` on CUDA, and `bench gpu` on a tiny config.

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
from minskill import bench
from minskill.nn.lora import ADAPTER_DIR
from minskill.nn.sampling import generate
from minskill.nn.weights import load_model
from minskill.serve.server import ModelBackend, ScriptedBackend, embedded_client, start_server
from minskill.skillsets import SkillSet
from tiny import make_tiny_model_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MESSAGES = [{"role": "user", "content": "What is six times seven?"}]
TASK = "Sums of small numbers."
TARGET = {"common_mistakes": ["Carry the one."]}


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


def test_greedy_generation_is_the_same_on_cuda_and_cpu(tiny_dir):
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


def test_the_server_on_cuda_answers_the_openai_client(tiny_dir):
    openai = pytest.importorskip("openai")
    model, tokenizer = load_model(str(tiny_dir), dtype=torch.float32, device="cuda")
    with start_server(ModelBackend(model.eval(), tokenizer, name="tiny")) as server:
        reply = openai.OpenAI(base_url=server.url, api_key="none").chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    in_process = reply.choices[0].message.content
    assert isinstance(in_process, str) and reply.choices[0].finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= 8 and reply.usage.prompt_tokens > 0
    # the embedded server (a subprocess, as the scripts start it) on CUDA gives the same greedy reply
    with embedded_client(model_spec=str(tiny_dir), api_key="gpu-test", server_args=("--device", "cuda")) as client:
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
