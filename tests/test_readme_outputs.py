"""The README's pasted outputs are held to the code: the main job's command is run as the README
gives it and its printed lines are compared with the README's block, field by field ("…" stands
for fields the README leaves out). A change that moves them fails here until the README is re-run
and re-pasted."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _block_after(marker: str, which: int = 0, text: str = README) -> list[str]:
    """The lines of the ``` block after `marker` in `text` (the README; which: 0 the first, 1 the
    next)."""
    start = text.index(marker)
    blocks = re.finditer(r"^```[a-z]*\n(.*?)^```$", text[start:], re.S | re.M)
    return [b.group(1) for b in blocks][which].splitlines()


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


@pytest.mark.parametrize("folder, names, marker", [
    ("skill-r1-cold-start", ("frozen", "grpo", "skill-r1-seed0", "skill-r1-seed1"),
     "**All six rows.**"),
    ("eval48", ("frozen", "grpo-seed0", "grpo-seed1", "sr1-seed0", "sr1-seed1"),
     "**All seven rows.**")])
def test_the_skill_r1_evaluation_tables_are_what_combine_prints(folder, names, marker, tmp_path,
                                                                 capsys):
    """The Skill-R1 evaluation tables of docs/results-skill-r1.md (the README links them), as
    `combine` prints them from the evaluation runs that docs/runs keeps (the second attempt's four,
    the third evaluation's five; the README's commands combine the same runs under runs/)."""
    from minskill.measure import combine
    files = [ROOT / "docs" / "runs" / folder / f"eval-{name}.json" for name in names]
    assert combine.main([*map(str, files), "--out", str(tmp_path / "combined")]) == 0
    printed = capsys.readouterr().out.splitlines()
    results = (ROOT / "docs" / "results-skill-r1.md").read_text(encoding="utf-8")
    shown = _block_after(marker, which=1, text=results)
    assert shown and all(line in printed for line in shown), \
        [line for line in shown if line not in printed]


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


def _without_seconds(line: str) -> str:
    """A printed line less its wall time ("; 383 s" at the end), which moves with the machine."""
    return re.sub(r"; \d+ s$", "", line)


@pytest.mark.slow
def test_the_masa_quick_start_prints_what_the_readme_shows(tmp_path):
    """MASA stage 1's command as the README gives it (int8 target and teacher: batch-invariant, so
    the same lines whatever the machine's load), its summary lines and the held-out table's last
    row."""
    block = _block_after("**MASA stage 1**")
    assert block[0].startswith("OMP_NUM_THREADS=1 python evolve_masa.py")
    flags = block[0].split("python evolve_masa.py")[1].split()
    flags = flags[:flags.index("--out")] + ["--out", str(tmp_path / "masa")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "evolve_masa.py", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [_without_seconds(line) for line in done.stdout.splitlines()]
    shown = _block_after("**MASA stage 1**", which=1)
    for line in shown:
        assert _without_seconds(line) in printed, \
            f"README.md shows\n  {line}\nwhich the code no longer prints (re-run and re-paste it)"
