"""Run folders: no script silently replaces an earlier run (minskill.runs and the three scripts' --out).

A refused command must write nothing: each test snapshots the folder's files (names and bytes) before the
command and compares after."""
import argparse
import json
import math
from pathlib import Path

import pytest


import evolve_masa
import rewrite
import train_grpo
from minskill.measure import transfer
from minskill.nn.optim import lr_factor
from minskill.runs import (RUN_MARKER, RunFolderError, check_run_folder, given_flags,
                           mark_run_folder, open_run_folder, resume_flags)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def earlier_run(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoint").mkdir(parents=True)
    mark_run_folder(out, "x")                           # what every run writes where it starts
    (out / "checkpoint" / "trainer_state.pt").write_bytes(b"the earlier run's state")
    (out / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (out / "run_config.json").write_text('{"earlier": true}\n')
    (out / "state.json").write_text('{"version": 1}\n')
    return out


def assert_refused(message: str, out: Path, resumable: bool = True):
    """The refusal names the folder and --overwrite, and offers --resume only to a command that has it."""
    assert str(out) in message and "--overwrite" in message and ("--resume" in message) == resumable


@pytest.mark.parametrize("script, argv", [
    ("train_grpo.py", lambda out: train_grpo.main(["--out", str(out), "--task-url", "http://127.0.0.1:9/v1"])),
    ("rewrite.py train", lambda out: rewrite.main(["train", str(out / "metrics.jsonl"), "--out", str(out)])),
    ("evolve_masa.py", lambda out: evolve_masa.main(["--out", str(out), "--task-url", "http://127.0.0.1:9/v1"])),
    ("evolve_masa.py --merge", lambda out: evolve_masa.main(["--merge", str(out), "--out", str(out)])),
])
def test_every_script_refuses_a_non_empty_out_and_writes_nothing(earlier_run, script, argv):
    before = snapshot(earlier_run)
    with pytest.raises(SystemExit) as refused:
        argv(earlier_run)
    assert_refused(str(refused.value.code), earlier_run, resumable=script != "evolve_masa.py --merge")
    assert str(refused.value.code).startswith(script)
    assert snapshot(earlier_run) == before


def test_the_refusal_lists_what_the_folder_holds(earlier_run):
    with pytest.raises(RunFolderError, match="checkpoint, metrics.jsonl, run_config.json, state.json"):
        check_run_folder(earlier_run, resume=False, overwrite=False, script="x")


def test_a_command_without_resume_is_not_told_to_pass_it(earlier_run):
    """combine, train_grpo.py --eval, rewrite.py apply --compare and evolve_masa.py --merge have no --resume."""
    with pytest.raises(RunFolderError) as refused:
        check_run_folder(earlier_run, resume=False, overwrite=False, script="x", resumable=False)
    assert_refused(str(refused.value.code), earlier_run, resumable=False)


def test_empty_or_absent_out_and_resume_are_allowed(tmp_path, earlier_run):
    check_run_folder(tmp_path / "absent", resume=False, overwrite=False, script="x")
    (tmp_path / "empty").mkdir()
    check_run_folder(tmp_path / "empty", resume=False, overwrite=False, script="x")
    before = snapshot(earlier_run)
    assert open_run_folder(earlier_run, resume=True, overwrite=False, script="x") == earlier_run
    assert snapshot(earlier_run) == before
    assert open_run_folder(tmp_path / "new" / "run", resume=False, overwrite=False, script="x").is_dir()


def test_overwrite_clears_the_folder_but_what_it_keeps(earlier_run):
    (earlier_run / "target_cache.jsonl").write_text('{"cached": 1}\n')
    open_run_folder(earlier_run, resume=False, overwrite=True, script="x", keep=("target_cache.jsonl",))
    assert sorted(p.name for p in earlier_run.iterdir()) == [RUN_MARKER, "target_cache.jsonl"]


def test_a_new_run_marks_its_folder_and_a_folder_holding_only_the_mark_is_empty(tmp_path):
    out = open_run_folder(tmp_path / "new", resume=False, overwrite=False, script="x")
    assert [p.name for p in out.iterdir()] == [RUN_MARKER]
    check_run_folder(out, resume=False, overwrite=False, script="x")      # killed right after: start again
    (out / "metrics.jsonl").write_text("{}\n")
    open_run_folder(out, resume=False, overwrite=True, script="x")       # marked: --overwrite replaces it
    assert [p.name for p in out.iterdir()] == [RUN_MARKER]


def _not_runs(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """Folders --overwrite must not clear, each holding a file and the run marker (but the last): the parent
    of the current folder (itself a run folder), a git work tree, a symbolic link to a run folder, a folder
    that no run started in."""
    for name in ("parent", "parent/cwd", "repo", "real", "plain"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "precious.txt").write_text(name)
        if name != "plain":
            mark_run_folder(tmp_path / name, "x")
    (tmp_path / "repo" / ".git").mkdir()
    (tmp_path / "repo" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    monkeypatch.chdir(tmp_path / "parent" / "cwd")
    return {"..": "the current folder or one above it", str(tmp_path / "repo"): "holds .git",
            str(tmp_path / "link"): "it is a symbolic link", str(tmp_path / "plain"): "not a minskill run folder"}


def test_overwrite_refuses_what_is_not_a_run_folder_and_deletes_nothing(tmp_path, monkeypatch):
    not_runs = _not_runs(tmp_path, monkeypatch)
    before = snapshot(tmp_path)
    for out, why in not_runs.items():
        with pytest.raises(RunFolderError, match=f"refuses to clear .*{why}"):
            open_run_folder(out, resume=False, overwrite=True, script="x")
    assert snapshot(tmp_path) == before and (tmp_path / "link").is_symlink()


def _transfer(out):
    try:
        return transfer.main(["--suite", "qa", "--n-heldout", "1", "--libraries", "none", "--targets",
                              "a=http://127.0.0.1:9/v1", "--out", out, "--overwrite"])
    except SystemExit as e:
        raise SystemExit(str(e.code)) from None


@pytest.mark.parametrize("script, argv", [
    ("train_grpo.py", lambda out: train_grpo.main(["--out", out, "--overwrite", "--task-url", "http://127.0.0.1:9/v1"])),
    ("rewrite.py train", lambda out: rewrite.main(["train", "x.jsonl", "--out", out, "--overwrite"])),
    ("evolve_masa.py", lambda out: evolve_masa.main(["--out", out, "--overwrite", "--task-url",
                                                     "http://127.0.0.1:9/v1"])),
    ("evolve_masa.py --merge", lambda out: evolve_masa.main(["--merge", "x", "--out", out, "--overwrite"])),
    ("minskill.measure.transfer", _transfer),
])
def test_every_script_refuses_to_overwrite_what_is_not_a_run(tmp_path, monkeypatch, capsys, script, argv):
    not_runs = _not_runs(tmp_path, monkeypatch)
    before = snapshot(tmp_path)
    for out, why in not_runs.items():
        with pytest.raises(SystemExit) as refused:
            argv(out)
        message = str(refused.value.code) + capsys.readouterr().err
        assert "refuses to clear" in message and why in message, message
    assert snapshot(tmp_path) == before


def test_resume_and_overwrite_together_and_a_file_as_out_are_refused(tmp_path, earlier_run):
    with pytest.raises(RunFolderError, match="contradict"):
        check_run_folder(earlier_run, resume=True, overwrite=True, script="x")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="is a file"):
        check_run_folder(tmp_path / "file", resume=False, overwrite=True, script="x")


def test_overwrite_refuses_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "precious.txt").write_text("keep me")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunFolderError, match="refuses to clear"):
        open_run_folder(".", resume=False, overwrite=True, script="x")
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_a_refused_rewrite_train_writes_no_run_config(tmp_path):
    """rewrite.py train on valid data into a folder holding checkpoints of an earlier run: refused before
    anything is written, so run_config.json stays the earlier one (it used to be overwritten first)."""
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"model_card": {"name": "m"}, "skills_in": {}, "task_description": "t",
                                "skills_out": {}}) + "\n")
    out = tmp_path / "rw"
    (out / "checkpoint-1").mkdir(parents=True)
    (out / "run_config.json").write_text(json.dumps({"earlier": True}))
    with pytest.raises(SystemExit):
        rewrite.main(["train", str(data), "--out", str(out), "--base-model", str(tmp_path / "no-model")])
    assert json.loads((out / "run_config.json").read_text()) == {"earlier": True}


