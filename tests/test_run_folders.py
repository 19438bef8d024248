"""Run folders (minskill.runs, minskill.files) against what goes wrong in practice: a run killed
before its first checkpoint is started again by --resume, nothing a user wrote lost; --overwrite
clears only a folder its own run marked, reached by its own name, holding no work tree; no write
goes through a symbolic link; and a saved flag edited by hand, a JSON file that is not UTF-8 or a
chat holding a lone surrogate is an error naming the file."""
import io
import json
import os
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

import evolve_masa
import train_grpo
from helpers import (Interrupted, argv, common_flags, interrupted_at_save, keyword_task_model, read,
                     read_rows, run_rewrite, write_keyword_suite)
from minskill import sft
from minskill.files import LinkError, append_jsonl, read_json
from minskill.nn.tokenizer import Tokenizer
from minskill.runs import (RUN_MARKER, RunFolderError, check_run_folder, open_run_folder,
                           started_flags)
from minskill.serve.caching import CachingClient
from minskill.serve.client import ChatResult
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skill_r1 import cold_start
from tiny import make_tiny_model_dir

RESTARTED = "nothing to resume from yet (the run stopped before it saved any): starting it again"


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def editor_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("editor"), family="llama",
                               chat_format="chatml", max_position_embeddings=2048)


@pytest.fixture(scope="module")
def task_url():
    with start_server(ScriptedBackend(keyword_task_model, name="keywords")) as server:
        yield server.url


@pytest.fixture(scope="module")
def qa_url():
    def unsure(messages, request):
        return "I am not sure."
    with start_server(ScriptedBackend(unsure, name="qa")) as server:
        yield server.url


def killed(*args, **kwargs):
    raise Interrupted


def ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


# ------------------------------------------------------ 1. killed before the first checkpoint

def test_train_grpo_killed_before_its_first_checkpoint_is_started_again_by_resume(
        editor_dir, task_url, tmp_path, monkeypatch, capsys):
    """It could be neither rerun (not empty) nor resumed (no checkpoint)."""
    suite = write_keyword_suite(tmp_path / "keywords.jsonl")
    out = tmp_path / "run"
    flags = common_flags(editor_dir, suite, task_url, out) + ["--steps", "2", "--lam", "0"]
    with monkeypatch.context() as m:
        m.setattr(train_grpo, "save_checkpoint", killed)      # the first save, at step 2
        with pytest.raises(Interrupted):
            train_grpo.main(flags)
    assert not (out / "checkpoint").exists() and len(read_rows(out)) == 2
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not empty"):
        train_grpo.main(flags)
    capsys.readouterr()
    assert train_grpo.main(["--out", str(out), "--resume"]) == 0   # the flags it started with
    assert RESTARTED in capsys.readouterr().out
    assert [r["step"] for r in read_rows(out)] == [0, 1]
    assert (out / "notes.txt").read_text() == "mine"
    saved = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert saved["step"] == 2 and saved["args"]["lam"] == 0.0
    assert saved["args"]["suite"] == str(suite)


