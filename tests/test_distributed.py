"""Data-parallel training (minskill.distributed) on the CPU: two gloo ranks, started as torchrun starts them (one
process each, RANK / WORLD_SIZE / MASTER_ADDR in the environment; torch.multiprocessing spawns them here), take
the step one process takes on the same instances: the same rewards, loss and all-reduced gradient, one row of
global figures per step in metrics.jsonl, written once; a run one process began resumes on two ranks; and the
steps of `rewrite.py train` on two ranks equal those of one process. The two rank processes are started once,
for all the runs (starting torch is most of their time), by the `ranks` fixture; each test reads what they did."""
import contextlib
import importlib
import io
import json
import os
import socket
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

import train_grpo
from helpers import (ROW_FIELDS, TIMING_FIELDS, common_flags, crash_after_checkpoint, keyword_task_model, read_rows,
                     run_rewrite, write_keyword_suite)
from minskill import distributed
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from tiny import make_tiny_model_dir

RANKS = 2


def record_gradients(patch) -> list:
    """Every gradient clip_grad_norm_ is given, per optimizer step (both trainers clip the summed gradient just
    before the optimizer steps): patch(owner, name, value) puts the recording wrapper in place."""
    steps, real = [], torch.nn.utils.clip_grad_norm_

    def recording(params, *args, **kwargs):
        params = list(params)
        steps.append([p.grad.detach().clone() for p in params])
        return real(params, *args, **kwargs)

    patch(torch.nn.utils, "clip_grad_norm_", recording)
    return steps


class FakeServer:
    """embedded_client's stand-in: without a URL it 'starts a server' (its URL, key and model name made up)."""
    opened: list = []

    @classmethod
    @contextlib.contextmanager
    def open(cls, url=None, model=None, api_key=None, **kwargs):
        cls.opened.append({"url": url, "model": model, "api_key": api_key, **kwargs})
        yield types.SimpleNamespace(base_url=url or "http://127.0.0.1:1/v1", api_key=api_key or "key-of-rank-0",
                                    model=model or "served-model")


def helpers_on_ranks(rank: int) -> dict:
    """minskill.distributed's helpers, on this rank: what each returned."""
    distributed.init()
    model = torch.nn.Linear(2, 2)   # weight: a gradient on rank 0 only; bias: on no rank
    if rank == 0:
        (model.weight.sum() * 3).backward()
    distributed.all_reduce_grads(model)
    with distributed.shared_client(FakeServer.open, url=None, model=None, api_key=None, max_workers=4) as client:
        seen = (client.base_url, client.api_key, client.model)
    found = {"share": distributed.share(list("abcde")), "sums": distributed.sum_over_ranks(rank + 1, 0.5),
             "max": distributed.max_over_ranks(float(rank)), "gather": distributed.gather(rank * 10),
             "weight_grad": model.weight.grad.tolist(), "bias_grad": model.bias.grad, "client": seen,
             "opened": FakeServer.opened}
    distributed.close()
    return found