def test_lr_schedule_warms_up_then_decays_by_cosine():
    """One schedule for both trainers (SFT's convention): ceil(0.1·20) = 2 warmup steps, then cosine."""
    factors = [lr_factor(s, 20, 0.1) for s in range(20)]
    assert factors[:3] == [0.5, 1.0, 1.0]                              # linear warmup, then the peak
    assert all(a > b for a, b in zip(factors[2:], factors[3:]))        # then strictly decreasing
    assert factors[3] == pytest.approx(0.5 * (1 + math.cos(math.pi / 18)))
    assert factors[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 17 / 18)))
    assert [lr_factor(s, 10, 0.1, min_ratio=0.2) for s in (1, 10)] == [1.0, pytest.approx(0.2)]


def test_a_short_run_warms_up_and_trains_every_step():
    """3 steps: the first is at the peak, the last is not 0 (the old GRPO schedule gave [1, .75, .25])."""
    assert [lr_factor(s, 3, 0.1) for s in range(3)] == [1.0, 1.0, 0.5]


class Saves:
    """Stands in for a model and a tokenizer: save_pretrained writes one file with a tag."""

    def __init__(self, tag: str):
        self.tag = tag

    def save_pretrained(self, folder):
        (Path(folder) / "weights.txt").write_text(self.tag)

    def parameters(self):   # what runs.checkpoint_bytes counts: none
        return []


