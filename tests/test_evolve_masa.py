"""End-to-end tests of evolve_masa.py: a scripted target and a scripted teacher behind real HTTP servers
(minskill.serve.backends.ScriptedBackend) on a synthetic suite where certain skill content helps.

The suite has two task types. The scripted target answers a `sum` task right only when its system prompt
holds KEY-GENERAL, and a `secret` task only when it holds KEY-SECRET. The base skills hold neither (R = 0).
The scripted teacher writes KEY-GENERAL into the general skills (hill climbing: R 0 -> 0.5) and KEY-SECRET
into the `secret` skills (tree search: that type 0 -> 1), so a working stage 1 must reach R = 1.
"""
import json
import re
import shutil

import pytest

import evolve_masa
from masa_records import check_sft_record
from helpers import argv, interrupted_at_save, read, target_fn, teacher_fn, write_suite
from minskill.masa import data as masa_data
from minskill.masa import search as masa, teacher as masa_teacher
from minskill.masa.model_card import ModelCard
from minskill.serve.errors import BackendError
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet


@pytest.fixture(scope="module")
def full_run(env):
    out = env["tmp"] / "run-a"
    assert evolve_masa.main(argv(env, out)) == 0
    return out


def test_end_to_end_raises_target_reward(full_run):
    out = full_run
    results = read(out, "results.json")
    assert results["base_reward"] == 0.0 and results["reward_out"] == 1.0 and results["stopped"] is None
    held = results["heldout"]
    assert held["base"]["success_rate"] == 0.0 and held["evolved"]["success_rate"] == 1.0
    assert held["gained_lost"]["**all**"] == [12, 0]
    assert "| sum | 6 | 0.00 | 1.00 | +1.00 |" in (out / "heldout.md").read_text()
    library = SkillSet.load(out / "library.json")
    assert "KEY-GENERAL" in library.general[0].body
    assert "KEY-SECRET" in library.task_specific["secret"][0].body
    assert SkillSet.load(out / "library").to_json() == library.to_json()   # Agent Skills folders
    card = ModelCard.load(out / "model_card.json")
    assert card.weaknesses == ["knows no keys"] and card.name == "target-a"
    assert (out / "reward.svg").read_text().startswith("<svg")


def test_run_json_records_the_cost_per_role(full_run):
    """run.json's usage: the target's and the teacher's calls (equal to the counts of this process), tokens as
    the scripted servers reported them, request and busy seconds, the target's cache hits apart; wall seconds."""
    run, state = read(full_run, "run.json"), read(full_run, "state.json")
    usage = run["usage"]
    assert usage == state["usage"] and usage["sessions"] == 1 and usage["wall_seconds"] > 0
    # (the teacher's one failure: the scripted teacher refused response_format json_schema,
    # masa/reply_schema.py)
    assert usage["target"]["calls"] == run["target_calls"] > 0 and usage["teacher"]["failures"] == 1
    assert usage["teacher"]["calls"] + 1 == run["teacher_calls"] > 1
    assert usage["target"]["cache_hits"] == run["target_cache_hits"]
    assert usage["target"]["calls"] + usage["teacher"]["calls"] + 1 == state["calls_spent"]
    for role in ("target", "teacher"):
        u = usage[role]
        assert u["prompt_tokens"] > 0 and u["completion_tokens"] > 0 and u["failures"] == (role == "teacher")
        assert all(0 < u[k] < float("inf") for k in ("busy_seconds", "request_seconds"))


def test_search_log_records_every_candidate(full_run):
    log = [json.loads(line) for line in (full_run / "search_log.jsonl").read_text().splitlines()]
    cands = [r for r in log if r["kind"] == "candidate"]
    general = [c for c in cands if c["phase"] in ("base", "general")]
    # base 0.0; iteration 1: 0.5 accepted; iteration 2: the same set again, equal -> rejected; 3: rejected;
    # patience 2 stops the climb after iteration 3
    assert [(c["reward"], c["accepted"]) for c in general] == [(0.0, True), (0.5, True), (0.5, False), (0.5, False)]
    assert [c["parent"] for c in general] == [None, 0, 1, 1]
    assert general[1]["attribution"]["failure_categories"][0]["category"] == "missing key"
    trees = {t: [c for c in cands if c["phase"] == "tree" and c["task_type"] == t] for t in ("sum", "secret")}
    assert [c["reward"] for c in trees["sum"]] == [1.0]             # perfect root: nothing to search
    assert [(c["node"], c["reward"]) for c in trees["secret"]] == [("0", 0.0), ("0.0", 1.0)]
    assert trees["secret"][1]["parent"] == trees["secret"][0]["id"]
    # the first general-rewrite reply of every iteration did not parse and was retried, not skipped
    assert not [r for r in log if r["kind"] == "event" and r["event"] == "teacher_skip"]