def _rank(rank: int, jobs: list, folder: str) -> None:
    """One rank, as torchrun starts it, for each job in turn: (name, script or None for the helpers, argv, port).
    Saves what it printed, each job's gradients (or the helpers' results)."""
    folder = Path(folder)
    sys.stdout = open(folder / f"stdout-rank{rank}.txt", "w")   # what this rank prints (rank > 0: nothing)
    torch.set_num_threads(1)
    gradients = record_gradients(setattr)
    for name, script, argv, port in jobs:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_WORLD_SIZE=str(RANKS),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if script is None:
            torch.save(helpers_on_ranks(rank), folder / f"{name}-rank{rank}.pt")
            continue
        code = importlib.import_module(script).main(argv)
        if code:
            raise SystemExit(f"rank {rank}, {name}: exit code {code}")
        torch.save(list(gradients), folder / f"{name}-rank{rank}.pt")
        gradients.clear()
    sys.stdout.close()


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def assert_close(one, two, where=""):
    """Equal up to the order of float additions (the ranks' gradients are summed in another order)."""
    if isinstance(one, dict):
        assert one.keys() == two.keys(), where
        for key in one:
            assert_close(one[key], two[key], f"{where}.{key}")
    elif isinstance(one, list):
        assert len(one) == len(two), where
        for i, (a, b) in enumerate(zip(one, two)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(one, float):
        assert two == pytest.approx(one, rel=1e-5, abs=1e-7), where
    else:
        assert one == two, where


def assert_same_gradients(one_process: list, ranks: list[list]) -> None:
    """Every rank holds the same summed gradient (so each takes the same optimizer step), and it is the
    one-process gradient (the same parameters, step by step)."""
    assert all(torch.equal(a, b) for s0, s1 in zip(*ranks) for a, b in zip(s0, s1))
    assert [len(step) for step in one_process] == [len(step) for step in ranks[0]]
    scale = max(float(g.abs().max()) for step in one_process for g in step)
    difference = max(float((a - b).abs().max()) for s1, s2 in zip(one_process, ranks[0]) for a, b in zip(s1, s2))
    print(f"gradients: max |one process - two ranks| = {difference:.3g}, max |gradient| = {scale:.3g}")
    assert scale > 0 and difference <= 1e-5 * scale


def assert_same_weights(folder_one: Path, folder_two: Path) -> None:
    one, two = (load_file(str(f / "model.safetensors")) for f in (folder_one, folder_two))
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-6)


def sft_argv(files, out: Path) -> list[str]:
    """2 records per optimizer step, one per rank, 2 steps; the validation loss (the same records) split too."""
    return ["train", str(files["data"]), "--base-model", str(files["base"]), "--out", str(out), "--lr", "1e-2",
            "--epochs", "2", "--batch-size", "2", "--micro-batch", "1", "--val-file", str(files["data"]),
            "--eval-every", "1", "--save-every", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, files):
    """The one-process runs, then the same on two ranks: a 2-step Skill-R1 run (a checkpoint after each step), the
    resume on two ranks of a run one process began (killed after its first checkpoint), 2 SFT steps."""
    root = tmp_path_factory.mktemp("distributed")
    editor = make_tiny_model_dir(root / "editor", family="llama", chat_format="chatml", max_position_embeddings=1024)
    suite = write_keyword_suite(root / "keywords.jsonl")
    with start_server(ScriptedBackend(keyword_task_model, name="keywords")) as server, \
            pytest.MonkeyPatch.context() as patch:
        def flags(out):   # 2 instances a step: one per rank
            return common_flags(editor, suite, server.url, out) + ["--steps", "2", "--save-every", "1"]
        with contextlib.redirect_stdout(io.StringIO()):
            crash_after_checkpoint(patch, flags(root / "resumed"), step=1)
            gradients = record_gradients(patch.setattr)
            assert train_grpo.main(flags(root / "one")) == 0
            one_process = {"skill-r1": list(gradients)}
            gradients.clear()
        code, _, stderr = run_rewrite(sft_argv(files, root / "sft-one"))
        assert code == 0, stderr
        one_process["sft"] = list(gradients)
        patch.undo()
        jobs = [(name, script, argv, port) for (name, script, argv), port in zip(
            [("helpers", None, None), ("skill-r1", "train_grpo", flags(root / "two")),
             ("resumed", "train_grpo", ["--out", str(root / "resumed"), "--resume"]),
             ("sft", "rewrite", sft_argv(files, root / "sft-two"))], free_ports(4))]
        mp.spawn(_rank, args=(jobs, str(root)), nprocs=RANKS)
    yield {"root": root, "one": one_process, "flags": flags,
           **{name: [torch.load(root / f"{name}-rank{r}.pt", weights_only=False) for r in range(RANKS)]
              for name, *_ in jobs},
           "printed": [(root / f"stdout-rank{r}.txt").read_text() for r in range(RANKS)]}


