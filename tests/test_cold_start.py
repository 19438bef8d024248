"""minskill/skill_r1/cold_start.py: the editor's SFT data (training tasks only; targets that parse and fit; worked
examples only from reward-1 outcomes), the SFT loss falling on it, the output folder loading as train_grpo's editor,
--resume, and bad flags. A tiny random editor and a scripted qa task model behind real HTTP."""
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict

import pytest
from safetensors.torch import load_file

import train_grpo
from minskill.nn.tokenizer import Tokenizer
from minskill.rollout import base_skills
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skill_r1 import cold_start, loop, run_setup
from minskill.skill_r1.loop import EvolveConfig, HistoryEntry, Instance, Outcome, parse_candidate
from minskill.tasks import Task, load_suite
from tiny import make_tiny_model_dir

N_TASKS = 16                 # qa: 4 training tasks of each of the 4 types
MAX_SKILL, CONTEXT = 320, 1400   # the tiny byte-level tokenizer spends about one token per 2-3 characters


def answers() -> dict:
    return {t.question: t.answer for t in load_suite("qa", "train", n=N_TASKS)}


def qa_task_model(known: dict):
    """Right ("The answer is A.") on every other training question whenever it has a system prompt, or always on
    lookup tasks; else a wrong reply. Held-out questions are never right (they are not in `known`)."""
    order = {q: i for i, q in enumerate(sorted(known))}

    def reply(messages, request):
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        question = messages[-1]["content"]
        right = question in known and ((system and order[question] % 2 == 0) or "moons" in question or
                                       "arms" in question)
        return f"Step by step. The answer is {known[question]}." if right else "I am not sure."
    return reply


@pytest.fixture(scope="module")
def editor_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("editor"), family="llama", chat_format="chatml",
                               max_position_embeddings=2048)


@pytest.fixture(scope="module")
def task_url():
    with start_server(ScriptedBackend(qa_task_model(answers()), name="qa")) as server:
        yield server.url


def flags(editor_dir, task_url, out, *extra):
    return ["--editor", str(editor_dir), "--suite", "qa", "--n-tasks", str(N_TASKS), "--tasks-per-instance", "2",
            "--max-instances", "4", "--out", str(out), "--task-url", task_url, "--max-skill-tokens", str(MAX_SKILL),
            "--context-tokens", str(CONTEXT), "--lr", "5e-3", "--epochs", "1", "--batch-size", "4",
            "--micro-batch", "2", "--val-fraction", "0.25", "--device", "cpu", *extra]


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cold_start.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run(editor_dir, task_url, tmp_path_factory, request):
    """The CLI end to end; the suite's splits that were read are recorded."""
    out = tmp_path_factory.mktemp("cold") / "run"
    splits, real = [], loop.load_suite
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(loop, "load_suite", lambda *a, **k: splits.append(k.get("split")) or real(*a, **k))
    try:
        code, stdout, stderr = run_main(flags(editor_dir, task_url, out))
    finally:
        monkeypatch.undo()
    assert code == 0, stderr + stdout
    rows = [json.loads(line) for line in (out / cold_start.DATA_FILE).read_text().splitlines()]
    return out, rows, splits, stdout


def test_data_come_from_training_tasks_only(run):
    out, rows, splits, _ = run
    assert splits == ["train"]
    heldout = [t.question for t in load_suite("qa", "heldout", n=N_TASKS)]
    train = set(answers())
    text = json.dumps(rows)
    assert not [q for q in heldout if json.dumps(q)[1:-1] in text and q not in train]
    assert {r["instance"] for r in rows} == {"train-arithmetic-0", "train-arithmetic-1", "train-conversion-0",
                                             "train-conversion-1"}
    for r in rows:   # every example task of a prompt is a training task of its instance's type
        shown = r["messages"][1]["content"].split("Example tasks:\n", 1)[1].split("\n\n", 1)[0]
        assert all(line[2:] in train for line in shown.splitlines())


def test_prompts_are_train_grpos_and_every_target_parses_and_fits(run, editor_dir):
    _, rows, _, _ = run
    tok = Tokenizer.from_pretrained(editor_dir)
    assert {r["generation"] for r in rows} == {1, 2}
    assert {"base", "base-reordered", "base-short", "procedure", "worked"} <= {r["target_kind"] for r in rows}
    for r in rows:
        assert r["messages"][0]["content"] == loop.EDITOR_SYSTEM
        assert len(tok.apply_chat_template(r["messages"], add_generation_prompt=True)) <= CONTEXT
        skill, error = parse_candidate(r["target"], r["type"])
        assert skill is not None, error
        assert r["target"].startswith("---\nname: ") and "\ndescription: " in r["target"]
        assert len(tok.encode(r["target"].strip())) + 1 <= MAX_SKILL
    generation2 = [r for r in rows if r["generation"] == 2]
    assert all("Earlier skills, newest first:\n[generation 1," in r["messages"][1]["content"] for r in generation2)