def test_sft_records_well_formed(full_run):
    records = [json.loads(line) for line in (full_run / "sft.jsonl").read_text().splitlines()]
    library = read(full_run, "library.json")
    sources = {r["source"] for r in records}
    assert {"early", "middle", "late", "teacher_oneshot", "noise", "partial", "verbose"} <= sources
    for i, r in enumerate(records):
        check_sft_record(r, f"sft.jsonl:{i + 1}")
        assert r["skills_out"] == library and r["target_model"] == "target-a" and r["reward_out"] == 1.0
        assert "secret" in r["task_description"] and r["model_card"]["weaknesses"] == ["knows no keys"]
    oneshot = SkillSet.from_json(next(r for r in records if r["source"] == "teacher_oneshot")["skills_in"])
    assert [(s.name, s.body, s.description) for s in oneshot.general] == [("oneshot", "Be careful.", "one-shot skill")]


def test_cache_second_run_makes_no_target_calls(env, full_run):
    out = env["tmp"] / "run-a-again"
    assert evolve_masa.main(argv(env, out, "--cache", str(full_run / "target_cache.jsonl"))) == 0
    run = read(out, "run.json")
    assert run["target_calls"] == 0 and run["target_cache_hits"] > 0
    assert read(out, "library.json") == read(full_run, "library.json")
    first = read(full_run, "run.json")
    assert first["target_calls"] > 0 and run["calls_spent"] == run["teacher_calls"] == first["teacher_calls"]
    # cache hits are counted apart and cost nothing: no target call, token or second
    target = run["usage"]["target"]
    assert target["cache_hits"] == run["target_cache_hits"] > 0
    assert target["calls"] == target["prompt_tokens"] == target["completion_tokens"] == 0
    assert target["request_seconds"] == target["busy_seconds"] == 0
    assert run["usage"]["teacher"]["prompt_tokens"] == first["usage"]["teacher"]["prompt_tokens"] > 0


def test_no_cache_pays_again(env, full_run):
    out = env["tmp"] / "run-nocache"
    assert evolve_masa.main(argv(env, out, "--no-cache", "--n-heldout", "0")) == 0
    assert not (out / "target_cache.jsonl").exists() and read(out, "run.json")["target_calls"] > 0


def test_budget_stop_keeps_best_so_far_then_resume(env, full_run, capsys):
    out = env["tmp"] / "run-budget"
    # 2 prelim target calls + 1 teacher call + 12 base-eval calls fit in 20; iteration 1 (attribution, two
    # rewrite attempts, 12 evaluation calls) does not
    assert evolve_masa.main(argv(env, out, "--max-calls", "20")) == 0
    results, state = read(out, "results.json"), read(out, "state.json")
    assert results["stopped"] and "call budget spent" in results["stopped"]
    assert state["calls_spent"] <= 20
    assert [e["event"] for e in state["events"]] == ["budget_stop"]
    assert state["search"]["general"]["best"] == 0 and state["search"]["phase"] == "general"
    assert read(out, "library.json") == json.loads(env["base"].read_text())   # best so far: the base skills
    assert not (out / "heldout.md").exists()
    assert "STOPPED" in capsys.readouterr().err
    # a resumed run with a larger budget finishes the same search
    assert evolve_masa.main(["--resume", "--out", str(out), "--max-calls", "1000"]) == 0
    assert read(out, "library.json") == read(full_run, "library.json")
    assert read(out, "results.json")["heldout"]["evolved"]["success_rate"] == 1.0


