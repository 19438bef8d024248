"""The transfer matrix (minskill/measure/transfer.py) and its report page (minskill/report/transfer.py), with scripted
targets behind the real HTTP server (minskill.serve.backends.ScriptedBackend on loopback).

The scripted targets prefer different skills, the model-dependence effect of the MASA paper: target `alpha`
solves held-out task i (of 10) under library alpha for i < 8, under library beta for i < 2, with no skill for
i in {0, 8, 9}; target `beta` solves i < 9 under beta, i < 3 under alpha, i < 4 with none; target `other`
(no library of its label: paired against the first library) answers like `beta`. So the matrix must cross:
alpha is best on target alpha, beta on targets beta and other. Every number below is worked out by hand
from those sets in the comments next to it.
"""
import contextlib
import io
import json
import re
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from helpers import CHROMIUM, TASK, XSS, assert_self_contained_and_escaped, browse, skill
from minskill.measure import transfer
from minskill.report.provenance import load_transfer
from minskill.report.transfer import render_transfer
from minskill.runs import mark_run_folder
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet
from tiny import make_tiny_model_dir

SOLVES = {"alpha": {"ALPHA-TIP": set(range(8)), "BETA-TIP": {0, 1}, None: {0, 8, 9}},
          "beta": {"BETA-TIP": set(range(9)), "ALPHA-TIP": {0, 1, 2}, None: {0, 1, 2, 3}}}
CALLS = []     # one entry per chat request any scripted target answered (the --resume tests count them)


def scripted_target(prefers: str):
    def answer(messages, request):
        CALLS.append(prefers)
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        i = int(re.search(r"item (\d+)", messages[-1]["content"]).group(1))
        tip = next((k for k in ("ALPHA-TIP", "BETA-TIP") if k in system), None)
        return f"Answer: {100 + i}" if i in SOLVES[prefers][tip] else "I am not sure, maybe 1."
    return answer