def test_worked_examples_are_replies_that_scored_1(run):
    _, rows, _, _ = run
    known = answers()
    worked = [r for r in rows if r["target_kind"] == "worked"]
    assert worked
    for r in worked:
        body = r["target"].split("\n---\n", 1)[1]
        pairs = [block.split("\nA: ") for block in body.split("\n\n") if block.startswith("Q: ")]
        assert pairs
        for question, reply in pairs:
            assert reply == f"Step by step. The answer is {known[question[3:]]}."   # the right one, never "not sure"
            assert f"task: {question[3:63]}" in r["messages"][1]["content"]          # a task the prompt shows


def test_worked_examples_skip_wrong_partial_and_unshown_outcomes():
    right, partial, wrong, hidden = (Outcome("What is 2 + 2?", 1.0, "The answer is 4."),
                                     Outcome("What is 3 + 3?", 0.5, "The answer is 6 or 7."),
                                     Outcome("What is 4 + 4?", 0.0, "The answer is 9."),
                                     Outcome("What is 5 + 5?", 1.0, "The answer is 10."))
    history = [HistoryEntry(0, "", 0.5, [right, partial, wrong]), HistoryEntry(1, "s", 1.0, [hidden])]
    instance = Instance("x", "arithmetic", [Task("t", "arithmetic", "What is 2 + 2?", "4", "final")])
    prompt = loop.editor_messages(instance, "", 0.5, history[:1], lambda m: 0, 10)[1]["content"]
    assert cold_start.worked_examples(prompt, history) == [("What is 2 + 2?", "The answer is 4.")]


def test_a_worked_example_shows_a_short_reply_that_still_scores_1():
    task = Task("t", "arithmetic", "What is 2 + 2?", "4", "final")
    assert cold_start.worked_answer("2 + 2 = 4.\nThen a long aside that the task model ran on with", task) == "2 + 2 = 4."
    assert cold_start.worked_answer("Let me think:\n2 + 2 =  4.", task) == "Let me think: 2 + 2 = 4."
    assert cold_start.worked_answer("So " * 100 + "4.", task) is None                     # too long to teach
    assert cold_start.worked_answer("It is 4. Because two and two make", task) == "It is 4."   # cut off: the sentences
    assert cold_start.worked_answer("Two and two make 4 when", task) is None                   # no full sentence
    outcome = Outcome("What is 2 + 2?", 1.0, "Let me think:\n2 + 2 = 4.")
    instance = Instance("x", "arithmetic", [task])
    history = [HistoryEntry(0, "", 1.0, [outcome])]
    prompt = loop.editor_messages(instance, "", 1.0, history, lambda m: 0, 10)[1]["content"]
    assert cold_start.worked_examples(prompt, history, [task]) == [("What is 2 + 2?", "Let me think: 2 + 2 = 4.")]


def test_targets_fit_a_small_budget_or_are_left_out(editor_dir):
    tok = Tokenizer.from_pretrained(editor_dir)
    count = lambda text: len(tok.encode(text.strip())) + 1   # noqa: E731
    skills = base_skills("qa")
    for budget in (60, 120, 200):
        targets = cold_start.make_targets("conversion", skills, "", [], count, budget)
        assert all(count(text) <= budget and parse_candidate(text, "conversion")[0] for _, text in targets)
    assert len(cold_start.make_targets("conversion", skills, "", [], count, 200)) > \
        len(cold_start.make_targets("conversion", skills, "", [], count, 12))
    assert cold_start.make_targets("conversion", skills, "", [], count, 12) == []


def test_sft_loss_falls_and_the_folder_loads_as_train_grpos_editor(run, editor_dir, tmp_path):
    out, rows, _, stdout = run
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics]
    assert len(losses) >= 4 and losses[-1] < losses[0] - 0.3, losses
    assert "val_loss" in metrics[-1] and (out / "loss.svg").is_file()
    args = train_grpo.parse_args(["--editor", str(out / "final"), "--out", str(tmp_path / "grpo"), "--device", "cpu",
                                  "--max-skill-tokens", "64"])
    editor, tokenizer, _ = run_setup.build_editor(args, None, args.editor)
    trained = load_file(out / "final" / "model.safetensors")
    start = load_file(editor_dir / "model.safetensors")
    assert any((trained[k] != start[k]).any() for k in start)
    assert str(out / "final") in stdout
    loop.check_config(editor, EvolveConfig(max_skill_tokens=64))


def test_resume_continues_on_the_saved_data_without_the_task_model(editor_dir, task_url, tmp_path):
    out = tmp_path / "run"
    code, _, stderr = run_main(flags(editor_dir, task_url, out, "--max-steps", "1", "--save-every", "1"))
    assert code == 0, stderr
    data = (out / cold_start.DATA_FILE).read_bytes()
    code, _, stderr = run_main(flags(editor_dir, task_url, out, "--resume", "--lr", "1e-3"))
    assert code != 0 and "--lr 0.005 -> 0.001" in str(code) + stderr                 # the saved run's flags rule
    code, stdout, stderr = run_main(["--out", str(out), "--resume", "--max-steps", "100",   # (the saved
                                     "--task-url", "http://127.0.0.1:9/v1"])   # one is 1); no server there: not called
    assert code == 0, stderr
    assert "resume: continuing from" in stdout and (out / "final").is_dir()
    assert (out / cold_start.DATA_FILE).read_bytes() == data
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, len(metrics) + 1)) and len(metrics) > 1