def test_resume_after_interruption(env, full_run, monkeypatch):
    out = env["tmp"] / "run-interrupted"
    # saves: start, base evaluated, general iteration 1, general iteration 2 -> stop
    interrupted_at_save(monkeypatch, 4, argv(env, out))
    state = read(out, "state.json")
    assert state["search"]["general"]["iteration"] == 2 and not (out / "library.json").exists()
    with pytest.raises(SystemExit):   # a fresh run into the same folder is refused
        evolve_masa.main(argv(env, out))
    assert evolve_masa.main(["--resume", "--out", str(out)]) == 0
    final = read(out, "state.json")["search"]
    uninterrupted = read(full_run, "state.json")["search"]
    strip = lambda cands: [{k: c[k] for k in ("phase", "task_type", "parent", "reward", "accepted", "node")}
                           for c in cands]
    assert strip(final["candidates"]) == strip(uninterrupted["candidates"])
    assert read(out, "library.json") == read(full_run, "library.json")
    # the resumed process re-paid nothing it had done: its target calls are the remaining work only
    assert read(out, "run.json")["target_calls"] < read(full_run, "run.json")["target_calls"]
    # ... and the run's cost per role continues across the resume: the same calls and tokens as uninterrupted
    usage, straight = read(out, "run.json")["usage"], read(full_run, "run.json")["usage"]
    counts = lambda u: {k: u[k] for k in ("calls", "failures", "prompt_tokens", "completion_tokens")}  # noqa: E731
    # (but for the refusal of response_format json_schema that each session's teacher client meets once)
    refused = {**counts(straight["teacher"]), "failures": straight["teacher"]["failures"] + 1}
    assert counts(usage["target"]) == counts(straight["target"]) and counts(usage["teacher"]) == refused
    assert usage["sessions"] == 2 and straight["sessions"] == 1 and read(out, "state.json")["usage"] == usage


def test_resume_refuses_a_differing_search_flag_and_takes_a_budget(env, full_run, tmp_path):
    """The resume policy (minskill.runs.resume_flags): a given flag that shapes the search and differs from the
    saved one is refused, each named with both values, and nothing is written (it used to be dropped silently
    for the saved value); a budget or an endpoint (RESUMABLE_OVERRIDES) is taken; the rest is the saved run's."""
    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as caught:
        evolve_masa.main(["--resume", "--out", str(out), "--iterations", "5", "--lam-nh", "0.3", "--max-calls", "9"])
    assert "--iterations 3 -> 5" in str(caught.value.code) and "--lam-nh 0.1 -> 0.3" in str(caught.value.code)
    assert "--max-calls" not in str(caught.value.code)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    parser, flags = evolve_masa.build_parser(), ["--resume", "--out", str(out), "--max-calls", "9"]
    args, _ = evolve_masa.resume_args(parser, parser.parse_args(flags), out, flags)
    saved = read(out, "state.json")["args"]
    assert args.max_calls == 9 and (args.iterations, args.task_url) == (saved["iterations"], saved["task_url"]) == \
        (3, env["a"])


def test_merge_runs_adds_other_backbone(env, full_run):
    out_b = env["tmp"] / "run-b"
    assert evolve_masa.main(argv(env, out_b, "--n-heldout", "0", target="b")) == 0
    merged = env["tmp"] / "merged"
    assert evolve_masa.main(["--merge", str(full_run), str(out_b), "--out", str(merged)]) == 0
    records = [json.loads(line) for line in (merged / "sft.jsonl").read_text().splitlines()]
    other = [r for r in records if r["source"] == "other_backbone"]
    assert len(other) == 2 and {r["target_model"] for r in other} == {"target-a", "target-b"}
    for r in records:
        check_sft_record(r)
    a_to = next(r for r in other if r["target_model"] == "target-a")
    assert a_to["skills_in"] == read(out_b, "library.json") and a_to["skills_out"] == read(full_run, "library.json")


def test_budget_spent_before_the_search_starts(env, full_run, capsys):
    out = env["tmp"] / "run-tiny-budget"
    # the 2 preliminary target calls fit, the teacher's summary of them does not
    assert evolve_masa.main(argv(env, out, "--max-calls", "2")) == 0
    state = read(out, "state.json")
    assert state["search"] is None and state["calls_spent"] == 2 and state["events"][0]["event"] == "budget_stop"
    assert "nothing to write" in capsys.readouterr().err
    assert evolve_masa.main(["--resume", "--out", str(out), "--max-calls", "1000"]) == 0
    assert read(out, "library.json") == read(full_run, "library.json")