@pytest.fixture
def saves(monkeypatch):
    """save_checkpoint writes the model with minskill.nn.weights.save_pretrained(model, folder): a Saves stands in."""
    from minskill import runs
    monkeypatch.setattr(runs, "save_pretrained", lambda model, folder: model.save_pretrained(folder))


def test_checkpoint_holds_the_state_and_the_rng_and_leaves_no_staging(tmp_path, saves):
    import random
    import torch
    from minskill.runs import load_trainer_state, save_checkpoint
    random.seed(1)
    torch.manual_seed(1)
    save_checkpoint(tmp_path / "checkpoint", Saves("a"), Saves("a"), {"step": 3})
    expected = random.random(), float(torch.rand(()))
    state = load_trainer_state(tmp_path / "checkpoint")            # restores the RNG states it holds
    assert state["step"] == 3 and (random.random(), float(torch.rand(()))) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_a_damaged_trainer_state_is_an_error_naming_the_file(tmp_path, saves):
    """A truncated trainer_state.pt was torch's traceback."""
    import torch
    from minskill.runs import TRAINER_STATE, load_trainer_state, save_checkpoint
    save_checkpoint(tmp_path / "checkpoint", Saves("a"), Saves("a"), {"step": 3})
    path = tmp_path / "checkpoint" / TRAINER_STATE
    assert load_trainer_state(tmp_path / "checkpoint", required=("step", "rng"))["step"] == 3
    with pytest.raises(ValueError, match=f"{path}: not a trainer state \\(no 'optimizer'\\)"):
        load_trainer_state(tmp_path / "checkpoint", required=("step", "optimizer"))
    whole = path.read_bytes()
    for data, why in ((whole[:len(whole) // 2], ""), (b"", "the file ends early")):
        path.write_bytes(data)
        with pytest.raises(ValueError, match=f"{path}: damaged, cannot be read .*{why}"):
            load_trainer_state(tmp_path / "checkpoint")
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match=f"{path}: not a trainer state \\(a list, not a dict\\)"):
        load_trainer_state(tmp_path / "checkpoint")


def test_a_save_killed_between_its_renames_leaves_the_old_checkpoint(tmp_path, monkeypatch, saves):
    import os
    from minskill import runs
    folder = tmp_path / "checkpoint"
    runs.save_checkpoint(folder, Saves("old"), Saves("old"), {"step": 1})
    real_replace, calls = os.replace, []

    def killed_at_second_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the kill: the old checkpoint is renamed away, the new one not yet in
        real_replace(src, dst)

    monkeypatch.setattr(runs.os, "replace", killed_at_second_rename)
    with pytest.raises(KeyboardInterrupt):
        runs.save_checkpoint(folder, Saves("new"), Saves("new"), {"step": 2})
    monkeypatch.setattr(runs.os, "replace", real_replace)
    assert not folder.exists() and (tmp_path / ".old-checkpoint").is_dir()
    assert runs.load_trainer_state(folder)["step"] == 1 and (folder / "weights.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_stale_staging_folders_are_cleaned_at_the_next_save(tmp_path, saves):
    from minskill.runs import save_checkpoint
    (tmp_path / ".tmp-checkpoint-killed").mkdir()            # a save killed while writing
    (tmp_path / ".tmp-checkpoint-killed" / "weights.txt").write_text("half")
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / ".old-checkpoint").mkdir()                   # killed after the swap, before the clean-up
    save_checkpoint(tmp_path / "checkpoint", Saves("new"), Saves("new"), {"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    assert (tmp_path / "checkpoint" / "weights.txt").read_text() == "new"


def test_clean_staging_undoes_what_killed_writes_left(tmp_path):
    from minskill.runs import clean_staging
    from minskill.skills import Skill
    from minskill.skillsets import SkillSet
    out = tmp_path / "run"
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "checkpoint-5" / "model.safetensors").write_text("kept")
    (out / ".tmp-checkpoint-10-k3j_x9a2").mkdir()           # sft.save_checkpoint killed mid-write
    (out / ".tmp-checkpoint-10-k3j_x9a2" / "model.safetensors").write_text("partial")
    (out / ".tmp-metrics.jsonl-ab12cd34").write_text("partial")   # an atomic file write killed
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "checkpoint").mkdir()                             # train_grpo's checkpoint killed between renames:
    (out / "checkpoint").rename(out / ".old-checkpoint")     # only the old one, aside
    skills = SkillSet(general=[Skill(name="a", description="d")])
    skills.save(out / "library")
    # a skill-set save killed between its renames: library/ is missing, the old set is in .library.old-*
    retired = out / ".library.old-zz11yy22"
    retired.mkdir()
    (out / "library").rename(retired / "set")
    (out / ".library.tmp-qq33rr44").mkdir()
    removed = clean_staging(out)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "checkpoint-5", "library", "metrics.jsonl"]
    assert sorted(p.name for p in removed) == [".library.old-zz11yy22", ".library.tmp-qq33rr44", ".old-checkpoint",
                                               ".tmp-checkpoint-10-k3j_x9a2", ".tmp-metrics.jsonl-ab12cd34"]
    assert SkillSet.load(out / "library").to_json() == skills.to_json()
    assert clean_staging(out) == [] and clean_staging(tmp_path / "absent") == []



def test_given_flags_and_resume_flags_apply_the_one_resume_policy():
    """given_flags sees a flag given at its default value and a sub-command's; resume_flags fills the flags not
    given from the saved run, takes a given may-change one, refuses every other differing one by name."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--out")
    sub = parser.add_subparsers(dest="command").add_parser("train")
    sub.add_argument("data", nargs="*")
    sub.set_defaults(func=print)
    argv = ["--lr", "0.1", "--out", "o", "train"]
    assert given_flags(parser, argv) == {"lr", "out", "command"}
    assert given_flags(parser, ["train", "d.jsonl"]) == {"command", "data"}
    saved = {"lr": 0.5, "steps": 7, "bf16": True, "out": "elsewhere", "data": ["d.jsonl"]}
    args = parser.parse_args(["--steps", "9", "--out", "o", "train"])
    assert resume_flags(args, saved, given_flags(parser, ["--steps", "9", "--out", "o", "train"]), {"steps"},
                        "s.py") == ["--steps 7 -> 9"]
    assert (args.lr, args.steps, args.bf16, args.out, args.data) == (0.5, 9, True, "o", ["d.jsonl"])
    args = parser.parse_args(argv)
    with pytest.raises(RunFolderError, match=r"^s.py: --resume .* --lr 0.5 -> 0.1, --bf16 True -> False;") as caught:
        resume_flags(args, saved, {"lr", "bf16", "steps"}, {"steps"}, "s.py")
    assert "--steps" not in str(caught.value)


# ------------------------------------------------------------------ checkpoint size, disk space, keeping N

@pytest.fixture(scope="module")
def tiny_editor(tmp_path_factory):
    import torch
    from minskill.nn.weights import load_model
    from tiny import make_tiny_model_dir
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("ckpt"), family="qwen3")
    return load_model(str(folder), dtype=torch.float32)


def _trained_state(model):
    """One AdamW step's state, as train_grpo.train saves it."""
    import torch
    from minskill.nn.lora import trainable_parameters
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"step": 1, "optimizer": optimizer.state_dict(), "args": {"lr": 1e-3}}