def test_resume_before_the_first_checkpoint_trains_from_step_0(editor_dir, task_url, tmp_path, monkeypatch):
    out = tmp_path / "run"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(cold_start.sft, "train_sft", killed)
        with pytest.raises(KeyboardInterrupt):
            run_main(flags(editor_dir, task_url, out))
    assert (out / cold_start.DATA_FILE).is_file() and not list(out.glob("checkpoint-*"))
    code, stdout, stderr = run_main(["--out", str(out), "--resume", "--max-steps", "1"])
    assert code == 0, stderr
    assert "no checkpoint yet: training from step 0" in stdout and (out / "checkpoint-1").is_dir()


def test_data_only_then_a_new_run_trains_on_those_chats_without_the_task_model(editor_dir, task_url, tmp_path):
    built, other = tmp_path / "built", tmp_path / "other"
    code, _, stderr = run_main(flags(editor_dir, task_url, built, "--max-steps", "0"))     # the data only
    assert code == 0, stderr
    assert not list(built.glob("checkpoint-*")) and not (built / "final").exists()
    data = (built / cold_start.DATA_FILE).read_bytes()
    code, stdout, stderr = run_main(flags(editor_dir, "http://127.0.0.1:9/v1", other,   # no server there: not called
                                          "--data", str(built / cold_start.DATA_FILE), "--lr", "1e-3"))
    assert code == 0, stderr
    assert "not rebuilt" in stdout and (other / "final").is_dir()
    assert (other / cold_start.DATA_FILE).read_bytes() == data
    saved = json.loads((other / cold_start.RUN_CONFIG).read_text())["args"]
    assert (saved["lr"], saved["data"]) == (1e-3, str(built / cold_start.DATA_FILE))


def test_a_bad_data_file_is_refused_naming_the_line(editor_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance": "x", "messages": [], "target": "t"}\n{"messages": []}\n')
    code, _, stderr = run_main(flags(editor_dir, "http://127.0.0.1:9/v1", tmp_path / "o", "--data", str(bad)))
    assert code == 2 and f"{bad}:2" in stderr and not (tmp_path / "o").exists()
    code, _, stderr = run_main(flags(editor_dir, "http://127.0.0.1:9/v1", tmp_path / "o", "--data",
                                     str(tmp_path / "absent.jsonl")))
    assert code == 2 and "no such file" in stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, message", [
    (["--max-skill-tokens", "0"], "--max-skill-tokens must be at least 1"),
    (["--batch-size", "3", "--micro-batch", "2"], "multiple of --micro-batch"),
    (["--val-fraction", "1"], "--val-fraction"),
    (["--max-instances", "0"], "--max-instances must be at least 1"),
])
def test_bad_flags_are_usage_errors(editor_dir, tmp_path, extra, message):
    code, _, stderr = run_main(flags(editor_dir, "http://127.0.0.1:9/v1", tmp_path / "o", *extra))
    assert code == 2 and message in stderr
    assert not (tmp_path / "o").exists()


def test_bad_runs_are_refused_before_anything_is_written(editor_dir, task_url, tmp_path, run):
    code, _, stderr = run_main(flags(editor_dir, task_url, tmp_path / "none", "--resume"))
    assert code != 0 and "nothing to resume" in stderr and not (tmp_path / "none").exists()
    code, _, stderr = run_main(flags(editor_dir, task_url, tmp_path / "s", "--suite", str(tmp_path / "absent.jsonl")))
    assert code == 2 and "absent.jsonl" in stderr and not (tmp_path / "s").exists()
    code, _, stderr = run_main(flags(editor_dir, task_url, tmp_path / "t", "--max-skill-tokens", "8"))
    assert code == 2 and "raise it" in stderr and not (tmp_path / "t").exists()
    before = (run[0] / cold_start.DATA_FILE).read_bytes()
    code, _, stderr = run_main(flags(editor_dir, task_url, run[0]))                # a rerun on a finished run
    assert code != 0 and (run[0] / cold_start.DATA_FILE).read_bytes() == before


def test_defaults_are_train_grpos():
    d = asdict(train_grpo.TrainConfig())
    assert {k: d[k] for k in cold_start.DEFAULTS} == cold_start.DEFAULTS
    args = cold_start.parse_args(["--out", "x"])
    assert all(getattr(args, k) == d[k] for k in ("max_skill_tokens", "context_tokens", "task_max_tokens", "rollouts",
                                                  "task_temperature", "editor", "suite", "seed_skills", "seed"))
