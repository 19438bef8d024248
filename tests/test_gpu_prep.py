"""A GPU user's first run (issue 44), checked on the CPU: nothing but reading a GGUF needs the `gguf` package (a
bare GPU image with PyTorch lacks it) and reading one without it names the install; a LoRA base and
`rewrite.py apply` default to bf16 on CUDA and stay float32 on the CPU; `bench memory`'s Qwen3-8B LoRA
prediction under its defaults fits 20 GiB; tests/gpu_check.sh runs end to end without CUDA, with python3 only
and neither gguf nor openai, and says so.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minskill.device
import rewrite
from helpers import TASK, run_rewrite
from minskill.measure import bench
from minskill.nn.lora import add_lora_arguments, lora_settings
from minskill.nn.memory import GIB, UpdateShape, predict_update_memory, published_config
from minskill.nn.weights import convert_gguf

ROOT = Path(__file__).resolve().parents[1]

# each entry point's --help (runpy, as `python SCRIPT` / `python -m MODULE` run it), with `import gguf` failing
WITHOUT_GGUF = """
import runpy, sys
sys.modules["gguf"] = None                      # `import gguf` now raises ImportError
sys.path[:0] = [".", "tests"]
for kind, name in (("path", "train_grpo.py"), ("path", "rewrite.py"), ("path", "evolve_masa.py"),
                   ("module", "minskill.measure.bench"), ("module", "minskill.serve")):
    sys.argv = [name, "--help"]
    try:
        (runpy.run_path if kind == "path" else runpy.run_module)(name, run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), (name, e.code)
import conftest, test_gpu                        # what tests/gpu_check.sh collects
print("imported without gguf")
"""


def test_the_scripts_and_the_gpu_tests_import_without_gguf():
    """weights.py imported gguf at module level: every script and test module failed on a bare GPU image."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_GGUF], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported without gguf" in done.stdout


def test_reading_a_gguf_without_the_package_names_the_file_and_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(FileNotFoundError) as e:
        convert_gguf(tmp_path / "model.gguf", tmp_path / "out")
    assert str(tmp_path / "model.gguf") in str(e.value) and "pip install gguf" in str(e.value)
    assert not (tmp_path / "out").exists()


def lora_args(*argv, device="cpu"):
    parser = argparse.ArgumentParser()
    add_lora_arguments(parser)
    args = parser.parse_args(list(argv))
    args.device = device
    return args


def test_a_lora_base_is_bf16_on_cuda_by_default_and_float32_on_the_cpu():
    for device, expected in (("cuda", "bfloat16"), ("cuda:1", "bfloat16"), ("cpu", "float32")):
        args = lora_args("--lora-rank", "4", device=device)
        lora_settings(args)
        assert args.lora_base_dtype == expected, device
    given = lora_args("--lora-rank", "4", "--lora-base-dtype", "float32", device="cuda")
    lora_settings(given)
    assert given.lora_base_dtype == "float32"           # asked for: kept
    full = lora_args(device="cuda")
    assert lora_settings(full) is None and full.lora_base_dtype == "float32"   # a full fine-tune: float32 weights
    with pytest.raises(ValueError, match="--lora-base-dtype need --lora-rank > 0"):
        lora_settings(lora_args("--lora-base-dtype", "bfloat16"))


class Loaded(Exception):
    """Raised by the stand-in for load_model: the dtype a script asked for, and nothing more run."""


@pytest.fixture
def pretend_cuda(monkeypatch):
    """--device cuda accepted on the CPU, TF32 left alone, and load_model recording the dtype it is asked for."""
    monkeypatch.setattr(minskill.device, "_cuda_available", lambda: True)
    monkeypatch.setattr(rewrite, "set_up_device", lambda device: None)

    def load_model(path, dtype=None, device=None):
        raise ValueError(f"loaded in {dtype} on {device}")
    monkeypatch.setattr(rewrite, "load_model", load_model)


@pytest.mark.parametrize("device, dtype", [("cuda", torch.bfloat16), ("cpu", torch.float32)])
def test_rewrite_apply_runs_the_rewriter_in_bf16_on_cuda_and_float32_on_the_cpu(files, tmp_path, pretend_cuda,
                                                                                 device, dtype):
    code, _, stderr = run_rewrite(["apply", "--rewriter", str(files["base"]), "--model-card", str(files["card"]),
                                   "--skills", str(files["skills"]), "--task", TASK, "--out", str(tmp_path / "out"),
                                   "--device", device])
    assert code == 1 and f"loaded in {dtype} on {device}" in stderr, stderr


@pytest.mark.parametrize("device, dtype", [("cuda", torch.bfloat16), ("cpu", torch.float32)])
def test_rewrite_train_with_lora_loads_its_base_in_bf16_on_cuda(files, tmp_path, pretend_cuda, device, dtype):
    code, _, stderr = run_rewrite(["train", str(files["data"]), "--base-model", str(files["base"]), "--out",
                                   str(tmp_path / "run"), "--lora-rank", "4", "--device", device])
    assert code == 1 and f"loaded in {dtype} on {device}" in stderr, stderr


def test_bench_memory_predicts_a_qwen3_8b_lora_editor_under_20_gib_with_its_defaults(capsys):
    """It predicted 47 GiB: a float32 base, which autocast also copied to bf16 for every matmul."""
    bench.main(["memory", "--config", "qwen3-8b", "--lora-rank", "16", "--grad-checkpointing", "--bf16"])
    printed = {name: float(value) for name, value in re.findall(r"\| ([a-zA-Z ]+) \| ([0-9.]+) \|",
                                                                capsys.readouterr().out)}
    assert printed["peak"] <= 20 and printed["update peak"] <= 20, printed
    bf16_base = predict_update_memory(published_config("qwen3-8b"), UpdateShape(
        candidates=4, micro_batch=4, lora_rank=16, lora_base_bytes=2, bf16=True, grad_checkpointing=True))
    assert printed["peak"] == pytest.approx(bf16_base["peak"] / GIB, abs=0.01)


def python3_only_path(tmp_path) -> str:
    """A PATH with python3 (no python, no nvidia-smi) and the few commands gpu_check.sh runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in ("bash", "cat", "date", "dirname", "grep", "mkdir", "mktemp", "sed", "tail", "tee", "timeout"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return str(bin_dir)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the check runs the GPU tests: run it alone")
def test_gpu_check_runs_on_a_cpu_machine_with_python3_only_and_says_cuda_is_absent(tmp_path):
    blocked = tmp_path / "blocked"                   # `import gguf` and `import openai` fail, as on a bare image
    for name in ("gguf", "openai"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    out = tmp_path / "out"
    env = {**os.environ, "PATH": python3_only_path(tmp_path), "OUT": str(out), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(blocked)}
    env.pop("PYTHON", None)
    done = subprocess.run(["bash", str(ROOT / "tests" / "gpu_check.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    environment = (out / "environment.txt").read_text()
    assert "import gguf: MISSING" in environment and "import openai: MISSING" in environment
    summary = (out / "summary.txt").read_text()
    assert "CUDA absent" in summary and "without CUDA: nothing ran on a GPU" in summary
    assert "test_gpu exit 0" in summary and "skipped" in (out / "test_gpu.txt").read_text()
    assert (out / "test_gpu.xml").is_file() and "not run" in (out / "bench_gpu.txt").read_text()
    assert summary in (out / "gpu_check.txt").read_text()     # every part in one file too