def test_a_jsonl_suite_without_base_skills_starts_from_no_skills(tmp_path):
    """--suite FILE.jsonl and no --base-skills: an empty library (it used to read the root of the built-in
    base skills as one skill set, and crash)."""
    args = evolve_masa.build_parser().parse_args(["--suite", str(write_suite(tmp_path / "mine.jsonl"))])
    skills = evolve_masa.load_base_skills(args)
    assert skills.general == [] and skills.task_specific == {} and skills.common_mistakes == []


def test_resume_of_a_broken_state_json_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "state.json").write_text('{"version": 1, "args": {')
    with pytest.raises(SystemExit):
        evolve_masa.main(["--resume", "--out", str(tmp_path)])
    assert f"--resume: {tmp_path / 'state.json'}: not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("edit, names", [
    (lambda state: state["search"]["candidates"].__setitem__(1, None),
     "field search.candidates[1]: expected an object, got null"),
    (lambda state: state.update(search="x"), "field search: expected null or an object, got the string 'x'"),
    (lambda state: state.pop("args"), "lacks the field 'args'"),
    (lambda state: state["search"]["candidates"][0].update(reward="high"),
     "field search.candidates[0].reward: expected null or a number, got the string 'high'"),
    (lambda state: state["search"]["candidates"][2].update(id=7), "search.candidates[2]: id 7, expected 2"),
    (lambda state: next(iter(state["search"]["trees"].values()))["root"].update(payload=99),
     "root.payload: 99 is no candidate's id"),
    (lambda state: state.update(usage={"target": {"calls": "many"}}),
     "field usage.target.calls: expected null or a number"),
])
def test_resume_of_a_wrong_shaped_state_json_names_the_field_and_writes_nothing(full_run, tmp_path, capsys, edit,
                                                                               names):
    """A state.json edited by hand or damaged: --resume is a usage error naming the file and field, before any
    model call (each used to be a TypeError or KeyError traceback)."""
    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    state = read(out, "state.json")
    edit(state)
    (out / "state.json").write_text(json.dumps(state))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit):
        evolve_masa.main(["--resume", "--out", str(out)])
    err = capsys.readouterr().err
    assert f"--resume: {out / 'state.json'}: " in err and names in err, err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_replies_with_lone_surrogates_do_not_break_the_run(env, tmp_path):
    """The string "\\ud800" in every reply (valid JSON, no Unicode text) once killed the run writing
    state.json, and the teacher's unparsed reply, sent back in its retry, made the teacher answer 400."""
    servers = [start_server(ScriptedBackend(lambda m, r: target_fn(m, r) + "\ud800", name="target-a")),
               start_server(ScriptedBackend(lambda m, r: teacher_fn(m, r) + "\ud800", name="teacher",
                                            max_context=100000))]
    try:
        out = tmp_path / "run"
        args = argv({**env, "a": servers[0].url, "teacher": servers[1].url}, out, "--iterations", "1",
                    "--tree-iterations", "1")
        assert evolve_masa.main(args) == 0
    finally:
        for server in servers:
            server.close()
    assert "\ufffd" in SkillSet.load(out / "library.json").to_markdown()   # the teacher's reply, made text
    results = read(out, "results.json")
    assert results["reward_out"] == 1.0 and results["heldout"]["evolved"]["success_rate"] == 1.0