def test_the_helpers_on_two_ranks(ranks):
    found = ranks["helpers"]
    assert [f["share"] for f in found] == [(["a", "b"], range(0, 2)), (["c", "d", "e"], range(2, 5))]
    assert all(f["sums"] == (3, 1.0) and type(f["sums"][0]) is int and f["max"] == 1.0 for f in found)
    assert all(f["gather"] == [0, 10] for f in found)
    # rank 1 computed no gradient: it adds zeros; the bias had none anywhere: it stays None, as in one process
    assert all(f["weight_grad"] == [[3.0, 3.0], [3.0, 3.0]] and f["bias_grad"] is None for f in found)
    # the embedded server: rank 0 starts it, rank 1 connects to it with its URL, key and model name
    assert found[0]["opened"] == [{"url": None, "model": None, "api_key": None, "max_workers": 4}]
    assert found[1]["opened"] == [{"url": "http://127.0.0.1:1/v1", "model": "served-model",
                                   "api_key": "key-of-rank-0", "max_workers": 4}]
    assert found[0]["client"] == found[1]["client"]


def test_two_ranks_take_the_one_process_steps(ranks):
    root = ranks["root"]
    one, two = read_rows(root / "one"), read_rows(root / "two")
    # one row per step, of the whole step: both ranks' instances, in the step's order
    assert [r["step"] for r in two] == [0, 1] and all(len(set(r["instances"])) == 2 for r in two)
    for a, b in zip(one, two):
        assert b["trained_sequences"] > 0 and b["task_calls"] > 0
        for key in sorted(set(ROW_FIELDS) - set(TIMING_FIELDS)):   # rewards, loss, grad_norm, counts, ...
            assert_close(a[key], b[key], f"step {a['step']}: {key}")
    lineage = [[json.loads(line) for line in (root / f / "lineage.jsonl").read_text().splitlines()]
               for f in ("one", "two")]
    assert_close(lineage[0], lineage[1], "lineage")
    assert_same_gradients(ranks["one"]["skill-r1"], ranks["skill-r1"])
    assert_same_weights(root / "one" / "checkpoint", root / "two" / "checkpoint")
    # rank 0 alone prints
    assert ranks["printed"][0].count("step 1/2 | reward") == 1 and ranks["printed"][1] == ""
    assert "data-parallel over 2 ranks" in ranks["printed"][0]


def test_a_run_one_process_began_resumes_on_two_ranks(ranks):
    root = ranks["root"]
    one, resumed = read_rows(root / "one"), read_rows(root / "resumed")
    assert [r["step"] for r in resumed] == [0, 1]
    for key in sorted(set(ROW_FIELDS) - set(TIMING_FIELDS)):
        assert_close(one[1][key], resumed[1][key], f"step 1: {key}")
    # the resumed step's gradient is the second one of the uninterrupted run
    assert_same_gradients(ranks["one"]["skill-r1"][1:], ranks["resumed"])
    assert_same_weights(root / "one" / "checkpoint", root / "resumed" / "checkpoint")


def test_two_ranks_take_the_one_process_sft_steps(ranks):
    one, two = ([json.loads(line) for line in (ranks["root"] / f / "metrics.jsonl").read_text().splitlines()]
                for f in ("sft-one", "sft-two"))
    assert [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two):
        for key in ("loss", "val_loss", "grad_norm", "target_tokens", "lr", "epoch"):
            assert_close(a[key], b[key], f"step {a['step']}: {key}")
    assert_same_gradients(ranks["one"]["sft"], ranks["sft"])
    assert_same_weights(ranks["root"] / "sft-one" / "final", ranks["root"] / "sft-two" / "final")


def test_more_ranks_than_instances_is_refused(ranks, tmp_path, monkeypatch):
    for name, value in (("world", lambda: 3), ("init", lambda: None), ("barrier", lambda: None)):
        monkeypatch.setattr(train_grpo.distributed, name, value)
    with pytest.raises(SystemExit, match=r"--instances-per-step 2 < 3 ranks"):
        train_grpo.main(ranks["flags"](tmp_path / "x"))
    assert not (tmp_path / "x").exists()
