"""The edit-provenance report (minskill/report/__main__.py) on small scripted runs built here: a train_grpo.py run (tiny
random editor, scripted task model over HTTP) with and without the lineage record, its --eval folder, an
evolve_masa.py run (scripted target and teacher), a rewrite.py --compare folder and a rewriter SFT folder; the
cost per role each records (and the "not recorded" lines of folders written before it was). Checks what each page
shows, that run text is escaped, that the UCB1 replay equals what the search's tree saw, the errors for folders that
are not runs and for malformed lines, and, where a headless Chromium is installed, that each page loads with
no console message (its Content-Security-Policy turns any script or fetch into one) and gives a screenshot."""
import io
import json
import os
import re
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import evolve_masa
import train_grpo
from helpers import (CHROMIUM, KEYWORDS, XSS, assert_self_contained_and_escaped, browse, keyword_task_model,
                     scripted_search, skill, target_fn, teacher_fn, write_keyword_suite, write_suite)
from minskill.masa import search as masa, teacher as masa_teacher, ucb
from minskill.report import __main__ as report, html as report_html, provenance
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet
from tiny import make_tiny_model_dir


XSS_ATTR = '"><img src=x onerror=alert(2)>'


def quiet(fn, *args):
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return fn(*args)


def page_of(folder: Path, tmp: Path, name: str) -> str:
    path = report.write_report(folder, tmp / f"{name}.html")
    return path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------- scripted runs

@pytest.fixture(scope="module")
def skill_r1_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("skill_r1")
    editor = make_tiny_model_dir(tmp / "editor", family="llama", chat_format="chatml", max_position_embeddings=1024)
    suite = write_keyword_suite(tmp / "keywords.jsonl", heldout=10)   # --eval's 1 x (4 + 2) and the probe's 4
    seed = tmp / "seed.txt"
    seed.write_text(f"Say yes. {XSS} It is about th.\n")      # holds KEYWORDS "is" and "th": solves tasks 0 and 3
    with start_server(ScriptedBackend(keyword_task_model, name="keywords")) as server:
        yield {"tmp": tmp, "flags": ["--editor", str(editor), "--task-url", server.url, "--suite", str(suite),
                                     "--seed-skills", str(seed), "-G", "2", "-K", "3", "--tasks-per-instance", "4",
                                     "--instances-per-step", "1", "--max-skill-tokens", "12", "--task-max-tokens",
                                     "4", "--steps", "2", "--save-every", "2", "--probe-every", "1",
                                     "--probe-instances", "1", "--probe-candidates", "2", "--eval-instances", "1",
                                     "--eval-tasks", "2"]}