def _bytes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_checkpoint_holds_the_weights_in_the_training_dtype_and_the_optimizer_state_once(tmp_path, tiny_editor,
                                                                                          dtype):
    import copy
    import torch
    from minskill.runs import TRAINER_STATE, checkpoint_bytes, save_checkpoint
    model, tokenizer = copy.deepcopy(tiny_editor[0]).to(getattr(torch, dtype)), tiny_editor[1]
    state = _trained_state(model)
    params = sum(p.numel() for p in model.parameters())
    folder = save_checkpoint(tmp_path / "checkpoint", model, tokenizer, state)
    sizes = _bytes(folder)
    weights = params * model.dtype.itemsize
    assert weights <= sizes["model.safetensors"] < weights + 64 * 1024      # one copy, in the training dtype
    moments = 2 * params * model.dtype.itemsize                              # AdamW's two moments, once
    assert moments <= sizes[TRAINER_STATE] < 1.1 * moments + 64 * 1024
    assert sum(sizes.values()) <= checkpoint_bytes(model, state)            # the estimate covers the files
    assert checkpoint_bytes(model, state) < sum(sizes.values()) * 1.05 + 65 * 2 ** 20


def test_a_lora_checkpoint_is_the_merged_float32_model_the_adapter_and_its_state(tmp_path, tiny_editor):
    import copy
    import torch
    from minskill.nn.lora import apply_lora, trainable_parameters
    from minskill.runs import TRAINER_STATE, checkpoint_bytes, save_checkpoint
    model = apply_lora(copy.deepcopy(tiny_editor[0]), 4, 8, base_dtype=torch.bfloat16)
    state = _trained_state(model)
    adapters = sum(p.numel() for p in trainable_parameters(model))
    base = sum(p.numel() for p in model.parameters()) - adapters
    folder = save_checkpoint(tmp_path / "checkpoint", model, tiny_editor[1], state)
    sizes = _bytes(folder)
    assert 4 * base <= sizes["model.safetensors"] < 4 * base + 64 * 1024    # merged, float32 (see lora.py)
    assert 4 * adapters <= sizes["adapter/adapter_model.safetensors"] < 4 * adapters + 64 * 1024
    assert 8 * adapters <= sizes[TRAINER_STATE] < 8 * adapters + 64 * 1024  # the adapters' moments only
    assert sum(sizes.values()) <= checkpoint_bytes(model, state)


