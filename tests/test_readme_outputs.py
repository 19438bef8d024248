"""The README's pasted outputs are held to the code: the main job's command is run as the README
gives it and its printed lines are compared with the README's block, field by field ("…" stands for
fields the README leaves out). A change that moves them fails here until the README is re-run and
re-pasted."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _block_after(marker: str) -> list[str]:
    """The lines of the first ``` block after `marker` in the README."""
    start = README.index(marker)
    found = re.search(r"```[a-z]*\n(.*?)```", README[start:], re.S)
    return found.group(1).splitlines()


def _main_command() -> str:
    """The README's first command: install && ... && OMP_NUM_THREADS=1 python train_grpo.py"""
    line = _block_after("## Two commands")[0]
    return line.split("&&")[-1].strip()


def _matches(shown: str, printed: str) -> bool:
    """Every " | "-separated field the README shows is a field of the printed line, in order
    ("…": skipped)."""
    fields = [f for f in printed.split(" | ")]
    at = 0
    for part in shown.split(" | "):
        if part.strip() == "…":
            continue
        while at < len(fields) and fields[at].strip() != part.strip():
            at += 1
        if at == len(fields):
            return False
        at += 1
    return True


def test_the_readme_gives_the_default_command_and_its_output():
    assert _main_command() == "OMP_NUM_THREADS=1 python train_grpo.py"
    shown = _block_after("It prints a line per step")
    assert sum(l.startswith("step ") for l in shown) == 3


@pytest.mark.slow
def test_the_default_run_prints_what_the_readme_shows(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "train_grpo.py", "--out", str(tmp_path / "run")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    shown = _block_after("It prints a line per step")
    for prefix in ("step ", "best edited skill:"):
        want = [l for l in shown if l.startswith(prefix)]
        got = [l for l in printed if l.startswith(prefix)]
        assert len(want) == len(got), (want, got)
        for w, g in zip(want, got):
            assert _matches(w, g), \
                f"README.md shows\n  {w}\nthe code prints\n  {g}\n(re-run and re-paste it)"