@pytest.fixture(scope="module")
def skill_r1_run(skill_r1_env):
    out = skill_r1_env["tmp"] / "run"
    assert quiet(train_grpo.main, skill_r1_env["flags"] + ["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def skill_r1_lineage_run(skill_r1_env):
    """The same run, with the evolutions the loop produced kept aside to check lineage.jsonl against."""
    out = skill_r1_env["tmp"] / "run-lineage"
    original, evolutions_seen = train_grpo.metrics_row, []

    def metrics_row_and_lineage(step, evolutions, *rest):
        evolutions_seen.append(evolutions)
        return original(step, evolutions, *rest)

    train_grpo.metrics_row = metrics_row_and_lineage
    try:
        assert quiet(train_grpo.main, skill_r1_env["flags"] + ["--out", str(out)]) == 0
    finally:
        train_grpo.metrics_row = original
    return out, evolutions_seen


@pytest.fixture(scope="module")
def eval_run(skill_r1_env, skill_r1_run):
    """train_grpo.py --eval of the trained editor (and the frozen one) on the same scripted task model."""
    out = skill_r1_env["tmp"] / "eval"
    flags = skill_r1_env["flags"] + ["--eval", "--skillr1-editor", str(skill_r1_run / "checkpoint"),
                                     "--eval-instances", "1", "--eval-tasks", "2", "--out", str(out)]
    assert quiet(train_grpo.main, flags) == 0
    return out


SECRET_REWRITES = []


def xss_teacher(messages, request):
    """helpers.teacher_fn, but its attribution carries hostile text into the page, and its first two
    rewrites of the `secret` skills miss the key (so the tree grows past the root and UCB1 picks a child)."""
    prompt = messages[1]["content"]
    if masa_teacher.ATTRIBUTION_TASK in prompt:
        return json.dumps({"failure_categories": [{"category": f"missing key {XSS}", "count": 3,
                                                   "evidence": [XSS_ATTR], "suggested_fix": "give the key"}],
                           "summary": XSS})
    if masa_teacher.TASK_REWRITE_TASK in prompt and "of type 'secret'" in prompt:
        SECRET_REWRITES.append(1)
        if len(SECRET_REWRITES) <= 2:
            return SkillSet(general=[], task_specific={"secret": [skill(f"secret-try-{len(SECRET_REWRITES)}",
                                                                        "Guess a number.")]},
                            common_mistakes=[]).to_markdown()
    return teacher_fn(messages, request)


@pytest.fixture(scope="module")
def masa_run(tmp_path_factory):
    return scripted_masa_run(tmp_path_factory.mktemp("masa"))


def scripted_masa_run(tmp: Path) -> Path:
    """evolve_masa.py on helpers.write_suite's suite with xss_teacher; returns the run folder (also what made
    docs/figures/report_screenshot.png, with XSS and XSS_ATTR set to plain text)."""
    SECRET_REWRITES.clear()
    suite = write_suite(tmp / "suite.jsonl")
    base = SkillSet(general=[skill("be-helpful", f"Answer the question. {XSS}")],
                    task_specific={"secret": [skill("secret-base", "Think about the name.")]}, common_mistakes=[])
    base.save_json(tmp / "base.json")
    with start_server(ScriptedBackend(target_fn, name="target")) as target, \
            start_server(ScriptedBackend(xss_teacher, name="teacher", max_context=100000)) as teacher:
        argv = ["--suite", str(suite), "--base-skills", str(tmp / "base.json"), "--n-train", "12", "--n-prelim", "2",
                "--n-heldout", "8", "--task-url", target.url, "--task-model", "target", "--teacher-url",
                teacher.url, "--teacher-model", "teacher", "--iterations", "3", "--patience", "2",
                "--tree-iterations", "4", "--max-children", "2", "--episodes", "4", "--task-concurrency", "4",
                "--out", str(tmp / "run")]
        assert quiet(evolve_masa.main, argv) == 0
    return tmp / "run"


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory):
    """What `rewrite.py apply --compare` writes: its own compare() on a scripted task model and teacher."""
    import rewrite
    tmp = tmp_path_factory.mktemp("compare")
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i),
                                         "type": "sum" if i < 2 else "unit"}) + "\n" for i in range(4)))
    teacher_set = {"general_skills": [{"skill_id": "tip", "title": "Tip", "principle": "Sum tip.",
                                       "when_to_apply": "Always."}]}

    def script(messages, request):
        if "## Task:" in messages[-1]["content"]:
            return json.dumps(teacher_set)
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        i = int(messages[-1]["content"].split()[2])
        solved = "Carry the one." in system or ("Sum tip." in system and i < 2)
        return f"The answer is {2 * i}." if solved else f"I am not sure {XSS}."

    skills_in = SkillSet(general=[skill("plain", f"Add. {XSS}")], task_specific={}, common_mistakes=[])
    rewritten = SkillSet(general=[skill("plain", "Add. Carry the one.")], task_specific={}, common_mistakes=[])
    with start_server(ScriptedBackend(script)) as server:
        args = rewrite.build_parser().parse_args(
            ["apply", "--rewriter", "tiny-rewriter", "--model-card", "card.json", "--skills", "in.json", "--task",
             "Sums.", "--out", str(tmp / "adapted"), "--compare", "--suite", str(tasks), "--split", "all",
             "--task-url", server.url, "--task-max-tokens", "16"])
        assert quiet(rewrite.compare, args, {"name": "alpha"}, skills_in, rewritten) == 0
    return tmp / "adapted-compare"


# ---------------------------------------------------------------------------------------------- the pages