def test_a_teacher_replying_with_deep_brackets_is_skipped_and_the_run_finishes(env, tmp_path):
    """A teacher reply of 1,000+ unclosed '[' (or a 500-deep array that decodes) raised
    RecursionError out of the reply readers; ask_teacher caught only TeacherReplyError, so the run died, and
    --resume died again at the same point. Now each such reply is a reply error: retried, then skipped."""
    deep = ["[" * 5000, "```json\n" + "[" * 500 + "]" * 500 + "\n```"]

    def teacher(messages, request):
        return deep[len(messages) % 2] if "## Task:" in messages[1]["content"] else teacher_fn(messages, request)

    server = start_server(ScriptedBackend(teacher, name="teacher", max_context=100000))
    try:
        out = tmp_path / "run"
        args = argv({**env, "teacher": server.url}, out, "--iterations", "1", "--tree-iterations", "1",
                    "--teacher-retries", "1")
        assert evolve_masa.main(args) == 0
    finally:
        server.close()
    state = read(out, "state.json")
    skips = [e for e in state["events"] + state["search"]["events"] if e["event"] == "teacher_skip"]
    assert {e["what"] for e in skips} >= {"model summary", "attribution", "general rewrite", "one-shot rewrite"}
    assert all(e["attempts"] == 2 and len(e["errors"]) == 2 for e in skips)      # retried once, then skipped
    assert all("nested more than 64 levels" in " ".join(e["errors"]) for e in skips if e["what"] == "attribution")
    library, base = SkillSet.load(out / "library.json"), SkillSet.load(env["base"])   # nothing parsed: the base
    assert [(s.name, s.body) for s in library.skills()] == [(s.name, s.body) for s in base.skills()]
    assert read(out, "results.json")["stopped"] is None


NOTHING_TO_SEARCH = {"n-train 0": (["--n-train", "0"], "--n-train must be at least 1"),
                     "episodes 0": (["--episodes", "0"], "--episodes must be at least 1"),
                     "patience 0": (["--patience", "0"], "--patience must be at least 1"),
                     "one-task suite": (["--suite", "ONE"], "ONE: no search tasks: its train split gives 1 task"),
                     "card a folder": (["--model-card", "DIR"], "--model-card: model card DIR: is a folder")}


@pytest.mark.parametrize("extra, message", list(NOTHING_TO_SEARCH.values()), ids=list(NOTHING_TO_SEARCH))
def test_nothing_to_search_is_refused_before_any_call_or_file(env, tmp_path, capsys, extra, message):
    """--n-train 0 or a one-task suite raised ValueError after the preliminary target calls and
    after the run folder was made (so the corrected rerun was refused); --episodes 0 ran, every node scored
    "R = 0.000 on 0 episodes"; a folder as --model-card failed after the run folder was made. Each is
    now a usage error naming the flag or suite, with no call and no file."""
    calls = []
    servers = [start_server(ScriptedBackend(lambda m, r: calls.append(m) or "Answer: 1", name=name))
               for name in ("target-a", "teacher")]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"id": "t", "type": "sum", "question": "What is 1 plus 1?", "answer": "2",
                               "split": "train"}) + "\n")
    out = tmp_path / "out"
    args = [{"ONE": str(one), "DIR": str(tmp_path)}.get(a, a) for a in extra]
    try:
        with pytest.raises(SystemExit):
            evolve_masa.main(argv({**env, "a": servers[0].url, "teacher": servers[1].url}, out, *args))
    finally:
        for server in servers:
            server.close()
    assert message.replace("ONE", str(one)).replace("DIR", str(tmp_path)) in capsys.readouterr().err
    assert calls == [] and not out.exists()


def test_a_run_folder_as_model_card_gives_apply_the_card_of_its_sft_records(full_run):
    """`rewrite.py apply --model-card RUN` (and transfer's --model-card F=RUN) reads the run's
    model_card.json: the card every SFT record holds, field by field, the teacher's strengths and weaknesses too."""
    from minskill.masa.rewriter import load_model_card
    records = [json.loads(line) for line in (full_run / "sft.jsonl").read_text().splitlines()]
    applied = load_model_card(str(full_run))
    assert applied["weaknesses"] == ["knows no keys"] and applied["strengths"] == ["follows instructions"]
    for record in records:
        assert [(k, applied[k]) for k in record["model_card"]] == list(record["model_card"].items())
    assert load_model_card(str(full_run / "model_card.json")) == applied


def test_a_suite_name_as_task_is_the_description_of_the_sft_records(env, tmp_path):
    """masa_data.task_description (rewrite.py apply --task, transfer --task): a suite's name (a .jsonl file here) stands
    for what evolve_masa.py writes into its records with its defaults; other text is kept as it is."""
    import inspect
    parser = evolve_masa.build_parser()
    defaults = inspect.signature(masa_data.sft_task_description).parameters
    assert (defaults["n_prelim"].default, defaults["n_train"].default) == (parser.get_default("n_prelim"),
                                                                          parser.get_default("n_train"))
    run = evolve_masa.set_up(parser, parser.parse_args(["--suite", str(env["suite"]), "--out", str(tmp_path / "r")]))
    assert masa_data.task_description(str(env["suite"])) == run.task_description
    assert "sum" in run.task_description and "secret" in run.task_description
    assert masa_data.task_description("Sums of small numbers.") == "Sums of small numbers."


