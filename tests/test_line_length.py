"""Every line of minskill/ and of the three scripts is at most 100 characters, docstrings and
comments included: a file reads in one column on any screen (issue 41)."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 100
SCRIPTS = ("train_grpo.py", "evolve_masa.py", "rewrite.py")


def files():
    return sorted([*(ROOT / "minskill").rglob("*.py"), *(ROOT / s for s in SCRIPTS)])


def long_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.name}:{n}: {len(line)} characters"
            for n, line in enumerate(lines, 1) if len(line) > LIMIT]


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_line_over_100_characters(path):
    assert long_lines(path) == []


def test_the_rule_counts_characters_not_bytes(tmp_path):
    ok, over = tmp_path / "ok.py", tmp_path / "over.py"
    ok.write_text("# " + "λ" * (LIMIT - 2) + "\n", encoding="utf-8")   # 100 characters, 198 bytes
    over.write_text("x = 1\n" + "#" * (LIMIT + 1) + "\n", encoding="utf-8")
    assert long_lines(ok) == [] and len(long_lines(over)) == 1