def test_skill_r1_training_report_costs_and_a_missing_lineage(skill_r1_run, tmp_path):
    """The training page: curves, the cost per role summed from metrics.jsonl, probes and flags. lineage.jsonl,
    which every training run writes when it starts, missing is an error naming it (no page of a folder from
    before it existed: there was no release)."""
    text = page_of(skill_r1_run, tmp_path, "skill_r1")
    assert_self_contained_and_escaped(text)
    assert text.count("<svg") >= 2 and "mean candidate reward per generation" in text and "policy loss" in text
    assert "Cost per role" in text and "task model (training rollouts)" in text and "Skill-R1 has no teacher" in text
    assert "not recorded by this run" not in text
    assert "Held-out probes" in text and "--generations" in text      # probes; flags from trainer_state.pt
    rows = [json.loads(line) for line in (skill_r1_run / "metrics.jsonl").read_text().splitlines()]
    calls = sum(r["task_calls"] for r in rows)
    assert re.search(rf'<td class="num">{calls}</td>', text)           # the cost table sums the recorded calls
    tokens = sum(r["task_prompt_tokens"] + r["task_completion_tokens"] for r in rows)
    assert re.search(rf'<td class="num">{tokens}</td>', text) and "editor: sampling</td>" in text
    older = tmp_path / "older-run"
    shutil.copytree(skill_r1_run, older)
    (older / "lineage.jsonl").unlink()
    with pytest.raises(provenance.NotARun, match=re.escape(f"{older / 'lineage.jsonl'}: missing")):
        provenance.load_run(older)


def test_skill_r1_lineage_report(skill_r1_lineage_run, tmp_path):
    out, evolutions_seen = skill_r1_lineage_run
    records = provenance.read_rows(out / "lineage.jsonl", ("step", "instance", "skills", "carried"))
    assert len(records) == 2 and [r["step"] for r in records] == [0, 1]
    for record, (ev,) in zip(records, evolutions_seen):
        by_id = {s["id"]: s for s in record["skills"]}
        assert len(record["skills"]) == 1 + 2 * 3 and len(record["carried"]) == 3
        assert by_id[record["carried"][-1]]["reward"] == ev.final_reward
        assert [s["parent"] for s in record["skills"] if s["generation"] == 2] == [record["carried"][1]] * 3
        seed = by_id["g0"]["text"]       # the scripted task model says yes to task k when KEYWORDS[k] is in the skill
        assert by_id["g0"]["task_scores"] == [float(KEYWORDS[int(t.question[-1])] in seed) for t in ev.instance.tasks]
        assert record["editor_prompts"][1]["history"] == ["g1.2", "g1.1", "g1.0", "g0"]
    text = page_of(out, tmp_path, "skill_r1_lineage")
    assert_self_contained_and_escaped(text)
    assert "not recorded by this run (lineage.jsonl" not in text
    assert "Skill lineage (each instance, generation by generation)" in text
    assert text.count('class="card') >= 14 and "carried" in text and "gained " in text and "lost " in text
    assert "@@" in text or "identical to its parent" in text           # diffs against the parent


def test_masa_report_shows_climb_trees_and_every_edit(masa_run, tmp_path):
    state = json.loads((masa_run / "state.json").read_text())
    cands = state["search"]["candidates"]
    search_tasks = {c["task_id"] for c in cands[0]["failures"]}
    assert set(cands[0]["metrics"]["task_rewards"]) >= search_tasks and len(cands[0]["metrics"]["task_rewards"]) == 12
    text = page_of(masa_run, tmp_path, "masa")
    assert_self_contained_and_escaped(text)
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in text      # attribution evidence, escaped
    assert "Hill climbing on the general skills" in text and "accepted" in text and "rejected" in text
    assert "tree secret:" in text and "★ chosen" in text and "UCB1 at selection" in text
    assert "Why: the teacher&#x27;s failure attribution" in text and "give the key" in text
    assert "failed episodes of parent #0" in text and "What is the secret number of" in text
    assert "+KEY-GENERAL" in text or "+State the final" in text or 'class="add"' in text
    assert "gained 6" in text                                          # the general rewrite solves the 6 sums
    assert "Held-out: base vs evolved skills" in text and "Cost per role" in text
    usage = json.loads((masa_run / "run.json").read_text())["usage"]     # tokens and seconds per role, recorded
    for role in ("target", "teacher"):
        u = usage[role]
        assert re.search(rf'<td class="num">{u["calls"]}</td><td class="num">'
                         rf'{u["prompt_tokens"] + u["completion_tokens"]}</td>', text), role
    assert f"{usage['target']['cache_hits']} answered by the cache at no call, token or second" in text
    assert "tokens and seconds per role" not in text and "session(s)" in text


