"""Run folders: no script silently replaces an earlier run (minskill.runs and the three scripts' --out).

A refused command must write nothing: each test snapshots the folder's files (names and bytes) before the
command and compares after."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the scripts live at the repo root

import evolve_masa  # noqa: E402
import rewrite  # noqa: E402
import train_grpo  # noqa: E402
from minskill.runs import RunFolderError, check_run_folder, open_run_folder  # noqa: E402


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def earlier_run(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "trainer_state.pt").write_bytes(b"the earlier run's state")
    (out / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (out / "run_config.json").write_text('{"earlier": true}\n')
    (out / "state.json").write_text('{"version": 1}\n')
    return out


def assert_refused(message: str, out: Path):
    assert str(out) in message and "--resume" in message and "--overwrite" in message


@pytest.mark.parametrize("script, argv", [
    ("train_grpo.py", lambda out: train_grpo.main(["--out", str(out), "--task-url", "http://127.0.0.1:9/v1"])),
    ("rewrite.py train", lambda out: rewrite.main(["train", str(out / "metrics.jsonl"), "--out", str(out)])),
    ("evolve_masa.py", lambda out: evolve_masa.main(["--out", str(out), "--target-url", "http://127.0.0.1:9/v1"])),
    ("evolve_masa.py --merge", lambda out: evolve_masa.main(["--merge", str(out), "--out", str(out)])),
])
def test_every_script_refuses_a_non_empty_out_and_writes_nothing(earlier_run, script, argv):
    before = snapshot(earlier_run)
    with pytest.raises(SystemExit) as refused:
        argv(earlier_run)
    assert_refused(str(refused.value.code), earlier_run)
    assert str(refused.value.code).startswith(script)
    assert snapshot(earlier_run) == before


def test_the_refusal_lists_what_the_folder_holds(earlier_run):
    with pytest.raises(RunFolderError, match="checkpoint, metrics.jsonl, run_config.json, state.json"):
        check_run_folder(earlier_run, resume=False, overwrite=False, script="x")


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
    assert sorted(p.name for p in earlier_run.iterdir()) == ["target_cache.jsonl"]


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
