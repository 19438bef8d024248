"""GAIA as GAIA's users run it: a metadata.jsonl in GAIA's own format (task_id, Question, Level, Final answer,
file_name, Annotator Metadata) loads with GAIA's system prompt and each task's file in its prompt, and a reply
ending "FINAL ANSWER: X" is scored by GAIA's scorer on X; `--skills base` gives GAIA's base skills."""
import json
import os
import re
import warnings

import pytest

from minskill import rollout
from minskill.rollout import SkillsNotFound, load_skills, load_trajectories
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.tasks import GAIA_PROMPT, TaskWarning, load_suite

# Five tasks as GAIA's metadata.jsonl holds them (the validation split's fields; Level a number; file_name ""
# when there is no file); the third comes with a CSV file beside the JSONL.
GAIA_ROWS = [
    {"task_id": "c61d22de-5f6c-4958-a7f6-5e9707bd3466", "Question": "How many legs do 4 spiders and 1 ant have "
     "together?", "Level": 1, "Final answer": "38", "file_name": "",
     "Annotator Metadata": {"Steps": "1. 4*8 + 6", "Number of steps": "1", "How long did this take?": "1 minute",
                            "Tools": "None", "Number of tools": "0"}},
    {"task_id": "17b5a6a3-bc87-42e8-b0fb-6ab0781ef2cc", "Question": "Which city is the capital of France?",
     "Level": 1, "Final answer": "Paris", "file_name": "", "Annotator Metadata": {"Steps": "recall"}},
    {"task_id": "04a04a9b-226c-43fd-b319-d5e89743676f", "Question": "The attached spreadsheet lists the sales of a "
     "shop. What were the total sales of apples?", "Level": 2, "Final answer": "17",
     "file_name": "04a04a9b-226c-43fd-b319-d5e89743676f.csv", "Annotator Metadata": {"Steps": "sum the column"}},
    {"task_id": "14569e28-c88c-43e4-8c32-097d35b9a67d", "Question": "List the first three prime numbers.",
     "Level": 2, "Final answer": "2, 3, 5", "file_name": "", "Annotator Metadata": {"Steps": "recall"}},
    {"task_id": "e1fc63a2-da7a-432f-be78-7c4a95598703", "Question": "How many hours are in 3 days?", "Level": 3,
     "Final answer": "72", "file_name": "", "Annotator Metadata": {"Steps": "3*24"}},
]
SALES_CSV = "fruit,sales\napple,9\npear,4\napple,8\n"


def write_gaia(folder, rows=GAIA_ROWS, with_file=True):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metadata.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    if with_file:
        (folder / GAIA_ROWS[2]["file_name"]).write_text(SALES_CSV, encoding="utf-8")
    return path


def oracle(style):
    """A scripted task model that knows every answer: finds the question in the prompt, answers in `style`."""
    answers = {row["Question"]: row["Final answer"] for row in GAIA_ROWS}

    def answer(messages, request):
        prompt = messages[-1]["content"]
        truth = next(a for q, a in answers.items() if q in prompt)
        return style.format(truth)
    return answer


@pytest.mark.parametrize("style, expected", [
    ("Let me work it out step by step.\nFINAL ANSWER: {}", 1.0),   # GAIA's template: 5/5 (it was 0/5)
    ("{}", 1.0),                                                    # no template: the whole reply is scored
    ("final answer: maybe\nFINAL ANSWER: {}\n", 1.0),              # the last template counts
    ("The answer is {}.", 0.0),                                     # GAIA's scorer: not a bare answer
    ("**FINAL ANSWER:** {}", 1.0),                                  # bold (it was "** 17": 0)
    ("Final answer: `{}`\nThe rest of the reply explains it.", 1.0),   # code, then a line of prose
])
def test_an_oracle_scores_on_gaia_metadata_as_gaia_scores_it(tmp_path, style, expected):
    suite = write_gaia(tmp_path / "2023" / "validation")
    seen = []

    def model(messages, request):
        seen.append(messages)
        return oracle(style)(messages, request)

    with start_server(ScriptedBackend(model)) as server:
        client = server.client(max_retries=0)
        out = tmp_path / "run"
        assert rollout.main(["--suite", str(suite), "--split", "all", "--task-url", client.base_url,
                             "--task-model", client.model, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 5 and summary["success_rate"] == expected
    assert sorted(summary["per_type"]) == ["level1", "level2", "level3"]
    prompts = [m[-1]["content"] for m in seen]
    assert all(p.startswith(GAIA_PROMPT) for p in prompts)   # GAIA's system prompt opens every task prompt
    assert "FINAL ANSWER: [YOUR FINAL ANSWER]" in GAIA_PROMPT
    with_file = [p for p in prompts if "spreadsheet" in p]
    assert len(with_file) == 1 and SALES_CSV.strip() in with_file[0] and GAIA_ROWS[2]["file_name"] in with_file[0]
    assert {t.task_id for t in load_trajectories(out / "trajectories.jsonl")} == {r["task_id"] for r in GAIA_ROWS}


def test_a_missing_file_is_a_warning_naming_the_task(tmp_path):
    suite = write_gaia(tmp_path, with_file=False)
    with pytest.warns(TaskWarning, match=rf"metadata.jsonl:3: task {GAIA_ROWS[2]['task_id']}: its file "
                                         rf"'{GAIA_ROWS[2]['file_name']}' is not in"):
        tasks = load_suite(str(suite), split="all")
    assert "not available" in tasks[2].prompt and GAIA_ROWS[2]["file_name"] in tasks[2].prompt
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)   # the others have no file: no warning for them
        load_suite(str(write_gaia(tmp_path / "ok")), split="all")


def test_text_files_are_inlined_within_the_budget_and_other_files_are_named(tmp_path):
    from minskill.tasks.qa import load_jsonl
    rows = [dict(GAIA_ROWS[0], task_id="long", file_name="notes.txt"),
            dict(GAIA_ROWS[1], task_id="image", file_name="photo.png"),
            dict(GAIA_ROWS[3], task_id="below", file_name="files/list.md")]
    suite = write_gaia(tmp_path, rows, with_file=False)
    (tmp_path / "notes.txt").write_text("é" * 50 + "x" * 200, encoding="utf-8")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "list.md").write_text("- 2\n- 3\n- 5\n")
    long, image, below = load_jsonl(suite, file_chars=60)
    assert "é" * 50 + "x" * 10 + "\n```" in long.prompt and "x" * 11 not in long.prompt
    assert "first 60 characters" in long.prompt
    assert "photo.png (108 bytes; not a text file" in image.prompt and "PNG" not in image.prompt
    assert "- 2\n- 3\n- 5\n```" in below.prompt


