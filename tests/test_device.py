"""--device and --bf16 (minskill/device.py): resolved at parse time in every script that loads a model; `cuda` without a
GPU is a clear error before anything loads, never a fall-back; auto and the bf16 default follow the device; TF32 is
set on CUDA only. The CUDA machine is faked (torch.cuda.is_available monkeypatched): nothing here runs on a GPU."""
import argparse

import pytest
import torch

import evolve_masa
import rewrite
import train_grpo
from minskill import cli, device
from minskill.measure import bench
from minskill.measure import transfer
from minskill.serve import embedded, server
from minskill.skill_r1 import loop

APPLY = ["apply", "--rewriter", "r", "--model-card", "c", "--skills", "s", "--task", "t", "--out", "o"]
PARSERS = {   # each script's parse step, given extra flags
    "train_grpo.py": lambda extra: train_grpo.parse_args(extra),
    "evolve_masa.py": lambda extra: evolve_masa.build_parser().parse_args(extra),
    "rewrite.py train": lambda extra: rewrite.build_parser().parse_args(["train", "d.jsonl", "--out", "o", *extra]),
    "rewrite.py apply": lambda extra: rewrite.build_parser().parse_args([*APPLY, *extra]),
    "transfer": lambda extra: transfer.build_parser().parse_args(extra),
}


def fake_cuda(monkeypatch, available: bool, count: int = 1):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if available else 0)


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_cuda_without_a_gpu_stops_the_script_at_parse_time(script, monkeypatch, capsys):
    fake_cuda(monkeypatch, False)
    monkeypatch.setattr("minskill.nn.weights.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        PARSERS[script](["--device", "cuda"])
    assert exit_.value.code == 2
    assert "argument --device: 'cuda' asked for, but torch sees no CUDA GPU" in capsys.readouterr().err
    assert PARSERS[script](["--device", "cpu"]).device == "cpu"


@pytest.mark.parametrize("argv", [["--device", "cuda"], ["--device", "gpu"]])
def test_the_server_and_bench_gpu_refuse_a_missing_or_unknown_device(argv, monkeypatch, capsys):
    fake_cuda(monkeypatch, False)
    for main in (server.main, lambda a: bench.main(["gpu", *a])):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and "argument --device: 'cuda' asked for" in capsys.readouterr().err \
            if argv[1] == "cuda" else "is not a device: auto | cpu | cuda | cuda:N" in capsys.readouterr().err


def test_auto_and_the_bf16_default_follow_the_device(monkeypatch):
    fake_cuda(monkeypatch, False)
    args = train_grpo.parse_args([])
    assert (args.device, args.bf16) == ("cpu", False)        # the CPU default is as it was: float32
    assert train_grpo.parse_args(["--bf16"]).bf16 is True
    fake_cuda(monkeypatch, True, count=2)
    args = train_grpo.parse_args([])
    assert (args.device, args.bf16) == ("cuda", True)        # on a GPU: bf16 autocast, float32 master weights
    assert train_grpo.parse_args(["--no-bf16"]).bf16 is False
    assert train_grpo.parse_args(["--device", "cuda:1"]).device == "cuda:1"
    assert train_grpo.parse_args(["--device", "cpu"]).bf16 is False
    assert device.precision_label("cuda", True) == "device cuda, bf16 autocast compute, float32 weights + TF32"
    assert device.precision_label("cpu", False) == "device cpu, float32"
    with pytest.raises(argparse.ArgumentTypeError, match="torch sees 2 CUDA device"):
        device.resolve_device("cuda:2")
    args = rewrite.build_parser().parse_args(["train", "d.jsonl", "--out", "o"])
    assert args.device == "cuda" and device.resolve_bf16(args) is True


def test_tf32_is_set_on_cuda_only(monkeypatch):
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        device.set_up_device("cpu")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        device.set_up_device("cuda:0")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def test_no_silent_cpu_fallback_is_left_and_autocast_takes_the_device():
    assert not hasattr(loop, "device")
    with loop.autocast(True, "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with loop.autocast(False, "cpu"):
        assert not torch.is_autocast_enabled("cpu")


def test_the_embedded_server_gets_the_scripts_device(monkeypatch):
    started = []

    class Stop(Exception):
        pass

    def popen(command, **kw):
        started.append(command)
        raise Stop
    monkeypatch.setattr(embedded.subprocess, "Popen", popen)
    with pytest.raises(Stop):
        with embedded.embedded_client(**cli.client_args(argparse.Namespace(device="cuda:1"), "task")):
            pass
    assert started[0][started[0].index("--device") + 1] == "cuda:1"


def test_task_concurrency_covers_one_generation_unless_given(monkeypatch):
    fake_cuda(monkeypatch, False)
    assert train_grpo.parse_args([]).task_concurrency == 4 * 4 * 1          # the CPU default: 16, as before
    assert train_grpo.parse_args(["-K", "8", "--instances-per-step", "2"]).task_concurrency == 8 * 4 * 2
    assert train_grpo.parse_args(["-K", "8", "--task-concurrency", "12"]).task_concurrency == 12