def test_resume_where_the_script_started_no_run_has_nothing_to_resume(tmp_path):
    """A folder no run marked, or one another script's run marked: --resume starts no run there."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    (mine / "metrics.jsonl").write_text("")
    open_run_folder(other, resume=False, overwrite=False, script="evolve_masa.py",
                    settings={"suite": "qa", "task_api_key": "secret"})
    assert started_flags(other, "evolve_masa.py") == {"suite": "qa"}      # no key in the marker
    for out in (mine, other, tmp_path / "absent"):
        assert started_flags(out, "train_grpo.py") is None
        with pytest.raises(SystemExit, match="nothing to resume"):
            train_grpo.main(["--out", str(out), "--resume"])


def test_rewrite_train_killed_before_its_first_checkpoint_is_started_again_by_resume(
        files, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(sft, "save_checkpoint", killed)
        with pytest.raises(Interrupted):
            run_rewrite(["train", str(files["data"]), "--base-model", str(files["base"]),
                         "--out", str(out), "--lr", "1e-2", "--epochs", "2", "--batch-size", "2",
                         "--micro-batch", "2", "--val-fraction", "0", "--save-every", "50",
                         "--device", "cpu"])
    assert (out / "run_config.json").is_file() and not list(out.glob("checkpoint-*"))
    (out / "notes.txt").write_text("mine")
    code, stdout, stderr = run_rewrite(["train", "--out", str(out), "--resume"])
    assert code == 0, stderr
    assert RESTARTED in stdout and "step 2/2" in stdout and (out / "final").is_dir()
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "run_config.json").read_text())["args"]["save_every"] == 50


def test_evolve_masa_killed_before_its_first_checkpoint_is_started_again_by_resume(
        env, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(evolve_masa, "save_checkpoint", ctrl_c)
        assert evolve_masa.main(argv(env, out, "--iterations", "1")) == 130
    assert not (out / "state.json").exists() and (out / "target_cache.jsonl").is_file()
    assert "--resume --out" in capsys.readouterr().err
    (out / "notes.txt").write_text("mine")
    assert evolve_masa.main(["--resume", "--out", str(out)]) == 0
    assert RESTARTED in capsys.readouterr().err
    state = read(out, "state.json")
    assert (state["args"]["iterations"], state["args"]["suite"]) == (1, str(env["suite"]))
    assert read(out, "run.json")["target_cache_hits"] > 0     # the killed session's calls: not paid
    assert (out / "library.json").is_file() and (out / "notes.txt").read_text() == "mine"


def cold_flags(editor_dir, task_url, out, *extra):
    return ["--editor", str(editor_dir), "--suite", "qa", "--n-tasks", "16",
            "--tasks-per-instance", "2", "--max-instances", "2", "--out", str(out),
            "--task-url", task_url, "--max-skill-tokens", "320", "--context-tokens", "1400",
            "--batch-size", "2", "--micro-batch", "2", "--val-fraction", "0", "--device", "cpu",
            *extra]


def run_cold_start(args):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cold_start.main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_cold_start_killed_before_its_chats_were_written_is_started_again_by_resume(
        editor_dir, qa_url, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(cold_start, "write_jsonl_atomic", killed)   # run_config.json written, no chats
        with pytest.raises(Interrupted):
            run_cold_start(cold_flags(editor_dir, qa_url, out, "--max-steps", "0"))
    assert (out / cold_start.RUN_CONFIG).is_file() and not (out / cold_start.DATA_FILE).exists()
    assert run_cold_start(cold_flags(editor_dir, qa_url, out, "--max-steps", "0"))[0] != 0
    code, stdout, stderr = run_cold_start(["--out", out, "--resume"])
    assert code == 0, stderr
    assert RESTARTED in stdout and (out / cold_start.DATA_FILE).is_file()


# ------------------------------------------------------------------ 3. what --overwrite clears

def a_run(folder: Path) -> Path:
    """A run folder as a run leaves it: marked, holding a file."""
    open_run_folder(folder, resume=False, overwrite=False, script="x")
    (folder / "metrics.jsonl").write_text("{}\n")
    return folder


def assert_not_cleared(out, why: str, root: Path):
    before = snapshot(root)
    with pytest.raises(RunFolderError, match=why):
        open_run_folder(out, resume=False, overwrite=True, script="x")
    assert snapshot(root) == before


def test_overwrite_refuses_a_git_work_tree_at_any_depth(tmp_path):
    run = a_run(tmp_path / "run")
    (run / "sub" / "repo" / ".git").mkdir(parents=True)
    (run / "sub" / "repo" / "code.py").write_text("precious")
    assert_not_cleared(run, "it holds sub/repo/.git", tmp_path)


def test_overwrite_refuses_a_marker_that_is_a_symbolic_link(tmp_path):
    real, run = a_run(tmp_path / "real"), tmp_path / "run"
    run.mkdir()
    (run / "precious.txt").write_text("mine")
    (run / RUN_MARKER).symlink_to(real / RUN_MARKER)
    assert_not_cleared(run, "is a symbolic link", tmp_path)


def test_overwrite_refuses_a_path_through_a_link(tmp_path):
    """LINK/sub/.. is the link's target: it passed the refusal, which looked at the last name."""
    real = a_run(tmp_path / "real")
    (real / "sub").mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    for out in (f"{tmp_path}/link/sub/..", f"{tmp_path}/link", f"{tmp_path}/link/sub/../"):
        assert_not_cleared(out, "it is a symbolic link, or is reached through one", tmp_path)
    open_run_folder(f"{tmp_path}/real/sub/..", resume=False, overwrite=True, script="x")  # no link
    assert [p.name for p in real.iterdir()] == [RUN_MARKER]


def test_overwrite_refuses_a_planted_marker(tmp_path, monkeypatch):
    """A marker copied from another run, the text an older marker held, or a marker of another
    user (a shared /tmp): the folder is not cleared."""
    run = a_run(tmp_path / "run")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "precious.txt").write_text("someone's")
    shutil.copy(run / RUN_MARKER, shared / RUN_MARKER)
    assert_not_cleared(shared, "not written by a run started in this folder", tmp_path)
    (shared / RUN_MARKER).write_text("a run folder\n")
    assert_not_cleared(shared, "not written by a run started in this folder", tmp_path)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(run).st_uid + 1)
    assert_not_cleared(run, "belongs to another user", tmp_path)
    monkeypatch.undo()
    open_run_folder(run, resume=False, overwrite=True, script="x")     # its own marker: cleared
    assert [p.name for p in run.iterdir()] == [RUN_MARKER]


# ------------------------------------------------------------------- 6. no write through a link