def test_masa_report_of_an_interrupted_or_older_run(masa_run, tmp_path):
    """No run.json / results.json (the run stopped early), no metrics.task_rewards (a run of an earlier version),
    or no search at all: the page says what is missing instead of failing."""
    old = tmp_path / "old"
    shutil.copytree(masa_run, old)
    for name in ("run.json", "results.json"):
        (old / name).unlink()
    state = json.loads((old / "state.json").read_text())
    for x in state["search"]["candidates"]:
        x["metrics"].pop("task_rewards", None)
    (old / "state.json").write_text(json.dumps(state))
    text = page_of(old, tmp_path, "old")
    assert "not recorded by this run (metrics.task_rewards)" in text and "run.json (the run did not finish)" in text
    assert "the cost per role is state.json" in text and "tokens and seconds per role" not in text
    state.pop("usage")                       # every state.json holds it: its absence is an error naming it
    (old / "state.json").write_text(json.dumps(state))
    with pytest.raises(provenance.NotARun, match="state.json.*usage"):
        page_of(old, tmp_path, "older")
    state["usage"] = {}
    assert "results.json has no held-out table" in text and "tree secret:" in text
    state["search"] = None
    (old / "state.json").write_text(json.dumps(state))
    assert "no tree yet" in page_of(old, tmp_path, "empty")
    (old / "state.json").write_text('{"args": {}, "search": {"candidates": [')
    with pytest.raises(provenance.NotARun, match="state.json: not valid JSON"):
        report.write_report(old, tmp_path / "broken.html")


def test_ucb1_replay_equals_what_the_search_saw(monkeypatch):
    seen, original = [], ucb.select

    def spy(root, c=1.4, max_children=None):
        node = original(root, c, max_children)
        seen.append((node.id, None if node.parent is None else ucb.ucb_score(node, c)))
        return node

    monkeypatch.setattr(ucb, "select", spy)
    # the search's own tree iterations (MasaSearch.tree_iteration); rewrite k scores ((k + 1) * 37 % 11) / 11 < 1
    search = scripted_search([((k + 1) * 37 % 11) / 11 for k in range(12)], 0.0, iterations=0, tree_iterations=12,
                             c=0.9, max_children=2)
    list(search.run())
    root = search.trees["qa"].root
    selections, visits = provenance.replay_ucb1(search.to_json()["trees"]["qa"]["root"], 0.9)
    replayed = sorted((node_id, v) for node_id, values in selections.items() for v in values)
    assert len(replayed) == 12
    assert [(i, None if v is None else round(v, 9)) for i, v in replayed] == \
           [(i, None if v is None else round(v, 9)) for i, v in sorted(seen)]
    assert visits == {n.id: n.visits for n in ucb.iter_nodes(root)}


def test_compare_report(compare_run, tmp_path):
    text = page_of(compare_run, tmp_path, "compare")
    assert_self_contained_and_escaped(text)
    assert "teacher one-shot" in text and "rewritten" in text
    assert "input → rewritten" in text and "gained 4" in text          # the rewritten skills solve all 4
    assert "+- Carry the one." in text or "Carry the one." in text
    costs = json.loads((compare_run / "compare.json").read_text())["costs"]
    assert costs["task model"]["calls"] == 3 * 4 and costs["teacher (one-shot)"]["calls"] == 1
    for role in ("task model", "teacher (one-shot)"):
        u = costs[role]
        assert re.search(rf'<td>{re.escape(role)}</td><td class="num">{u["calls"]}</td><td class="num">'
                         rf'{u["prompt_tokens"] + u["completion_tokens"]}</td>', text), role
    assert "compare.json holds none" not in text
    older = tmp_path / "older-compare"
    shutil.copytree(compare_run, older)
    record = json.loads((older / "compare.json").read_text())
    record.pop("costs")
    (older / "compare.json").write_text(json.dumps(record))
    assert "compare.json holds none" in page_of(older, tmp_path, "older_compare")