def test_a_save_the_disk_cannot_hold_is_refused_before_writing_and_keeps_the_previous_one(tmp_path, tiny_editor,
                                                                                         monkeypatch):
    from collections import namedtuple
    from minskill import runs
    model, tokenizer = tiny_editor
    folder = runs.save_checkpoint(tmp_path / "checkpoint", model, tokenizer, {"step": 1})
    before = snapshot(tmp_path)
    need = runs.checkpoint_bytes(model, {"step": 2})
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(runs.shutil, "disk_usage", lambda path: usage(2 ** 40, 2 ** 40 - 5 * 2 ** 20, 5 * 2 ** 20))
    with pytest.raises(runs.DiskSpaceError) as refused:
        runs.save_checkpoint(folder, model, tokenizer, {"step": 2})
    message = str(refused.value)
    assert str(folder) in message and f"{need / 2 ** 20:.1f} MiB" in message and "5.0 MiB free" in message
    assert "previous checkpoint is kept" in message
    assert snapshot(tmp_path) == before and runs.load_trainer_state(folder)["step"] == 1


def test_keep_checkpoints_keeps_the_newest_n_with_checkpoint_the_newest(tmp_path, saves):
    from minskill.runs import load_trainer_state, older_checkpoints, save_checkpoint
    folder = tmp_path / "checkpoint"
    for step in range(1, 6):
        save_checkpoint(folder, Saves(f"s{step}"), Saves(f"s{step}"), {"step": step}, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "checkpoint-step-3", "checkpoint-step-4"]
    assert load_trainer_state(folder, restore_rng=False)["step"] == 5 and (folder / "weights.txt").read_text() == "s5"
    assert [p.name for p in older_checkpoints(folder)] == ["checkpoint-step-4", "checkpoint-step-3"]
    assert (tmp_path / "checkpoint-step-4" / "weights.txt").read_text() == "s4"
    save_checkpoint(folder, Saves("s6"), Saves("s6"), {"step": 6}, keep=1)     # fewer kept on resume: pruned
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_train_grpo_takes_keep_checkpoints():
    assert train_grpo.parse_args(["--keep-checkpoints", "3"]).keep_checkpoints == 3
    assert train_grpo.parse_args([]).keep_checkpoints == 1
    with pytest.raises(SystemExit):
        train_grpo.parse_args(["--keep-checkpoints", "0"])