def test_evolve_masa_resume_refuses_a_symbolic_link_in_its_run_folder(env, tmp_path, monkeypatch):
    """OUT/target_cache.jsonl linked to a file outside --out: the resumed run appended there."""
    out, outside = tmp_path / "run", tmp_path / "outside.jsonl"
    interrupted_at_save(monkeypatch, 1, argv(env, out))
    (out / "target_cache.jsonl").rename(outside)
    (out / "target_cache.jsonl").symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(SystemExit) as refused:
        evolve_masa.main(["--resume", "--out", str(out)])
    assert "holds a symbolic link, target_cache.jsonl" in str(refused.value.code)
    assert outside.read_bytes() == before


def test_resume_and_what_overwrite_keeps_refuse_a_symbolic_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = a_run(tmp_path / "run")
    (run / "trajectories").mkdir()
    (run / "trajectories" / "a.jsonl").symlink_to(outside / "a.jsonl")
    with pytest.raises(RunFolderError,
                       match=r"trajectories/a.jsonl \(to .*, which is outside the run folder\)"):
        check_run_folder(run, resume=True, overwrite=False, script="x")
    shutil.rmtree(run / "trajectories")
    (run / "target_cache.jsonl").symlink_to(outside / "cache.jsonl")
    before = snapshot(run)
    with pytest.raises(RunFolderError, match="target_cache.jsonl"):
        open_run_folder(run, resume=False, overwrite=True, script="x", keep=("target_cache.jsonl",))
    assert snapshot(run) == before and (run / "target_cache.jsonl").is_symlink()
    open_run_folder(run, resume=False, overwrite=True, script="x")    # not kept: the link goes
    assert [p.name for p in run.iterdir()] == [RUN_MARKER] and outside.is_dir()


class Inner:
    model = "m"

    def chat_many(self, requests, return_exceptions=False):
        return [ChatResult(["reply"], ["stop"], 1, 1) for _ in requests]


def test_appends_never_go_through_a_symbolic_link(tmp_path):
    """metrics.jsonl, lineage.jsonl, trajectories (append_jsonl) and the call cache: a link in
    their place is refused naming it, and its target is left as it was."""
    outside = tmp_path / "outside.jsonl"
    outside.write_text("theirs\n")
    (tmp_path / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(LinkError, match="metrics.jsonl is a symbolic link"):
        append_jsonl(tmp_path / "metrics.jsonl", {"step": 0})
    (tmp_path / "cache.jsonl").symlink_to(outside)
    with pytest.raises(LinkError, match="cache.jsonl is a symbolic link"):
        CachingClient(Inner(), tmp_path / "cache.jsonl").chat([{"role": "user", "content": "q"}])
    assert outside.read_text() == "theirs\n"
    append_jsonl(tmp_path / "plain.jsonl", {"step": 0})
    assert (tmp_path / "plain.jsonl").read_text() == '{"step": 0}\n'


# ---------------------------------------------------- 8. errors naming the file, not tracebacks

def test_cold_start_resume_with_a_mistyped_saved_flag_names_the_file_and_flag(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    saved = vars(cold_start.parse_args(["--out", str(out), "--device", "cpu"]))
    saved.update(batch_size="8", share_prompts="yes")          # edited by hand
    (out / cold_start.RUN_CONFIG).write_text(json.dumps({"args": saved}))
    before = snapshot(out)
    code, _, stderr = run_cold_start(["--out", out, "--resume"])
    assert code == 2 and str(out / cold_start.RUN_CONFIG) in stderr, stderr
    assert "--batch-size '8' (expected an integer)" in stderr and "--share-prompts 'yes'" in stderr
    assert snapshot(out) == before


def test_a_json_file_that_is_not_utf8_is_an_error_naming_it(tmp_path, files):
    bad = tmp_path / "run_config.json"
    bad.write_bytes(b'{"args": {"lr": "caf\xe9"}}')
    with pytest.raises(ValueError, match=f"{bad}: not UTF-8"):
        read_json(bad)
    code, _, stderr = run_rewrite(["train", "--out", str(tmp_path), "--resume"])
    assert code == 1 and f"--resume: {bad}: not UTF-8" in stderr
    model = tmp_path / "model"
    shutil.copytree(files["base"], model)
    (model / "tokenizer_config.json").write_bytes(b'{"bos_token": "\xff"}')
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_pretrained(model)


def test_cold_start_data_with_a_lone_surrogate_names_the_line(editor_dir, tmp_path):
    data = tmp_path / "chats.jsonl"
    chat = {"instance": "i", "type": "t", "generation": 1, "target_kind": "base",
            "messages": [{"role": "user", "content": "q"}], "target": "fine"}
    data.write_text(json.dumps(chat) + "\n" + json.dumps({**chat, "target": "bad \ud800"}) + "\n")
    code, _, stderr = run_cold_start(cold_flags(editor_dir, "http://127.0.0.1:9/v1", tmp_path / "o",
                                                "--data", data))
    assert code == 2 and f"{data}:2: target is not Unicode text" in stderr, stderr
    assert not (tmp_path / "o").exists()