@pytest.mark.parametrize("file_name", ["../secret.txt", "/etc/passwd", "link.txt", ".", "sub/../../secret.txt"])
def test_a_file_name_outside_the_folder_is_refused_naming_the_line(tmp_path, file_name):
    (tmp_path / "secret.txt").write_text("do not read")
    folder = tmp_path / "suite"
    folder.mkdir()
    os.symlink(tmp_path / "secret.txt", folder / "link.txt")
    suite = write_gaia(folder, [GAIA_ROWS[0], dict(GAIA_ROWS[1], file_name=file_name)], with_file=False)
    with pytest.raises(ValueError, match=r"metadata.jsonl:2: file_name .* is not a file inside"):
        load_suite(str(suite), split="all")


def test_plain_tasks_keep_their_prompt_and_gaia_verified_ones_get_gaia_s(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "What is 2 + 2?", "answer": "4"}) + "\n"
                    + json.dumps({"id": "b", "question": "Capital of Peru?", "answer": "Lima", "verifier": "gaia"})
                    + "\n")
    plain, gaia = load_suite(str(path), split="all")
    assert (plain.question, plain.prompt) == ("What is 2 + 2?", "")   # its question is its prompt
    assert gaia.prompt == GAIA_PROMPT + "\n\nCapital of Peru?" and gaia.score("Hmm.\nFINAL ANSWER: lima") == 1.0
    assert gaia.question == "Capital of Peru?"   # what retrieval, teachers and editors quote
    builtin = load_suite("qa", split="heldout", n=8)   # the built-in suite: prompts and verifier as before
    assert all(t.verifier == "final" and t.prompt == "" for t in builtin)


def test_base_skills_of_a_gaia_file_ask_for_gaia_s_format(tmp_path):
    suite = write_gaia(tmp_path)
    for spec in (str(suite), os.path.relpath(suite)):   # absolute (was a traceback) and relative (FileNotFound)
        skills = load_skills("base", spec)
        assert sorted(skills.task_specific) == ["level1", "level2", "level3"]
        assert "FINAL ANSWER: [YOUR FINAL ANSWER]" in rollout.skill_text(skills, "level2")


def test_base_skills_of_a_file_whose_types_have_none_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "a", "type": "sum", "question": "1 + 1?", "answer": "2"}) + "\n"
                    + json.dumps({"id": "b", "type": "secret", "question": "The secret?", "answer": "7"}) + "\n")
    with pytest.raises(SkillsNotFound, match=rf"{path}: no built-in base skills for its task types \(sum, secret\)"):
        load_skills("base", str(path))
    with pytest.raises(SystemExit) as exit_info:   # the evaluation command: a usage error, no traceback
        rollout.main(["--suite", str(path), "--skills", "base", "--task-url", "http://127.0.0.1:9/v1",
                      "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert "no built-in base skills for its task types (sum, secret)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_base_skills_of_a_file_with_built_in_types_are_theirs(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"id": "a", "type": "arithmetic", "question": "What is 1 + 2?", "answer": "3"}) + "\n"
                    + json.dumps({"id": "b", "type": "mine", "question": "The secret?", "answer": "7"}) + "\n")
    skills = load_skills("base", str(path))
    assert list(skills.task_specific) == ["arithmetic"]
    assert [s.name for s in skills.general] == ["final-answer-line"]   # the qa suite's general skill
    assert skills.task_specific["arithmetic"] == load_skills("base", "qa").task_specific["arithmetic"]


