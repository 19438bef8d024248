"""rewrite.py end to end on a tiny model: `train` memorises records, `apply` writes validated Agent Skills,
an unparseable rewriter output is saved raw and never written as a skill, `apply --compare` prints one table
(task model and teacher scripted behind the real HTTP server)."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import evolve_masa
import rewrite
from helpers import TARGET, TASK, run_rewrite, run_rewrite_compare
from minskill.masa import rewriter
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet



def test_train_reports_bad_lines_and_writes_a_resumable_hf_run(trained, files):
    out, stdout, stderr = trained
    assert f"{files['data']}:2: skipped: invalid JSON" in stderr
    assert "2 records read, 1 malformed lines skipped, 0 longer than 4096 tokens skipped" in stdout
    assert "step 40/40 | loss " in stdout
    for name in ("final/config.json", "final/model.safetensors", "final/tokenizer.json", "metrics.jsonl",
                 "loss.svg", "run_config.json", "checkpoint-40/trainer_state.pt"):
        assert (out / name).is_file(), name
    config = json.loads((out / "run_config.json").read_text())
    assert config["data_counts"]["malformed_lines"] == 1 and config["config"]["lr"] == 2e-2


def test_train_reads_its_val_file(files, tmp_path):
    """--val-file is one file; its path was read as a list of paths, one a character ("file not found: /")."""
    code, stdout, stderr = train_briefly(files, tmp_path / "run", "--val-file", str(files["data"]), "--max-steps", "1")
    assert code == 0, stderr
    assert "-> 2 train / 2 validation examples" in stdout
    assert "val_loss" in (tmp_path / "run" / "metrics.jsonl").read_text()


def train_briefly(files, out, *extra):
    """6 optimizer steps, a checkpoint every 2 (the last 2 kept)."""
    return run_rewrite(["train", str(files["data"]), "--base-model", str(files["base"]), "--out", str(out), "--lr", "1e-2",
                "--epochs", "6", "--batch-size", "2", "--micro-batch", "2", "--val-fraction", "0",
                "--save-every", "2", "--device", "cpu", *extra])


@pytest.fixture(scope="module")
def brief(files):
    out = files["root"] / "brief"
    code, _, stderr = train_briefly(files, out)
    assert code == 0, stderr
    return out


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


@pytest.mark.parametrize("damage, message", [
    (lambda ckpt: truncate(ckpt / "trainer_state.pt"), "trainer_state.pt: damaged, cannot be read"),
    (lambda ckpt: (ckpt / "model.safetensors").unlink(), "neither model.safetensors"),
    (lambda ckpt: truncate(ckpt / "model.safetensors"), "model.safetensors: damaged, not a readable safetensors"),
])
def test_train_resume_falls_back_past_a_damaged_newest_checkpoint(files, brief, tmp_path, damage, message):
    """A damaged newest checkpoint was a traceback although an intact one came before it."""
    out = tmp_path / "cut"
    assert train_briefly(files, out, "--max-steps", "4")[0] == 0      # checkpoint-2 and checkpoint-4
    damage(out / "checkpoint-4")
    # no flag repeated but the larger budget: the saved run's flags continue it (minskill.runs.resume_flags)
    code, stdout, stderr = run_rewrite(["train", "--out", str(out), "--resume", "--max-steps", "6"])
    assert code == 0, stderr
    assert f"{out / 'checkpoint-4'}" in stdout and message in stdout
    assert f"falling back to the earlier {out / 'checkpoint-2'}" in stdout
    assert f"continuing from {out / 'checkpoint-2'} at step 2/6" in stdout
    a, b = (load_file(str(run_dir / "final" / "model.safetensors")) for run_dir in (brief, out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)   # as if never interrupted


def test_train_resume_takes_the_saved_flags_and_refuses_differing_ones(files, tmp_path):
    """`train --resume` continues with the flags saved in run_config.json: a differing one that shapes what is
    learned is refused, each named with both values, and nothing is written (it used to be refused only once the
    model was loaded, and the data had to be repeated); one of RUN_SETTINGS (--log-every) is taken."""
    out = tmp_path / "cut"
    assert train_briefly(files, out, "--max-steps", "2")[0] == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as caught:
        run_rewrite(["train", "--out", str(out), "--resume", "--lr", "1e-3", "--epochs", "3", "--log-every", "3"])
    text = str(caught.value.code)
    assert text.startswith("rewrite.py train: ") and "--lr 0.01 -> 0.001" in text and "--epochs 6.0 -> 3.0" in text
    assert "--log-every" not in text
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    code, stdout, stderr = run_rewrite(["train", "--out", str(out), "--resume", "--max-steps", "4", "--log-every", "3"])
    assert code == 0, stderr
    assert f"continuing from {out / 'checkpoint-2'} at step 2/6" in stdout
    saved = json.loads((out / "run_config.json").read_text())["args"]
    assert (saved["max_steps"], saved["log_every"], saved["lr"], saved["data"]) == (4, 3, 1e-2, [str(files["data"])])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_train_resume_with_every_checkpoint_damaged_names_each(files, tmp_path):
    out = tmp_path / "cut"
    assert train_briefly(files, out, "--max-steps", "4")[0] == 0
    truncate(out / "checkpoint-4" / "trainer_state.pt")
    (out / "checkpoint-2" / "config.json").write_text("{")
    code, stdout, stderr = train_briefly(files, out, "--resume")
    assert code == 1 and "--resume: no checkpoint can be loaded" in stderr
    assert f"{out / 'checkpoint-4' / 'trainer_state.pt'}: damaged" in stderr
    assert f"{out / 'checkpoint-2' / 'config.json'}: damaged, not readable JSON" in stderr


def test_train_resume_without_a_checkpoint_is_refused_and_writes_nothing(files, tmp_path):
    """It used to start a fresh run silently."""
    for out in (tmp_path / "absent", tmp_path / "half"):
        if out.name == "half":
            out.mkdir()
            (out / "metrics.jsonl").write_text("")
        before = sorted(out.rglob("*")) if out.exists() else None
        code, stdout, stderr = train_briefly(files, out, "--resume")
        assert code == 1 and stdout == ""
        assert f"--resume: nothing to resume in {out}" in stderr and "run without --resume to start" in stderr
        assert (sorted(out.rglob("*")) if out.exists() else None) == before


def test_apply_writes_the_rewritten_skills_as_a_validated_folder(trained, files):
    out = files["root"] / "adapted"
    code, stdout, stderr = run_rewrite(["apply", "--rewriter", str(trained[0]), "--model-card", str(files["card"]),
                                "--skills", str(files["skills"]), "--task", TASK, "--out", str(out),
                                "--max-new-tokens", "40", "--json-schema", "off", "--device", "cpu"])
    assert code == 0, stderr
    assert "wrote 0 general + 0 task-specific skills and 1 common mistakes" in stdout
    assert SkillSet.load(out).to_json() == TARGET
    assert (out / "SKILLSET.md").is_file() and not (files["root"] / "adapted.raw.txt").exists()
    # a non-empty --out is not replaced without --overwrite
    code, _, stderr = run_rewrite(["apply", "--rewriter", str(trained[0]), "--model-card", str(files["card"]),
                           "--skills", str(files["skills"]), "--task", TASK, "--out", str(out), "--device", "cpu"])
    assert code == 1 and "--overwrite" in stderr


def test_apply_overwrite_replaces_only_a_skill_set_and_refuses_before_the_rewriter_runs(files, tmp_path,
                                                                                         monkeypatch):
    """--overwrite onto a folder that is not a skill set (a work tree, a link to one): refused naming it before
    any model loads, nothing deleted (SkillSet.save refused it only after the rewrite, as "does not parse")."""
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "general").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "repo", target_is_directory=True)
    monkeypatch.setattr(rewrite, "load_model", lambda *a, **k: pytest.fail("the rewriter was loaded"))
    for out, why in ((tmp_path / "repo", "not a skill set (it holds ['.git'])"),
                     (tmp_path / "link", "exists and is not a folder")):
        code, _, stderr = run_rewrite(["apply", "--rewriter", str(files["base"]), "--model-card", str(files["card"]),
                               "--skills", str(files["skills"]), "--task", TASK, "--out", str(out), "--overwrite"])
        assert code == 1 and str(out) in stderr and why in stderr, stderr
    assert (tmp_path / "repo" / ".git").is_dir() and (tmp_path / "link").is_symlink()


def test_apply_saves_an_unparseable_output_raw_and_writes_no_skill(files):
    out = files["root"] / "garbled"
    code, stdout, stderr = run_rewrite(["apply", "--rewriter", str(files["base"]), "--model-card", str(files["card"]),
                                "--skills", str(files["skills"]), "--task", TASK, "--out", str(out),
                                "--max-new-tokens", "24", "--json-schema", "off", "--device", "cpu"])   # random
    assert code == 2
    raw = files["root"] / "garbled.raw.txt"
    assert "does not parse as a skill set" in stderr and str(raw) in stderr
    assert raw.is_file() and raw.read_text() != "" and not out.exists()


def test_apply_constrains_the_reply_to_the_skill_set_schema_so_even_a_random_rewriter_parses(files):
    """--json-schema on (the default): the reply is decoded under the schema parse_rewriter_output reads, so the
    untrained rewriter whose free reply does not parse (the test above) writes a skill set; with too small a
    budget the reply is cut and says so; --compile-decode (free text) is refused beside it."""
    out = files["root"] / "constrained"
    code, stdout, stderr = run_rewrite(["apply", "--rewriter", str(files["base"]), "--model-card", str(files["card"]),
                                        "--skills", str(files["skills"]), "--task", TASK, "--out", str(out),
                                        "--max-new-tokens", "160", "--device", "cpu"])
    assert code == 0, stderr
    written = SkillSet.load(out)
    assert written.general and all(s.description for s in written.general)
    assert "finish: stop" in stderr
    cut = files["root"] / "constrained-cut"
    code, _, stderr = run_rewrite(["apply", "--rewriter", str(files["base"]), "--model-card", str(files["card"]),
                                   "--skills", str(files["skills"]), "--task", TASK, "--out", str(cut),
                                   "--max-new-tokens", "6", "--device", "cpu"])
    assert code == 2 and "hit the token limit" in stderr and not cut.exists()
    code, _, stderr = run_rewrite(["apply", "--rewriter", str(files["base"]), "--model-card", str(files["card"]),
                                   "--skills", str(files["skills"]), "--task", TASK, "--out", str(cut),
                                   "--compile-decode", "--device", "cpu"])
    assert code == 1 and "--compile-decode decodes free text: add --json-schema off" in stderr


def test_parse_rewriter_output():
    good = json.dumps({"general_skills": [{"skill_id": "count-first", "title": "Count first",
                                           "principle": "Count the items.", "when_to_apply": "Counting."}]})
    assert rewriter.parse_rewriter_output(f"```json\n{good}\n```").general[0].name == "count-first"
    with pytest.raises(ValueError, match="not valid JSON .*token limit"):
        rewriter.parse_rewriter_output(good[:-10], finish_reason="length")
    with pytest.raises(ValueError, match="no JSON object"):
        rewriter.parse_rewriter_output("---\nname: x\ndescription: y\n---\nprose")   # not the trained format
    with pytest.raises(ValueError, match="empty skill set"):
        rewriter.parse_rewriter_output('{"general_skills": [], "common_mistakes": []}')
    with pytest.raises(ValueError, match="none of general_skills"):
        rewriter.parse_rewriter_output('{"answer": 3}')
    with pytest.raises(ValueError, match="not a valid MASA skill library"):
        rewriter.parse_rewriter_output('{"general_skills": "oops"}')


@pytest.mark.parametrize("text", ['{"general_skills": ' + "[" * 1000, "{" + '"a": {' * 2000,
                                  '{"general_skills": [], "common_mistakes": ["x"], "junk": ' + "[" * 500 + "]" * 500
                                  + "}"], ids=["unclosed", "unclosed-objects", "closed-500-deep"])
def test_parse_rewriter_output_refuses_deep_nesting_with_its_value_error(text):
    """A rewriter reply nested past 64 levels is the ordinary ValueError (apply saves it raw), never RecursionError."""
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        rewriter.parse_rewriter_output(text)


def test_parse_rewriter_output_merges_a_skill_set_split_over_objects():
    general = {"general_skills": [{"skill_id": "end-with-answer", "title": "End with the answer",
                                   "principle": "Write the answer last.", "when_to_apply": "Always."}]}
    specific = {"task_specific_skills": {"counting": [{"skill_id": "count-one", "title": "Count one item",
                                                        "principle": "Tally the item.", "when_to_apply": "Counting."}]}}
    skills = rewriter.parse_rewriter_output(json.dumps(general, indent=1) + "\n\n" + json.dumps(specific) + "\n")
    assert skills.to_json()["general_skills"][0]["skill_id"] == "end-with-answer"
    assert [s.name for s in skills.task_specific["counting"]] == ["count-one"]
    with pytest.raises(ValueError, match="value 2 is not a further part"):     # the same key twice: ambiguous
        rewriter.parse_rewriter_output(json.dumps(general) + json.dumps(general))
    with pytest.raises(ValueError, match="value 2 is not a further part"):
        rewriter.parse_rewriter_output(json.dumps(general) + ' {"answer": 3}')
    with pytest.raises(ValueError, match="not valid JSON"):                      # prose between the parts
        rewriter.parse_rewriter_output(json.dumps(general) + " and then " + json.dumps(specific))


def test_apply_compare_prints_one_table_of_input_rewritten_and_teacher(trained, files):
    tasks = files["root"] / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i),
                                         "type": "sum" if i < 2 else "unit"}) + "\n" for i in range(4)))
    teacher_set = {"general_skills": [{"skill_id": "tip", "title": "Tip", "principle": "Sum tip.",
                                       "when_to_apply": "Always."}]}

    def script(messages, request):
        if "one shot" in messages[-1]["content"].lower() or "## Task:" in messages[-1]["content"]:
            return json.dumps(teacher_set)                           # the teacher's one-shot rewrite
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        question = messages[-1]["content"]
        i = int(question.split()[2])
        solved = "Carry the one." in system or ("Sum tip." in system and i < 2)
        return f"The answer is {2 * i}." if solved else "I am not sure."

    with start_server(ScriptedBackend(script)) as server:
        out = files["root"] / "compared"
        code, stdout, stderr = run_rewrite_compare(trained[0], files, tasks, out, server.url)
    assert code == 0, stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in stdout.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["skills"][:2] == ["n", "success"] and rows["skills"][-2:] == ["sum", "unit"]
    assert rows["input"][:2] == ["4", "0.00"]
    assert rows["rewritten"][:2] == ["4", "1.00"]
    assert rows["teacher one-shot"][:2] == ["4", "0.50"] and rows["teacher one-shot"][-2:] == ["1.00", "0.00"]
    report = json.loads((files["root"] / "compared-compare" / "compare.json").read_text())
    assert report["results"]["rewritten"]["success_rate"] == 1.0
    assert SkillSet.load(files["root"] / "compared-compare" / "teacher_oneshot").general[0].name == "tip"
    # the cost per role, apart although one server answers the task model and the teacher
    costs = report["costs"]
    assert costs["teacher (one-shot)"]["calls"] == 1 and costs["teacher (one-shot)"]["completion_tokens"] > 0
    assert costs["task model"]["calls"] == 3 * 4 and costs["task model"]["failures"] == 0
    assert costs["task model"]["prompt_tokens"] > 0 and costs["teacher (one-shot)"]["prompt_tokens"] > 0
    assert all(0 < costs[r][k] < float("inf") for r in ("task model", "teacher (one-shot)")
               for k in ("request_seconds", "busy_seconds", "wall_seconds"))
    rewriter = costs["rewriter"]
    assert rewriter["calls"] == 1 and 0 < rewriter["completion_tokens"] <= 40 and rewriter["wall_seconds"] > 0
    # a second comparison into the same OUT-compare is refused before anything runs (the run-folder rule)
    compared = files["root"] / "compared-compare"
    again = ["apply", "--compare", "--rewriter", str(trained[0]), "--model-card", str(files["card"]), "--skills",
             str(files["skills"]), "--task", TASK, "--out", str(files["root"] / "other"), "--compare-out",
             str(compared), "--suite", str(tasks), "--task-url", "http://127.0.0.1:9/v1"]
    for extra, refusal in (([], f"--out {compared} is not empty .*--overwrite"),
                           (["--overwrite"], "not a minskill run folder")):
        if extra:
            (compared / ".minskill-run").unlink()       # a folder no run started in: --overwrite refuses too
        before = {p: p.read_bytes() for p in compared.rglob("*") if p.is_file()}
        with pytest.raises(SystemExit, match=refusal):
            run_rewrite(again + extra)
        assert {p: p.read_bytes() for p in compared.rglob("*") if p.is_file()} == before
    assert not (files["root"] / "other").exists()


def test_apply_gives_the_rewriter_the_card_and_task_its_sft_records_hold(trained, files, tmp_path, monkeypatch):
    """`apply --model-card smollm2-135m` (and transfer's embedded targets) built a thinner card
    than evolve_masa.py's (six fields differed), and --task was free text where the records hold the suite's
    description. Now both build the card with evolve_masa.py's builder and --task qa stands for the records'
    description. (The embedded default's folder is faked in a temporary MINSKILL_CACHE: only config.json is read.)"""
    from minskill.nn.weights import CONVERTED_FILES, DEFAULT_MODEL
    folder = tmp_path / "cache" / DEFAULT_MODEL
    folder.mkdir(parents=True)
    for name in CONVERTED_FILES:
        (folder / name).write_text("")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "max_position_embeddings": 8192, "tie_word_embeddings": True}))
    monkeypatch.setenv("MINSKILL_CACHE", str(tmp_path / "cache"))
    parser = evolve_masa.build_parser()
    train_args = parser.parse_args(["--suite", "qa", "--out", str(tmp_path / "masa")])   # the embedded target
    run_setup = evolve_masa.set_up(parser, train_args)          # no model call: the card and the tasks
    record_card = evolve_masa.initial_card(run_setup.args, None).to_json()   # before the teacher's summary
    seen = {}

    def spy(model, tokenizer, card, skills, task, *rest):
        seen.update(card=card, task=task)
        return '{"common_mistakes": ["x"]}', "stop"
    monkeypatch.setattr(rewrite, "rewrite_with_model", spy)
    code, _, stderr = run_rewrite(["apply", "--rewriter", str(trained[0]), "--model-card", DEFAULT_MODEL, "--skills",
                           str(files["skills"]), "--task", "qa", "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert code == 0, stderr
    assert record_card["family"] == "SmolLM2" and record_card["training_data_size"] == "2T tokens"
    for field, value in record_card.items():
        assert (field, seen["card"][field]) == (field, value)
    assert seen["card"] == record_card
    assert seen["task"] == run_setup.task_description and seen["task"].startswith("Suite 'qa'")
    assert "has no strengths or weaknesses" in stderr       # said: only a run folder's card has the teacher's
    (tmp_path / "run").mkdir()                             # a run's own card is the records' card: no note
    (tmp_path / "run" / "model_card.json").write_text(json.dumps(record_card))
    code, _, stderr = run_rewrite(["apply", "--rewriter", str(trained[0]), "--model-card", str(tmp_path / "run"),
                                   "--skills", str(files["skills"]), "--task", "qa", "--out", str(tmp_path / "out2"),
                                   "--device", "cpu"])
    assert code == 0 and seen["card"] == record_card and "has no strengths or weaknesses" not in stderr, stderr
    from minskill.measure import transfer  # transfer's embedded target: the same builder
    (target,) = transfer.load_targets(transfer.build_parser().parse_args(
        ["--libraries", "builtin", "--targets", f"f={DEFAULT_MODEL}", "--rewriter", str(trained[0])]))
    assert target.card == record_card


def test_apply_compare_scores_the_other_rows_when_the_teacher_gives_no_reply_in_time(trained, files):
    """A teacher slower than --timeout: the one-shot row says it had no reply (stderr says why and the fix), the
    input and rewritten rows are still scored, exit 0 (it was a traceback); --timeout 0 is refused up front."""
    import time
    tasks = files["root"] / "tasks-slow.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i),
                                         "type": "sum"}) + "\n" for i in range(2)))

    def slow_teacher(messages, request):
        time.sleep(4)                                                # slower than --timeout
        return "{}"

    def task_model(messages, request):
        return f"The answer is {2 * int(messages[-1]['content'].split()[2])}."

    base = ["apply", "--compare", "--rewriter", str(trained[0]), "--model-card", str(files["card"]), "--skills",
            str(files["skills"]), "--task", TASK, "--max-new-tokens", "40", "--json-schema", "off",
            "--device", "cpu", "--suite", str(tasks), "--split", "all"]
    with start_server(ScriptedBackend(task_model)) as server, \
            start_server(ScriptedBackend(slow_teacher, name="teacher")) as teacher:
        code, stdout, stderr = run_rewrite(base + ["--out", str(files["root"] / "slow"), "--task-url", server.url,
                                                   "--teacher-url", teacher.url, "--timeout", "1"])
    assert code == 0, stderr
    assert "teacher one-shot rewrite: no reply" in stderr and "raise --timeout" in stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in stdout.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["input"][:2] == ["2", "1.00"] and rows["rewritten"][:2] == ["2", "1.00"]
    assert rows["teacher one-shot"][:2] == ["–", "no reply from the teacher (stderr says why)"]
    code, _, stderr = run_rewrite(base + ["--out", str(files["root"] / "never"), "--task-url",
                                          "http://127.0.0.1:9/v1", "--timeout", "0"])
    assert code == 1 and "--timeout must be > 0 seconds" in stderr