def test_eval_report(eval_run, tmp_path):
    """The --eval folder round-trips into its page: the table and the paired table as eval.json holds them,
    per instance each row's skill, score and tasks gained / lost against no skill, and the cost per role."""
    record = json.loads((eval_run / "eval.json").read_text())
    assert provenance.load_run(eval_run)["kind"] == "skill-r1-eval"
    text = page_of(eval_run, tmp_path, "eval")
    assert_self_contained_and_escaped(text)                 # the seed skill holds XSS
    assert "Skill-R1 evaluation (train_grpo.py --eval)" in text and "not recorded by this run" not in text
    names = [r["name"] for r in record["rows"]]
    assert names[0] == "no skill" and names[2].startswith("Skill-R1 inference-only") and len(names) == 4
    for row in record["rows"]:
        assert f"<td>{report_html.esc(row['name'])}</td><td class=\"num\">{row['success']:.3f}</td>" in text
    for c in record["paired"]:
        assert f"<td class=\"num\">{c['p']:.3f}</td><td>{c['per_task_gained']} / {c['per_task_lost']}</td>" in text
    assert "p (sign-flip, by instance)" in text and "per task: gained / lost" in text
    assert len(record["paired"]) == 3 + 2
    assert text.count("instance heldout-") == len(record["instances"]) == 1        # --eval-instances 1
    assert text.count("the baseline of gained / lost") == 1 and text.count("of 2 tasks scored on both") == 3
    assert "what the editor wrote (2 generations)" in text
    u = record["usage"]
    assert re.search(rf'<td class="num">{u["calls"]}</td><td class="num">{u["prompt_tokens"] + u["completion_tokens"]}'
                     rf'</td>', text)
    assert text.count("<td>editor: ") == 2                    # the two editor rows' sampling cost


def test_rewriter_sft_report(tmp_path):
    run = tmp_path / "rewriter"
    run.mkdir()
    (run / "run_config.json").write_text(json.dumps({"command": "python rewrite.py train x", "base_model": XSS}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s, "target_tokens": 10}) + "\n"
                                               for s in range(1, 5)) + '{"step": 5, "lo')   # a torn last line
    text = page_of(run, tmp_path, "rewriter")
    assert_self_contained_and_escaped(text)
    assert "rewriter SFT: target-token loss" in text and '<td class="num">40</td>' in text
    assert "seconds per step (metrics.jsonl holds tokens per second" in text
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s, "target_tokens": 10,
                                                           "seconds": 1.25}) + "\n" for s in range(1, 5)))
    text = page_of(run, tmp_path, "rewriter_timed")
    assert "seconds per step" not in text and '<td class="num">5.0</td>' in text