def test_evolve_masa_starts_a_gaia_file_from_gaia_s_base_skills(tmp_path):
    import evolve_masa
    suite = write_gaia(tmp_path)
    skills = evolve_masa.load_base_skills(evolve_masa.build_parser().parse_args(["--suite", str(suite)]))
    assert sorted(skills.task_specific) == ["level1", "level2", "level3"]
    assert [s.name for s in skills.general] == ["final-answer-template"]


def test_train_grpo_seed_skills_base_without_base_skills_is_a_usage_error(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from tiny import make_tiny_model_dir
    editor = make_tiny_model_dir(tmp_path / "editor", family="llama", chat_format="chatml",
                                 max_position_embeddings=1024)
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "type": "sum", "question": f"{i} + 1?", "answer": str(i + 1)})
                            + "\n" for i in range(8)))
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "train_grpo.py"), "--editor", str(editor), "--suite", str(path),
                           "--seed-skills", "base", "--tasks-per-instance", "2", "--task-url", "http://127.0.0.1:9/v1",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "no built-in base skills for its task types (sum)" in done.stderr


# --------------------------------------------------------------------------- GAIA's test split

def hide(rows, keep=()):
    """The rows as GAIA's test split gives them: "Final answer" "?" but in those of ids in keep."""
    return [row if row["task_id"] in keep else dict(row, **{"Final answer": "?"}) for row in rows]


def test_the_test_split_is_answered_not_scored_and_written_for_the_leaderboard(tmp_path, capsys):
    kept = {GAIA_ROWS[0]["task_id"], GAIA_ROWS[1]["task_id"]}   # two with answers: those are scored
    suite = write_gaia(tmp_path / "2023" / "test", hide(GAIA_ROWS, kept))

    def model(messages, request):   # the first sample answers right (bold, as instruct models do)
        reply = oracle("Thinking.\n**FINAL ANSWER:** {}")(messages, request)
        return ("I reasoned.", reply if request.sample_index == 0 else "FINAL ANSWER: wrong")

    with start_server(ScriptedBackend(model)) as server:
        client = server.client(max_retries=0)
        out = tmp_path / "run"
        argv = ["--suite", str(suite), "--split", "all", "--skills", "base", "--n", "2",
                "--temperature", "1", "--task-url", client.base_url, "--task-model", client.model,
                "--out", str(out)]
        assert rollout.main(argv) == 0
        first = (out / "submission.jsonl").read_text()
        assert rollout.main(argv + ["--resume"]) == 0   # nothing left to run: the same file again
    assert (out / "submission.jsonl").read_text() == first
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 4 and summary["success_rate"] == 0.5   # the two kept tasks' samples only
    assert "hidden answers" in capsys.readouterr().err
    lines = [json.loads(line) for line in first.splitlines()]
    hidden = sorted((r for r in GAIA_ROWS if r["task_id"] not in kept), key=lambda r: r["task_id"])
    assert [line["task_id"] for line in lines] == [row["task_id"] for row in hidden]   # one a task
    assert [line["model_answer"] for line in lines] == [row["Final answer"] for row in hidden]
    assert all(line["reasoning_trace"].startswith("I reasoned.\n\nThinking.\n**FINAL ANSWER:** ")
               for line in lines)
    assert all(t.error is None for t in load_trajectories(out / "trajectories.jsonl"))


@pytest.mark.parametrize("answer, shown", [("?", "'?'"), ("", "''"),
                                           (None, "missing field 'Final answer'")])
def test_a_hidden_answer_is_refused_where_it_would_be_scored(tmp_path, answer, shown):
    row = {k: v for k, v in GAIA_ROWS[1].items() if k != "Final answer"}
    if answer is not None:
        row["Final answer"] = answer
    suite = write_gaia(tmp_path, [GAIA_ROWS[0], row])
    with pytest.raises(ValueError, match=rf"metadata.jsonl:2: {re.escape(shown)}: the answer of "
                                         rf"task {row['task_id']} is hidden .* GAIA's leaderboard"):
        load_suite(str(suite), split="all")   # what training, searches and their evaluations call
    tasks = load_suite(str(suite), split="all", hidden_answers=True)
    assert tasks[1].answer is None and tasks[0].answer == GAIA_ROWS[0]["Final answer"]
    with pytest.raises(ValueError, match="no reference answer"):
        tasks[1].score("")   # a blank reply never scores 1 against it (GAIA's scorer: 1)


def test_a_plain_line_of_the_gaia_verifier_with_answer_question_mark_is_hidden_too(tmp_path):
    path = tmp_path / "plain.jsonl"
    line = {"id": "a", "question": "Q?", "answer": "?", "verifier": "gaia"}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"plain.jsonl:1: '\?': the answer of task a is hidden"):
        load_suite(str(path), split="all")
    assert load_suite(str(path), split="all", hidden_answers=True)[0].answer is None