@pytest.mark.parametrize("suite", ["webshop", "searchqa"])
def test_apply_compare_scores_the_multi_turn_suites(trained, files, suite):
    """--compare runs the agent loop on the WebShop-like and search-QA suites (a task model that answers at once)."""
    teacher_set = {"general_skills": [{"skill_id": "tip", "title": "Tip", "principle": "Read the page.",
                                       "when_to_apply": "Always."}]}

    def script(messages, request):
        if "one shot" in messages[-1]["content"].lower() or "## Task:" in messages[-1]["content"]:
            return json.dumps(teacher_set)
        return "answer[nobody]" if suite == "searchqa" else "click[buy now]"

    with start_server(ScriptedBackend(script)) as server:
        out = files["root"] / f"compared-{suite}"
        code, stdout, stderr = run_rewrite(["apply", "--compare", "--rewriter", str(trained[0]), "--model-card",
                                    str(files["card"]), "--skills", str(files["skills"]), "--task", TASK,
                                    "--out", str(out), "--max-new-tokens", "40", "--json-schema", "off",
                                    "--device", "cpu", "--suite", suite, "--n-tasks", "2", "--task-url", server.url])
    assert code == 0, stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in stdout.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows["input"][:2] == ["2", "0.00"] and rows["rewritten"][:2] == ["2", "0.00"]