def run_main(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = transfer.main([str(a) for a in argv])
        except SystemExit as e:      # argparse's errors
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("transfer")
    suite = tmp / "codes.jsonl"
    lines = [{"id": f"code-{i}", "type": "code", "split": "heldout", "answer": str(100 + i),
              "question": f"What is the code of item {i}?" + (f" {XSS}" if i == 5 else "")} for i in range(10)]
    lines += [{"id": f"train-{i}", "type": "code", "split": "train", "answer": "1",
               "question": f"What is the code of item {i}?"} for i in range(10, 14)]
    suite.write_text("".join(json.dumps(x) + "\n" for x in lines))
    SkillSet(general=[skill("alpha-tip", "ALPHA-TIP: answer with 'Answer: N'.")]).save_json(tmp / "alpha.json")
    SkillSet(general=[skill("beta-tip", "BETA-TIP: look the code up.")]).save(tmp / "runs" / "beta" / "library")
    servers = {name: start_server(ScriptedBackend(scripted_target(prefers), name=name))
               for name, prefers in (("alpha-model", "alpha"), ("beta-model", "beta"), (XSS, "beta"))}
    yield {"tmp": tmp, "suite": suite, "urls": {k: s.url for k, s in servers.items()}}
    for server in servers.values():
        server.close()


def targets_argv(env, **moved) -> list:
    """--targets of the matrix, a label=URL keyword moving that target to URL."""
    urls = {"alpha": env["urls"]["alpha-model"], "beta": env["urls"]["beta-model"], "other": env["urls"][XSS], **moved}
    return ["--targets", *(f"{label}={url}" for label, url in urls.items())]


def matrix_argv(env, out) -> list:
    return ["--suite", env["suite"], "--n-heldout", 10, "--libraries", f"alpha={env['tmp'] / 'alpha.json'}",
            env["tmp"] / "runs" / "beta" / "library", "none", *targets_argv(env),
            "--target-model", "alpha=alpha-model", "--task-concurrency", 4, "--out", out]


@pytest.fixture(scope="module")
def matrix(env):
    out = env["tmp"] / "matrix"
    code, stdout, stderr = run_main(matrix_argv(env, out))
    assert code == 0, stderr
    return out, stdout, stderr


def cells_of(out: Path) -> dict:
    run = json.loads((out / "transfer.json").read_text())
    return {(c["library"], c["target"]): c for c in run["cells"]}


def test_the_matrix_crosses_and_every_number_is_the_hand_computed_one(matrix):
    out, stdout, stderr = matrix
    run = json.loads((out / "transfer.json").read_text())
    assert run["complete"] and [r["label"] for r in run["libraries"]] == ["alpha", "beta", "none"]
    assert [t["label"] for t in run["targets"]] == ["alpha", "beta", "other"]
    assert [t["model"] for t in run["targets"]] == ["alpha-model", "beta-model", XSS]   # asked for / listed
    assert run["task_ids"] == [f"code-{i}" for i in range(10)]
    cells = cells_of(out)
    success = {k: c["success"] for k, c in cells.items()}
    assert success == {("alpha", "alpha"): 0.8, ("beta", "alpha"): 0.2, ("none", "alpha"): 0.3,
                       ("alpha", "beta"): 0.3, ("beta", "beta"): 0.9, ("none", "beta"): 0.4,
                       ("alpha", "other"): 0.3, ("beta", "other"): 0.9, ("none", "other"): 0.4}
    # the crossing: each target's best library is a different one
    best = {t: max(("alpha", "beta", "none"), key=lambda lib: success[(lib, t)]) for t in ("alpha", "beta")}
    assert best == {"alpha": "alpha", "beta": "beta"}
    # Wilson 8/10: (0.8 + 3.8416/20 ± 1.96·sqrt(0.016 + 3.8416/400)) / 1.38416 = 0.4902 .. 0.9433
    assert cells[("alpha", "alpha")]["ci95"] == pytest.approx([0.4902, 0.9433], abs=1e-4)
    assert cells[("alpha", "alpha")]["rewards"] == [1.0] * 8 + [0.0] * 2
    # own libraries are the references; `other` has none, so it is paired against the first library (alpha)
    assert {k: c["reference"] for k, c in cells.items() if k[1] == "other"} == {(lib, "other"): "alpha" for lib in
                                                                               ("alpha", "beta", "none")}
    assert cells[("alpha", "alpha")]["paired"] is None and cells[("beta", "beta")]["paired"] is None
    expected = {   # (Δ, gained, lost, p): p = min(1, 2·Σ_{i ≤ min(g, l)} C(g + l, i) / 2^(g + l))
        ("beta", "alpha"): (-0.6, 0, 6, 2 / 64),            # lost 2..7
        ("none", "alpha"): (-0.5, 2, 7, 2 * (1 + 9 + 36) / 512),   # gained 8, 9; lost 1..7
        ("alpha", "beta"): (-0.6, 0, 6, 2 / 64),            # lost 3..8
        ("none", "beta"): (-0.5, 0, 5, 2 / 32),             # lost 4..8
        ("beta", "other"): (0.6, 6, 0, 2 / 64),             # gained 3..8
        ("none", "other"): (0.1, 1, 0, 1.0)}                # gained 3: m = 1, p = min(1, 2·1/2)
    for key, (diff, gained, lost, p) in expected.items():
        d = cells[key]["paired"]
        assert (d["diff"], d["gained"], d["lost"], d["p"]) == (pytest.approx(diff), gained, lost, pytest.approx(p)), key


def test_the_table_trajectories_and_progress(matrix, env):
    out, stdout, stderr = matrix
    table = (out / "table.md").read_text()
    assert table.strip() == stdout.split("\nwrote ")[0].strip()
    header = next(line for line in table.splitlines() if line.startswith("| library"))
    assert "| alpha · Δ vs alpha (own) |" in header
    assert "| other · Δ vs alpha (first library: none labelled other) |" in header
    row = next(line for line in table.splitlines() if line.startswith("| beta |"))
    assert "| 0.20 (0.06–0.51) · Δ -0.60, +0/−6, p 0.0312 |" in row     # Wilson 2/10; p = 2/64
    assert "**0.90 (0.60–0.98) · reference**" in row            # the best of column beta, in bold
    # trajectories per cell: the library reached the system prompt, none means no system message
    trajs = [json.loads(x) for x in (out / "trajectories" / "alpha" / "beta.jsonl").read_text().splitlines()]
    assert len(trajs) == 10 and "BETA-TIP" in trajs[0]["messages"][0]["content"]
    none = json.loads((out / "trajectories" / "beta" / "none.jsonl").read_text().splitlines()[0])
    assert none["messages"][0]["role"] == "user"
    assert len(re.findall(r"\[\d/9\] ", stderr)) == 9 and "[9/9]" in stderr


def test_report_page_draws_the_heat_map_with_every_run_string_escaped(matrix, tmp_path):
    out = matrix[0]
    run = load_transfer(out)
    text = render_transfer(run)
    assert_self_contained_and_escaped(text)          # the XSS model name and task question: escaped
    from minskill.report import __main__ as report
    page = tmp_path / "page.html"
    assert report.main([str(out), "-o", str(page)]) == 0 and page.read_text(encoding="utf-8") == text  # the CLI
    svg = text[text.index("<svg"):text.index("</svg>")]
    assert svg.count("<rect") == 9 + 3 + 10           # 9 cells, 3 best-of-column borders, the legend's 10 steps
    assert "Δ -0.60  +0/−6  p 0.031" in svg and "Δ +0.60  +6/−0  p 0.031" in svg
    assert svg.count(">reference<") == 3 and ">0.80<" in svg and ">0.90<" in svg
    assert "code-5: What is the code of item 5? &lt;script&gt;" in text      # gained/lost task lists
    # an interrupted run says which cells are missing
    data = json.loads((out / "transfer.json").read_text())
    data.update(complete=False, cells=data["cells"][:4])
    partial = render_transfer({"kind": "transfer", "folder": "x", "files": ["transfer.json"], "transfer": data})
    assert "5 of 9 cells" in partial and "not run" in partial


def test_a_folder_without_transfer_json_is_not_a_run(tmp_path):
    from minskill.report.provenance import NotARun
    with pytest.raises(NotARun, match="transfer.json"):
        load_transfer(tmp_path)
    (tmp_path / "transfer.json").write_text('{"libraries": []}')
    with pytest.raises(NotARun, match="not a transfer matrix"):
        load_transfer(tmp_path)


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (Debian: apt-get install chromium)")
def test_the_page_loads_in_chromium_without_console_errors(matrix, tmp_path):
    page = tmp_path / "transfer.html"
    page.write_text(render_transfer(load_transfer(matrix[0])), encoding="utf-8")
    console = browse(page, tmp_path / "transfer.png", tmp_path / "profile", 1400)
    assert console == [], "\n".join(console)


# ---------------------------------------------------------------------------------------------- arguments

def test_labels_and_specs():
    assert transfer.split_label("f32=runs/x", "--libraries") == ("f32", "runs/x")
    assert transfer.split_label("http://h:1/v1?a=b", "--targets") == (None, "http://h:1/v1?a=b")
    t = transfer.parse_target("smollm2-135m:int8")
    assert (t.label, t.model_spec, t.quantize, t.url) == ("smollm2-135m-int8", "smollm2-135m", "int8", None)
    t = transfer.parse_target("http://127.0.0.1:8000/v1/")
    assert (t.label, t.url, t.model_spec) == ("127.0.0.1-8000", "http://127.0.0.1:8000/v1", None)
    lib = transfer.load_library("builtin", "qa")
    assert lib.label == "builtin" and lib.skills.general       # the suite's base skills
    assert transfer.load_library("none", "qa").skills is None


@pytest.mark.parametrize("extra, names", [
    (["--libraries", "bad label=x"], "'bad label' is not a label"),
    (["--libraries", "a=/no/such/folder"], "--libraries 'a=/no/such/folder': no such folder"),
    (["--libraries", "x=builtin", "x=none"], "the label 'x' is given twice"),
    (["--targets", "m=not-a-model"], "--targets 'm=not-a-model'"),
    (["--targets", "m=smollm2-135m", "--target-model", "m=foo"], "a model name is for a URL target"),
    (["--target-model", "zz=foo"], "--target-model 'zz=foo'"),
    (["--model-card", "t=card.json"], "--model-card is for --rewriter"),
    (["--rewriter", "ckpt"], "give its model card with --model-card t=PATH"),
    (["--suite", "nope"], "--suite nope"),
])
def test_bad_arguments_exit_2_naming_the_argument(extra, names, tmp_path):
    argv = ["--libraries", "builtin", "--targets", "t=http://127.0.0.1:9/v1", "--out", tmp_path / "o"]
    for flag in ("--libraries", "--targets"):      # `extra` replaces the default of its flag
        if flag in extra:
            i = argv.index(flag)
            del argv[i:i + 2]
    code, _, stderr = run_main(argv + extra)
    assert code == 2 and names in stderr, stderr
    assert not (tmp_path / "o").exists()            # nothing written


def test_a_non_empty_out_is_refused_without_overwrite(env, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    argv = ["--suite", env["suite"], "--n-heldout", 2, "--libraries", "none",
            "--targets", f"a={env['urls']['alpha-model']}", "--out", tmp_path]
    code, _, stderr = run_main(argv)
    assert code == 2 and "--overwrite" in stderr and (tmp_path / "keep.txt").exists()
    code, _, stderr = run_main(argv + ["--overwrite"])     # no run started there: not cleared
    assert code == 2 and "not a minskill run folder" in stderr and (tmp_path / "keep.txt").exists()
    mark_run_folder(tmp_path, "transfer")                  # as if a run had started there
    code, _, stderr = run_main(argv + ["--overwrite"])
    assert code == 0, stderr
    assert not (tmp_path / "keep.txt").exists() and cells_of(tmp_path)[("none", "a")]["success"] == 0.5  # tasks 0, 1: solves 0


# ---------------------------------------------------------------------------------------------- embedded targets

def test_embedded_targets_get_one_server_per_distinct_spec_stopped_at_the_end(env, tmp_path, monkeypatch):
    model = make_tiny_model_dir(tmp_path / "tiny", family="llama", chat_format="chatml")
    started = []
    real = transfer.embedded_client

    @contextlib.contextmanager
    def counting(*args, **kwargs):           # the real embedded server; remembers each one started
        with real(*args, **kwargs) as client:
            if kwargs.get("url") is None:
                started.append((kwargs["model_spec"], kwargs["quantize"], client.server_process))
            yield client
    monkeypatch.setattr(transfer, "embedded_client", counting)
    out = tmp_path / "out"
    code, stdout, stderr = run_main(["--suite", env["suite"], "--n-heldout", 2, "--task-max-tokens", 2, "--libraries",
                                     "none", "--targets", f"a={model}", f"b={model}:none", f"q={model}:int8",
                                     "--out", out])
    assert code == 0, stderr
    assert [(spec, q) for spec, q, _ in started] == [(str(model), "none"), (str(model), "int8")]  # a, b share one
    assert all(process.poll() is not None for _, _, process in started)     # every server stopped
    run = json.loads((out / "transfer.json").read_text())
    targets = {t["label"]: t for t in run["targets"]}
    assert targets["a"]["model"] == targets["b"]["model"] and targets["q"]["model"].endswith("-int8")
    assert [targets[k]["quantize"] for k in "abq"] == ["none", "none", "int8"]
    assert len(run["cells"]) == 3 and all(c["n"] == 2 for c in run["cells"])


# ---------------------------------------------------------------------------------------------- --rewriter

def rewriter_target(messages, request):
    """Solves a task only under the skills the tiny rewriter was trained to write ("Carry the one.")."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    i = int(re.search(r"item (\d+)", messages[-1]["content"]).group(1))
    return f"Answer: {100 + i}" if "Carry the one." in system else "I am not sure."


def test_rewriter_rows_are_paired_against_their_input(env, trained, files, tmp_path):
    out = tmp_path / "rw"
    with start_server(ScriptedBackend(rewriter_target, name="rw-target")) as server:
        code, stdout, stderr = run_main([
            "--suite", env["suite"], "--n-heldout", 4, "--libraries", f"empty={files['skills']}",
            "--targets", f"t={server.url}", "--rewriter", trained[0], "--model-card", f"t={files['card']}",
            "--task", TASK, "--rewriter-max-tokens", 40, "--rewriter-json-schema", "off", "--device", "cpu",
            "--out", out])
    assert code == 0, stderr
    cells = cells_of(out)
    assert cells[("empty", "t")]["success"] == 0.0 and cells[("empty+rw", "t")]["success"] == 1.0
    d = cells[("empty+rw", "t")]["paired"]
    assert cells[("empty+rw", "t")]["reference"] == "empty" and (d["gained"], d["lost"], d["p"]) == (4, 0, 0.125)
    assert SkillSet.load(out / "rewritten" / "t" / "empty").common_mistakes == ["Carry the one."]
    assert "a +rw row is paired against its input library" in stdout


def test_a_rewrite_that_does_not_parse_leaves_its_cell_unscored(env, files, tmp_path):
    out = tmp_path / "garbled"
    with start_server(ScriptedBackend(rewriter_target, name="rw-target")) as server:
        code, stdout, stderr = run_main([
            "--suite", env["suite"], "--n-heldout", 2, "--libraries", f"empty={files['skills']}",
            "--targets", f"t={server.url}", "--rewriter", files["base"], "--model-card", f"t={files['card']}",
            "--task", TASK, "--rewriter-max-tokens", 8, "--rewriter-json-schema", "off", "--device", "cpu",
            "--out", out])
    assert code == 0, stderr
    cell = cells_of(out)[("empty+rw", "t")]
    assert cell["status"] == "not parsed" and cell["success"] is None and cell["note"]
    assert (out / "rewritten" / "t" / "empty.raw.txt").is_file() and not (out / "rewritten" / "t" / "empty").exists()
    assert "– (the rewrite did not parse)" in stdout
    page = render_transfer(load_transfer(out))
    assert "rewrite did not parse" in page


def test_keyword_retrieval_reaches_every_cell(env, tmp_path):
    out = tmp_path / "retrieved"
    code, stdout, stderr = run_main(["--suite", env["suite"], "--n-heldout", 10, "--libraries",
                                     f"alpha={env['tmp'] / 'alpha.json'}", "--targets",
                                     f"alpha={env['urls']['alpha-model']}", "--retrieve", "keyword",
                                     "--top-k-general", 0, "--out", out])
    assert code == 0, stderr
    # top-k 0 general skills: the tip is never retrieved, so target alpha scores as with no skill ({0, 8, 9})
    assert cells_of(out)[("alpha", "alpha")]["success"] == 0.3
    assert json.loads((out / "transfer.json").read_text())["retrieve"] == "keyword"


# ---------------------------------------------------------------------------------------------- --resume

def interrupt_after_cells(monkeypatch, k: int) -> None:
    """Ctrl-C right after the k-th cell is saved in transfer.json (the matrix is then exactly k cells in)."""
    real = transfer.write_json_atomic

    def write_then_interrupt(path, run, *args, **kwargs):
        real(path, run, *args, **kwargs)
        if Path(path).name == "transfer.json" and len(run["cells"]) == k:
            raise KeyboardInterrupt
    monkeypatch.setattr(transfer, "write_json_atomic", write_then_interrupt)


def test_an_interrupted_matrix_resumes_scoring_only_its_missing_cells(env, matrix, tmp_path, monkeypatch):
    out, straight = tmp_path / "interrupted", matrix[0]
    interrupt_after_cells(monkeypatch, 4)
    code, _, stderr = run_main(matrix_argv(env, out))
    assert code == 130 and f"--resume --out {out}" in stderr
    monkeypatch.undo()
    run = json.loads((out / "transfer.json").read_text())
    assert not run["complete"] and len(run["cells"]) == 4 and run["args"]["n_heldout"] == 10
    kept = out / "trajectories" / "alpha" / "alpha.jsonl"      # the first cell: kept as it is
    before = kept.stat().st_mtime_ns
    code, _, stderr = run_main(matrix_argv(env, out))          # a fresh run into the folder is refused
    assert code == 2 and "--resume" in stderr
    # resumed with a run setting changed and target alpha's endpoint moved (the same model at another URL)
    with start_server(ScriptedBackend(scripted_target("alpha"), name="alpha-model")) as moved:
        CALLS.clear()
        code, stdout, stderr = run_main(["--resume", "--out", out, "--task-concurrency", 2,
                                         *targets_argv(env, alpha=moved.url)])
    assert code == 0, stderr
    assert len(CALLS) == 5 * 10                                 # 5 missing cells × 10 tasks: nothing scored twice
    assert "4 of 9 cells kept, 5 to score" in stderr and len(re.findall(r"\[\d/9\] ", stderr)) == 5
    final, uninterrupted = (json.loads((o / "transfer.json").read_text()) for o in (out, straight))
    assert final["complete"] and final["cells"] == uninterrupted["cells"]      # the same numbers, the same order
    assert final["targets"][0]["url"] == moved.url and final["args"]["targets"][0] == f"alpha={moved.url}"
    assert len(final["resumed"]) == 1 and final["args"]["task_concurrency"] == 4    # the saved setting is kept
    assert kept.stat().st_mtime_ns == before
    assert sorted(p.relative_to(out) for p in (out / "trajectories").rglob("*.jsonl")) == \
        sorted(p.relative_to(straight) for p in (straight / "trajectories").rglob("*.jsonl"))
    table = (out / "table.md").read_text()
    assert table.split("\n- target")[0] == (straight / "table.md").read_text().split("\n- target")[0]
    assert table.strip() == stdout.split("\nwrote ")[0].strip()
    # resuming the complete run: table.md rewritten, nothing scored
    (out / "table.md").unlink()
    CALLS.clear()
    code, stdout, stderr = run_main(["--resume", "--out", out])
    assert code == 0 and "nothing to do" in stderr and CALLS == [] and (out / "table.md").read_text() == table
    assert json.loads((out / "transfer.json").read_text()) == final


@pytest.fixture
def partial(matrix, tmp_path):
    """A copy of the matrix with only its first 3 cells (as an interrupted run leaves it)."""
    out = tmp_path / "partial"
    shutil.copytree(matrix[0], out)
    run = json.loads((out / "transfer.json").read_text())
    run.update(complete=False, cells=run["cells"][:3])
    (out / "transfer.json").write_text(json.dumps(run))
    return out


@pytest.mark.parametrize("extra, names", [
    (["--n-heldout", 5], "--n-heldout 10 -> 5"),
    (["--task-max-tokens", 64], "--task-max-tokens 128 -> 64"),
    (["--libraries", "none"], "-> ['none']"),
    (["--retrieve", "keyword"], "-> 'keyword'"),
    (["--target-model", "alpha=other-model"], "-> ['alpha=other-model']"),
    (["--targets", "alpha=http://127.0.0.1:9/v1"], "--targets alpha=http://127.0.0.1:9/v1 contradicts"),
    (["--targets", "a=http://127.0.0.1:9/v1", "beta=http://127.0.0.1:9/v1", "other=http://127.0.0.1:9/v1"],
     "give the same labels in the same order"),
    (["--overwrite"], "--resume and --overwrite contradict each other"),
])
def test_resume_refuses_flags_that_contradict_the_saved_run(partial, extra, names):
    before = (partial / "transfer.json").read_bytes()
    CALLS.clear()
    code, _, stderr = run_main(["--resume", "--out", partial, *extra])
    assert code == 2 and names in stderr, stderr
    assert (partial / "transfer.json").read_bytes() == before and CALLS == []


def test_resume_refuses_a_target_serving_another_model_changed_tasks_and_changed_libraries(env, partial):
    before = (partial / "transfer.json").read_bytes()
    CALLS.clear()      # beta (no --target-model: the model its server lists) moved to a server of another model
    code, _, stderr = run_main(["--resume", "--out", partial, *targets_argv(env, beta=env["urls"]["alpha-model"])])
    assert code == 2 and "serves the model 'alpha-model'" in stderr and "saved column beta" in stderr, stderr
    assert CALLS == []
    assert (partial / "transfer.json").read_bytes() == before
    for edit, names in ((lambda run: run["task_ids"].__setitem__(0, "code-99"), "held-out task ids"),
                        (lambda run: run["libraries"][0].update(digest="0" * 16), "--libraries alpha=")):
        run = json.loads(before)
        edit(run)
        (partial / "transfer.json").write_text(json.dumps(run))
        code, _, stderr = run_main(["--resume", "--out", partial])
        assert code == 2 and names in stderr and "changed" in stderr, stderr


@pytest.mark.parametrize("content, names", [
    (None, "no transfer matrix to continue in"),
    ('{"cells": [', "not valid JSON"),
    ('{"kind": "transfer", "cells": []}', "is not a transfer matrix that can be continued"),
])
def test_resume_without_a_readable_transfer_json_is_refused(tmp_path, content, names):
    out = tmp_path / "run"
    if content is not None:
        out.mkdir()
        (out / "transfer.json").write_text(content)
    code, _, stderr = run_main(["--resume", "--out", out])
    assert code == 2 and names in stderr and "transfer.json" in stderr, stderr
    code, _, stderr = run_main(["--resume"])
    assert code == 2 and "--resume needs --out" in stderr
    code, _, stderr = run_main(["--out", out])
    assert code == 2 and "--libraries and --targets are required" in stderr


def files_outside(root: Path, out: Path) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_relative_to(out))


@pytest.mark.parametrize("label", ["ABSOLUTE", "../../escaped+rw", "alpha/../../../x+rw", "alpha+rw/../../y"])
def test_resume_refuses_a_saved_row_whose_label_is_a_path_and_writes_nothing_outside(partial, tmp_path, label):
    """A rewritten row's label names its trajectories file: one that is a path (absolute, or with '..') used to
    be written there (plus .jsonl) on --resume; now the saved run is refused, naming the field."""
    label = str(tmp_path / "outside" / "evil+rw") if label == "ABSOLUTE" else label
    for target in ("alpha", "beta", "other"):      # the rewrites the row would read back
        SkillSet(general=[skill("tip", "ALPHA-TIP: answer.")]).save(partial / "rewritten" / target / "alpha")
    run = json.loads((partial / "transfer.json").read_text())
    run["libraries"].append({"label": label, "rewritten_from": "alpha", "unparsed": {}, "spec": "x on alpha"})
    (partial / "transfer.json").write_text(json.dumps(run))
    before = files_outside(tmp_path, partial)
    CALLS.clear()
    code, _, stderr = run_main(["--resume", "--out", partial])
    assert code == 2 and "transfer.json: field libraries[3].label" in stderr and "not a library label" in stderr, stderr
    assert files_outside(tmp_path, partial) == before and CALLS == []


def test_resume_does_not_write_through_a_link_out_of_the_run_folder(partial, tmp_path):
    """A folder of OUT that is a symbolic link to elsewhere: the cell that would be written there is refused."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(partial / "trajectories" / "beta")
    (partial / "trajectories" / "beta").symlink_to(elsewhere, target_is_directory=True)
    code, _, stderr = run_main(["--resume", "--out", partial])
    assert code == 2 and "is outside" in stderr and "trajectories/beta" in stderr, stderr
    assert list(elsewhere.iterdir()) == []
    assert len(json.loads((partial / "transfer.json").read_text())["cells"]) == 3   # the column before: kept


@pytest.mark.parametrize("edit, names", [
    (lambda run: run["cells"][0].update(success="abc"), "field cells[0].success: expected null or a number, got the string 'abc'"),
    (lambda run: run["cells"].__setitem__(1, None), "field cells[1]: expected an object, got null"),
    (lambda run: (run.update(complete=True), run["cells"][0].update(ci95=None)), "cells[0] (scored): field ci95: expected a list, got null"),
    (lambda run: run["cells"][2].update(rewards=[1.0]), "field cells[2].rewards: 1 rewards for 10 tasks"),
    (lambda run: run["targets"][0].pop("model"), "field targets[0] lacks the field 'model'"),
    (lambda run: run.update(task_ids="abc"), "field task_ids: expected a list"),
])
def test_resume_and_the_report_refuse_a_wrong_shaped_transfer_json_naming_the_field(partial, tmp_path, edit, names):
    run = json.loads((partial / "transfer.json").read_text())
    edit(run)
    (partial / "transfer.json").write_text(json.dumps(run))
    before = (partial / "transfer.json").read_bytes()
    code, _, stderr = run_main(["--resume", "--out", partial])
    assert code == 2 and f"{partial / 'transfer.json'}" in stderr and names in stderr, stderr
    assert (partial / "transfer.json").read_bytes() == before
    from minskill.report import __main__ as report
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        assert report.main([str(partial), "-o", str(tmp_path / "page.html")]) == 2
    assert "transfer.json" in stderr.getvalue() and names in stderr.getvalue(), stderr.getvalue()


def test_a_resumed_rewriter_matrix_reads_its_rewrites_back(env, trained, files, tmp_path, monkeypatch):
    out = tmp_path / "rw"
    with start_server(ScriptedBackend(rewriter_target, name="rw-target")) as server:
        argv = ["--suite", env["suite"], "--n-heldout", 4, "--libraries", f"empty={files['skills']}",
                "--targets", f"t={server.url}", "--rewriter", trained[0], "--model-card", f"t={files['card']}",
                "--task", TASK, "--rewriter-max-tokens", 40, "--rewriter-json-schema", "off", "--device",
                "cpu", "--out", out]
        interrupt_after_cells(monkeypatch, 1)
        assert run_main(argv)[0] == 130
        monkeypatch.undo()
        assert [c["library"] for c in json.loads((out / "transfer.json").read_text())["cells"]] == ["empty"]
        monkeypatch.setattr(transfer, "rewritten_rows", lambda *a: pytest.fail("the rewriter ran again"))
        code, _, stderr = run_main(["--resume", "--out", out])
    assert code == 0, stderr
    cells = cells_of(out)
    assert cells[("empty", "t")]["success"] == 0.0 and cells[("empty+rw", "t")]["success"] == 1.0
    assert cells[("empty+rw", "t")]["paired"]["gained"] == 4