# llama.cpp's answer to a prompt that does not fit its context (its server's HTTP 400 body, message and type)
LLAMA_CPP_REFUSAL = ("the request exceeds the available context size, try increasing it", "exceed_context_size_error")


def teacher_with_context(limit: int, answered: list, refused: list):
    """teacher_fn behind a server of `limit` characters of context: a longer conversation is refused as llama.cpp
    refuses it (HTTP 400); `answered` and `refused` collect the user prompts (the first user turn) of each."""
    def teacher(messages, request):
        if sum(len(m["content"]) for m in messages) > limit:
            refused.append(messages[1]["content"])
            raise BackendError(400, *LLAMA_CPP_REFUSAL)
        answered.append(messages[1]["content"])
        return teacher_fn(messages, request)
    return teacher


def run_with_teacher(env, out, teacher, *extra) -> int:
    server = start_server(ScriptedBackend(teacher, name="teacher", max_context=100000))
    try:
        return evolve_masa.main(argv({**env, "teacher": server.url}, out, *extra))
    finally:
        server.close()


def test_a_teacher_prompt_too_long_for_the_server_is_sent_trimmed(env, tmp_path, capsys):
    """Behind llama.cpp with a small context a teacher prompt got HTTP 400 ("exceeds the available context size")
    and the run stopped. Now the prompt is built again with less history (fewer failure records, fewer top sets)
    and sent again: the run finishes as it does with room, and says what it trimmed."""
    answered, refused = [], []
    assert run_with_teacher(env, tmp_path / "run", teacher_with_context(1800, answered, refused)) == 0
    state, err = read(tmp_path / "run", "state.json"), capsys.readouterr().err
    trims = [e for e in state["search"]["events"] if e["event"] == "teacher_trim"]
    assert {e["what"] for e in trims} >= {"attribution", "general rewrite"} and all(e["trim"] >= 1 for e in trims)
    assert "sent trimmed" in err
    # the refused attribution showed the 6 failed episodes; the one answered in its place, fewer
    refused_attribution = [p for p in refused if masa_teacher.ATTRIBUTION_TASK in p]
    assert refused_attribution and max(p.count("- task ") for p in refused_attribution) == 6
    assert min(p.count("- task ") for p in answered if masa_teacher.ATTRIBUTION_TASK in p) < 6
    assert all(len(p) <= 1800 for p in answered)
    results = read(tmp_path / "run", "results.json")
    assert results["stopped"] is None and results["reward_out"] == 1.0