def test_train_grpo_keeps_the_newest_checkpoints_and_resumes_from_checkpoint(tmp_path, capsys):
    from helpers import common_flags, keyword_task_model, write_keyword_suite
    from minskill.runs import load_trainer_state
    from minskill.serve.backends import ScriptedBackend
    from minskill.serve.server import start_server
    from tiny import make_tiny_model_dir
    editor = make_tiny_model_dir(tmp_path / "editor", family="llama", chat_format="chatml",
                                 max_position_embeddings=1024)
    suite, out = write_keyword_suite(tmp_path / "keywords.jsonl"), tmp_path / "run"
    with start_server(ScriptedBackend(keyword_task_model, name="keywords")) as server:
        flags = common_flags(editor, suite, server.url, out) + ["--save-every", "1", "--keep-checkpoints", "2"]
        assert train_grpo.main(flags + ["--steps", "3"]) == 0
        assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint", "checkpoint-step-2"]
        assert load_trainer_state(out / "checkpoint", restore_rng=False)["step"] == 3
        assert load_trainer_state(out / "checkpoint-step-2", restore_rng=False)["step"] == 2
        assert train_grpo.main(["--out", str(out), "--resume", "--steps", "4"]) == 0   # reads checkpoint/: step 3
    assert "resuming" in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint", "checkpoint-step-3"]
    assert load_trainer_state(out / "checkpoint", restore_rng=False)["step"] == 4
