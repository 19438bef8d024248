"""JSON nested deeper than Python's parser goes (it raises RecursionError at about 1,000 levels) in any input
file is a clear error naming the file (and line), never a RecursionError traceback: skill libraries
(--base-skills, --skills, --libraries), a suite, an SFT line (skipped, as other malformed lines), state.json
(evolve_masa.py --resume), target_cache.jsonl, the report's run files and transfer.json (--resume used to say
"no transfer.json was written: nothing to resume"). The model card is tested in test_model_card.py."""
import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest


import evolve_masa
import rewrite
from minskill.masa import rewriter_sft as sft
from minskill.measure import transfer
from minskill.report import __main__ as report
from minskill.serve.caching import CachingClient
from minskill.skills import SkillFormatError
from minskill.skillsets import SkillSet
from minskill.tasks import load_suite

DEEP = "[" * 100_000
TOO_DEEP = "nested too deeply"
NOWHERE = "http://127.0.0.1:9/v1"


def run(main, argv) -> tuple[int, str]:
    """main(argv) -> (exit status, stdout + stderr); a SystemExit's message counts as printed."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (print(e.code, file=sys.stderr) or 1)
    return code, out.getvalue()


def suite(tmp_path: Path, deep_line: bool = False) -> Path:
    path = tmp_path / "suite.jsonl"
    rows = [json.dumps({"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1), "type": "sum",
                        "split": "train" if i < 6 else "heldout"}) for i in range(8)]
    path.write_text("\n".join(rows[:1] + ([DEEP] if deep_line else []) + rows[1:]) + "\n")
    return path


def deep_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DEEP)
    return path


def test_a_skill_library_json(tmp_path):
    library = deep_file(tmp_path, "deep.json")
    with pytest.raises(SkillFormatError, match=f"{library}: not readable JSON: {TOO_DEEP}"):
        SkillSet.load(library)
    card = tmp_path / "card.json"
    card.write_text(json.dumps({"name": "m"}))
    for main, argv, status in (
            (evolve_masa.main, ["--suite", suite(tmp_path), "--base-skills", library, "--task-url", NOWHERE,
                                "--out", tmp_path / "masa"], 2),
            (rewrite.main, ["apply", "--rewriter", tmp_path, "--model-card", card, "--skills", library, "--task", "t",
                            "--out", tmp_path / "adapted"], 1),
            (transfer.main, ["--suite", suite(tmp_path), "--libraries", f"deep={library}", "--targets",
                             f"a={NOWHERE}", "--out", tmp_path / "matrix"], 2)):
        code, printed = run(main, argv)
        assert code == status and str(library) in printed and TOO_DEEP in printed, printed
        assert "Traceback" not in printed
    assert not any((tmp_path / name).exists() for name in ("masa", "adapted", "matrix"))


def test_a_suite_line(tmp_path):
    path = suite(tmp_path, deep_line=True)
    with pytest.raises(ValueError, match=f"{path}:2: not readable JSON: {TOO_DEEP}"):
        load_suite(str(path))
    code, printed = run(evolve_masa.main, ["--suite", path, "--task-url", NOWHERE, "--out", tmp_path / "masa"])
    assert code == 2 and f"{path}:2: " in printed and TOO_DEEP in printed, printed


def test_an_sft_line_is_skipped_like_any_malformed_line(tmp_path):
    path = tmp_path / "sft.jsonl"
    record = {"model_card": {"name": "m"}, "skills_in": {}, "task_description": "t", "skills_out": {}}
    path.write_text(json.dumps(record) + "\n" + DEEP + "\n" + json.dumps(record) + "\n")
    records, problems = sft.read_records([path], warn=lambda line: None)
    assert records == [record, record] and len(problems) == 1
    assert problems[0].startswith(f"{path}:2: skipped: not readable JSON: {TOO_DEEP}")


def test_state_json_on_resume(tmp_path):
    deep_file(tmp_path / "run", "state.json")
    code, printed = run(evolve_masa.main, ["--resume", "--out", tmp_path / "run"])
    assert code == 2 and f"{tmp_path / 'run' / 'state.json'}: not readable JSON: {TOO_DEEP}" in printed, printed


def test_target_cache_jsonl(tmp_path):
    path = tmp_path / "target_cache.jsonl"
    path.write_text(DEEP + "\n" + json.dumps({"key": "k"}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:1: not readable JSON: {TOO_DEEP}"):
        CachingClient(None, path)


@pytest.mark.parametrize("name, line", [("metrics.jsonl", ":1"), ("state.json", ""), ("transfer.json", ""),
                                        ("compare.json", ""), ("eval.json", "")])
def test_the_report_files(tmp_path, name, line):
    folder = tmp_path / "run"
    path = deep_file(folder, name)
    if line:
        path.write_text(DEEP + "\n" + json.dumps({"step": 1, "reward_per_generation": [0.5]}) + "\n")
    code, printed = run(report.main, [folder])
    assert code == 2 and f"{path}{line}: not readable JSON: {TOO_DEEP}" in printed, printed
    assert not (folder / "report.html").exists()


def test_transfer_json_on_resume(tmp_path):
    path = deep_file(tmp_path / "matrix", "transfer.json")
    code, printed = run(transfer.main, ["--resume", "--out", path.parent])
    assert code == 2 and f"{path}: not readable JSON: {TOO_DEEP}" in printed, printed
    assert "No transfer.json was written" not in printed