def test_a_teacher_prompt_that_cannot_be_trimmed_enough_is_a_logged_skip(env, tmp_path, capsys):
    """A server whose context holds no teacher prompt at all: every step is trimmed as far as it goes, then
    skipped and logged as a reply that does not parse is (state.json, search_log.jsonl, the printed skip line),
    and the run ends with the base skills, not with the server's 400."""
    answered, refused = [], []
    assert run_with_teacher(env, tmp_path / "run", teacher_with_context(300, answered, refused), "--iterations", "1",
                            "--tree-iterations", "1") == 0
    assert answered == [] and refused
    state, out = read(tmp_path / "run", "state.json"), capsys.readouterr()
    skips = [e for e in state["events"] + state["search"]["events"] if e["event"] == "teacher_skip"]
    assert {e["what"] for e in skips} == {"model summary", "attribution", "general rewrite", "task rewrite",
                                          "one-shot rewrite"}
    assert all(e["reason"] == "prompt too long" and e["attempts"] >= 1 for e in skips)
    assert all("exceeds the available context size" in e["errors"][-1] for e in skips)
    one_shot = next(e for e in skips if e["what"] == "one-shot rewrite")
    assert one_shot["attempts"] == 1   # nothing in it to drop: refused once, then skipped
    logged = [json.loads(line) for line in (tmp_path / "run" / "search_log.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "event" and r["event"] == "teacher_skip" for r in logged) == len(skips)
    assert "refused the prompt as too long for its context" in out.err
    assert f"{len(skips)} teacher replies skipped" in out.out
    library, base = SkillSet.load(tmp_path / "run" / "library.json"), SkillSet.load(env["base"])
    assert [(s.name, s.body) for s in library.skills()] == [(s.name, s.body) for s in base.skills()]
    assert read(tmp_path / "run", "results.json")["stopped"] is None


CALLS_LINE = re.compile(r"calls: (\d+) model calls \((\d+) target, (\d+) target cache hits, (\d+) teacher\) this "
                        r"session(?:, (\d+) in the whole run \((\d+) sessions\))?;")


def test_the_calls_printed_after_a_resume_are_the_sessions_and_the_whole_runs(env, tmp_path, capsys):
    """After --resume the end-of-run line said "N model calls (T target, ... H teacher) this session" with N the whole
    run's count (the budget's), so T + H != N, and a resume that made 20 calls printed 75. Now N = T + H is the
    session's, the whole run's count follows it, and state.json's usage adds up to calls_spent over the sessions."""
    out = tmp_path / "run"
    assert evolve_masa.main(argv(env, out, "--max-calls", "20")) == 0
    first_spent = read(out, "state.json")["calls_spent"]
    n, target, _, teacher, whole, _ = CALLS_LINE.search(capsys.readouterr().out).groups()
    assert int(n) == int(target) + int(teacher) == first_spent and whole is None   # one session: no whole-run part
    assert evolve_masa.main(["--resume", "--out", str(out), "--max-calls", "1000"]) == 0
    state = read(out, "state.json")
    n, target, _, teacher, whole, sessions = (int(g) if g else None
                                              for g in CALLS_LINE.search(capsys.readouterr().out).groups())
    assert n == target + teacher == state["calls_spent"] - first_spent > 0
    assert (whole, sessions) == (state["calls_spent"], 2) and read(out, "run.json")["calls_spent"] == whole
    usage = state["usage"]
    assert usage["sessions"] == 2
    assert sum(usage[role]["calls"] + usage[role]["failures"] for role in ("target", "teacher")) == state["calls_spent"]


@pytest.mark.parametrize("max_calls, attempts, reason", [(21, 2, None), (17, 1, "budget spent")],
                         ids=["iteration cut short", "retry refused"])
def test_a_teacher_reply_skipped_at_the_budgets_end_is_logged_and_counted(env, tmp_path, capsys, max_calls, attempts,
                                                                          reason):
    """A teacher reply skipped in the iteration that the budget cut short was printed, then lost with the rollback
    to the last checkpoint: not in state.json or search_log.jsonl, not in the count of skipped replies; a reply
    that did not parse and whose retry the budget refused was not even printed. Both are paid replies: now each
    is a teacher skip of the run's events (marked cut_short), logged and counted.
    Calls: 2 preliminary + 1 summary (+ 1 before it that the scripted teacher refused: response_format) + 12 base
    evaluation = 16; then the attribution, which never parses (2 attempts), the general rewrite (2) and its
    evaluation (12): 17 cuts the attribution's retry, 21 the evaluation."""
    def teacher(messages, request):
        if masa_teacher.ATTRIBUTION_TASK in messages[1]["content"]:
            return "I cannot tell what went wrong."
        return teacher_fn(messages, request)

    out = tmp_path / "run"
    assert run_with_teacher(env, out, teacher, "--max-calls", str(max_calls), "--teacher-retries", "1") == 0
    state, printed = read(out, "state.json"), capsys.readouterr()
    assert [e["event"] for e in state["events"]] == ["teacher_skip", "budget_stop"]
    skip = state["events"][0]
    assert (skip["what"], skip["attempts"], skip.get("reason"), skip["cut_short"]) == ("attribution", attempts, reason,
                                                                                       True)
    assert len(skip["errors"]) == attempts and "no JSON" in skip["errors"][0]
    logged = [json.loads(line) for line in (out / "search_log.jsonl").read_text().splitlines()]
    assert [r["what"] for r in logged if r["kind"] == "event" and r["event"] == "teacher_skip"] == ["attribution"]
    assert "teacher reply skipped (attribution)" in printed.err and "; 1 teacher replies skipped;" in printed.out