def test_not_a_run_and_malformed_lines_are_clear_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("hi")
    assert report.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "not a run folder" in err and "metrics.jsonl" in err and "state.json" in err
    assert "compare.json" in err and "notes.txt" in err and "eval.json (train_grpo.py --eval)" in err
    assert report.main([str(tmp_path / "missing")]) == 2 and "no such folder" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"step": 0, "reward_per_generation": [0.5]}\n{oops\n{"step": 2}\n')
    assert report.main([str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"{bad / 'metrics.jsonl'}:2" in err and not (tmp_path / "r.html").exists()
    (bad / "metrics.jsonl").write_text('{"step": 0, "reward_per_generation": [0.5]}\n[1, 2]\n{"step": 2}\n')
    assert report.main([str(bad)]) == 2 and f"{bad / 'metrics.jsonl'}:2: expected a JSON object" in capsys.readouterr().err
    (bad / "metrics.jsonl").write_text('{"step": 0}\n')
    assert report.main([str(bad)]) == 2 and "lacks field(s) reward_per_generation" in capsys.readouterr().err


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _edit_first_line(path: Path, edit) -> None:
    lines = path.read_text().splitlines()
    row = json.loads(lines[0])
    edit(row)
    path.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")


@pytest.mark.parametrize("run, file, edit, names", [
    ("skill-r1", "metrics.jsonl:1", lambda row: row.update(reward_per_generation="abc"),
     "field reward_per_generation: expected a list, got the string 'abc'"),
    ("skill-r1", "metrics.jsonl:1", lambda row: row["probes"][0].update(reward_per_generation=[]),
     "field probes[0].reward_per_generation: expected a list of at least one item"),
    ("skill-r1", "lineage.jsonl:1", lambda row: row.update(skills="abc"), "field skills: expected a list"),
    ("skill-r1", "lineage.jsonl:1", lambda row: row["skills"][1].update(reward=None),
     "field skills[1].reward: expected a number, got null"),
    ("masa", "state.json", lambda state: state["search"]["candidates"].__setitem__(0, None),
     "field search.candidates[0]: expected an object, got null"),
    ("masa", "state.json", lambda state: state.update(search="x"),
     "field search: expected null or an object, got the string 'x'"),
    ("masa", "state.json", lambda state: state.pop("args"), "not an evolve_masa.py state (no 'args')"),
    ("masa", "state.json", lambda state: next(iter(state["search"]["trees"].values()))["root"]["children"][0]
     .update(visits="many"), "root.children[0]: field visits: expected null or an integer, got the string 'many'"),
    ("masa", "results.json", lambda results: results.update(heldout=5),
     "field heldout: expected null or an object, got the number 5"),
    ("compare", "compare.json", lambda compare: compare["results"].update(input=[]),
     "field results['input']: expected an object, got a list of 0"),
])
def test_a_run_file_of_the_wrong_shape_is_an_error_naming_file_and_field(skill_r1_lineage_run, masa_run, compare_run,
                                                                       tmp_path, capsys, run, file, edit, names):
    """A hand-edited or damaged run file: exit 2 and a message naming FILE (:LINE) and the field, no traceback,
    no page (each used to be a TypeError or AttributeError deep in the renderer)."""
    folder = tmp_path / "run"
    shutil.copytree({"skill-r1": skill_r1_lineage_run[0], "masa": masa_run, "compare": compare_run}[run], folder)
    name, _, line = file.partition(":")
    (_edit_first_line if line else _edit_json)(folder / name, edit)
    assert report.main([str(folder), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"{folder / file}: " in err and names in err, err
    assert not (tmp_path / "r.html").exists()


def test_the_report_reads_no_file_linked_from_outside_the_run(skill_r1_run, tmp_path, capsys):
    """metrics.jsonl a symbolic link to a file outside the run folder: refused naming it, nothing of it on a page
    (it used to be embedded). A link inside the folder is fine."""
    folder, outside = tmp_path / "run", tmp_path / "outside.jsonl"
    shutil.copytree(skill_r1_run, folder)
    rows = (folder / "metrics.jsonl").read_text().splitlines()
    def secret(row: dict) -> dict:   # a probe's skill, which the page shows
        for probe in row.get("probes") or []:
            for skill in probe.get("skills") or []:
                skill["skill"] = "SECRET-OUTSIDE"
        return row
    outside.write_text("".join(json.dumps(secret(json.loads(r))) + "\n" for r in rows))
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").symlink_to(outside)
    assert report.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'metrics.jsonl'}: a link out of the run folder" in err and "not read" in err, err
    assert not (folder / "report.html").exists()
    (folder / "kept.jsonl").write_text(outside.read_text())
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").symlink_to("kept.jsonl")
    assert report.main([str(folder)]) == 0 and "SECRET-OUTSIDE" in (folder / "report.html").read_text()


def test_report_into_a_folder_writes_report_html_there(skill_r1_run, tmp_path, capsys):
    """-o FOLDER (an existing folder) writes FOLDER/report.html; it used to be an IsADirectoryError traceback."""
    folder = tmp_path / "pages"
    folder.mkdir()
    assert report.main([str(skill_r1_run), "-o", str(folder)]) == 0
    assert (folder / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert f"wrote {folder / 'report.html'}" in capsys.readouterr().out
    (folder / "report.html").unlink()
    (folder / "report.html").mkdir()                # FOLDER/report.html a folder too: a clear error
    assert report.main([str(skill_r1_run), "-o", str(folder)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_report_is_written_atomically_where_asked(skill_r1_run, tmp_path, capsys):
    target = tmp_path / "deep" / "r.html"
    assert report.main([str(skill_r1_run), "-o", str(target)]) == 0
    assert target.read_text().startswith("<!DOCTYPE html>") and f"wrote {target}" in capsys.readouterr().out
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".tmp-")]


# ---------------------------------------------------------------------------------------------- a real browser


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (Debian: apt-get install chromium)")
def test_pages_load_in_chromium_without_console_errors(skill_r1_lineage_run, masa_run, compare_run, eval_run,
                                                       tmp_path):
    # the check itself: a page with the report's policy and a script in it must be caught
    probe = tmp_path / "probe.html"
    probe.write_text(report_html.page("probe", "", [report_html.Safe(f"{XSS}<img src='http://example.invalid/x.png'>")]))
    assert len(browse(probe, tmp_path / "probe.png", tmp_path / "profile", 600)) >= 2
    keep = os.environ.get("MINSKILL_REPORT_SCREENSHOTS")
    for name, folder in (("skill_r1", skill_r1_lineage_run[0]), ("masa", masa_run), ("compare", compare_run),
                         ("eval", eval_run)):
        page = report.write_report(folder, tmp_path / f"{name}.html")
        png = tmp_path / f"{name}.png"
        console = browse(page, png, tmp_path / "profile")
        assert console == [], f"{name}: the browser's console said:\n" + "\n".join(console)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(page, Path(keep) / page.name)
            shutil.copy(png, Path(keep) / png.name)
