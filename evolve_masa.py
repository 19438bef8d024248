"""MASA stage 1, end to end: a teacher LLM evolves a skill library for one target model.

    python evolve_masa.py                  # offline: SmolLM2-135M as target AND teacher, small run
    python evolve_masa.py --suite qa --task-url http://gpu:8000/v1 --task-model Qwen/Qwen3-8B \\
        --teacher-url https://api.example.com/v1 --teacher-model big-model --out runs/masa-qwen3-8b
    python evolve_masa.py --resume --out OUT                  # continue an interrupted run
    python evolve_masa.py --merge RUN_DIR RUN_DIR ... --out DIR    # SFT records of several targets

The algorithm and its equations: minskill/masa/search.py; the flags, outputs and measured runs:
docs/masa.md. Decisions:

1. The card's strengths and weaknesses come from --n-prelim train tasks the search never sees.
2. Target calls are cached on disk (OUT/target_cache.jsonl): a rerun or a resume pays none twice.
3. The state is saved after every iteration; --resume continues the same search (the flags that may
   change: RESUMABLE_OVERRIDES).
4. A spent --max-calls rolls back the iteration it cut short and keeps the best skills so far.
5. --gate decides what a candidate must show to replace the incumbent (minskill/gates.py); fresh
   tests it on --gate-tasks train tasks apart from all others (`load_gate_tasks`).
6. The evolved library is scored against the base skills on a held-out split (heldout.md).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from minskill import gates
from minskill.cli import client_args, with_extra_body
from minskill.files import read_json, write_json_atomic, write_jsonl_atomic, write_text_atomic
from minskill.masa import data as masa_data, search as masa, teacher as masa_teacher
from minskill.masa.model_card import ModelCard, target_model_card
from minskill.masa.run_config import DEFAULTS, EMBEDDED_TEACHER, build_parser, check_state
from minskill.masa.search import MasaConfig, MasaSearch
from minskill.plot import write_svg_plot
from minskill.retrieval import (RetrievalError, check_retrieval_args, retriever_from_args,
                                with_retrieval)
from minskill.rollout import (all_failed, cut_totals, fit_to_suite, load_skills,
                              reasoning_cut_note, summarize)
from minskill.runs import (check_run_folder, given_flags, open_run_folder, restart_flags,
                           resume_flags, started_flags)
from minskill.serve.caching import BudgetExhausted, CachingClient, CallBudget
from minskill.serve.client import ChatError
from minskill.serve.embedded import embedded_client
from minskill.skillsets import SkillSet
from minskill.tasks import load_suite
from minskill.tasks.base import interleave


# --resume (minskill.runs.resume_flags): the flags that may change when a run is resumed (endpoints
# move, budgets grow); every other flag is the saved run's, and given with another value is refused:
# the same search continues.
RESUMABLE_OVERRIDES = ("max_calls", "no_cache", "cache", "task_url", "task_model", "task_api_key",
                       "teacher_url", "teacher_model", "teacher_api_key", "task_concurrency",
                       "timeout", "startup_timeout", "task_extra_body", "teacher_extra_body",
                       "embed_url", "embed_model", "device", "teacher_json_schema")
STARTED = time.time()   # progress lines count from here (set_up sets it again)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args)
    run = set_up(parser, args, argv)
    with connect(run) as (target, teacher):
        try:   # a failing endpoint, or a target that answered none of an evaluation (TargetFailed)
            search, stopped = run_search(run, target, teacher)   # 1-3: card, hill climbing, trees
            if search is None or search.climb is None:
                run.state.update(calls_spent=run.budget.spent, usage=run_usage(run))
                save_checkpoint(run.out, run.state)
                log("no skill set was evaluated; nothing to write")
                return 0
            written = write_outputs(run, search, target, teacher, stopped)   # 4: outputs
        except (ChatError, KeyboardInterrupt) as e:
            return stopped_by(run, e)
    print_summary(run, search, target, teacher, written)
    if written["results"].get("heldout_error"):   # the library is written; the held-out table not
        log(f"error: no held-out table: {written['results']['heldout_error']}")
        return 1
    return 0


# --------------------------------------------------------------------------------------------------
# 1-3. The card, hill climbing, the trees

def run_search(run: Run, target, teacher) -> tuple[MasaSearch | None, str | None]:
    """1-3: the card, hill climbing, the trees; after every iteration its progress is printed and
    the search's state saved (checkpointed). Returns (the search, or None when the budget ran out
    before it began; why it stopped early, or None). On a spent budget the search is rolled back to
    its last checkpoint (an iteration cut short is not a result); on an endpoint failure or Ctrl-C
    that checkpoint is saved and the exception passes on."""
    search, shown = None, 0
    try:
        search = MasaSearch(target, teacher, model_card(run, target, teacher), run.tasks,
                            run.base_skills, run.config, run.state["search"], run.budget,
                            run.gate_tasks)   # 1. the card, then 2-3
        checkpoint(run, search.to_json())
        shown, said = len(search.events), False   # an earlier session printed those events
        for line in search.run():   # after every iteration: its progress printed, the state saved
            shown = log_progress(search, shown, line)
            said = said or say_reasoning_cut([c.metrics for c in search.candidates])
            checkpoint(run, search.checkpoint())
    except BudgetExhausted as e:
        if search is not None:
            log_progress(search, shown)   # the skipped replies of the iteration cut short
            keep_cut_events(run, search)
            search.restore(search.last_checkpoint)
            checkpoint(run, search.last_checkpoint)
        run.state["events"].append({"event": "budget_stop", "message": str(e)})
        log(f"STOPPED: {e}. Keeping the best skills so far (resume with a larger --max-calls).")
        return search, str(e)
    except (ChatError, KeyboardInterrupt):
        if search is not None:
            log_progress(search, shown)
            keep_cut_events(run, search)
            checkpoint(run, search.last_checkpoint)
        raise
    return search, None


def model_card(run: Run, target, teacher) -> ModelCard:
    """1. The target's card; its strengths and weaknesses summarised from the preliminary rollouts,
    once."""
    if run.state["card"] is None:
        card = getattr(run, "card", None) or initial_card(run.args, target)
        if run.prelim and not card.weaknesses:
            log(f"[card] summarising the target from {len(run.prelim)} preliminary rollouts")
            card = masa.summarize_model(teacher, card, target, run.prelim, run.config,
                                        on_skip=lambda event: teacher_skipped(run, event),
                                        budget=run.budget)
        run.state["card"] = card.to_json()
        card.save(run.out / "model_card.json")
    return ModelCard.from_json(run.state["card"])


def initial_card(args, target=None) -> ModelCard | None:
    """The target's card before the teacher's summary: --model-card, else built from
    --target-checkpoint or the embedded model's spec (model_card.target_model_card, the builder
    rewrite.py apply and transfer use too), else (a URL target) just its name, once `target` is
    connected (None before)."""
    if args.model_card:
        return ModelCard.load(args.model_card)
    if args.target_checkpoint:
        return target_model_card(args.target_checkpoint, name=args.task_model)
    if args.task_url is None:  # the embedded model: its (converted) checkpoint has a config.json
        return target_model_card(args.model_spec)
    return None if target is None else ModelCard(name=target.model)


def checkpoint(run: Run, search_state: dict) -> None:
    run.state.update(search=search_state, calls_spent=run.budget.spent, usage=run_usage(run))
    save_checkpoint(run.out, run.state)


def save_checkpoint(out: Path, run_state: dict) -> None:
    """state.json and search_log.jsonl, both atomically (called after every iteration)."""
    write_json_atomic(out / "state.json", run_state)
    write_jsonl_atomic(out / "search_log.jsonl", masa.search_log(run_state["search"] or {}) +
                       [{"kind": "event", **e} for e in run_state["events"]])


def run_usage(run: Run) -> dict:
    """The cost per role of the whole run so far, continued across --resume as calls_spent is: the
    target's and the teacher's calls, tokens, request and busy seconds (client.Usage; the target's
    cache hits apart, at no cost), and the run's wall seconds over all its sessions. Saved in
    state.json at every checkpoint."""
    saved = run.usage_before
    return {**{role: saved[role] for role in ("target", "teacher") if role in saved},
            **{role: client.usage for role, client in run.roles.items()},
            "wall_seconds": round(saved.get("wall_seconds", 0.0) + time.time() - STARTED, 3),
            "sessions": saved.get("sessions", 0) + 1}


def log_progress(search: MasaSearch, shown: int, line: str | None = None) -> int:
    """Print the search's teacher events (after the first `shown`), then `line`; returns its event
    count."""
    for event in search.events[shown:]:
        log(teacher_event_line(event))
    if line is not None:
        log(line)
    return len(search.events)


def say_reasoning_cut(metrics: list[dict | None]) -> bool:
    """Once, when the target's first replies cut inside their reasoning appear: their count over
    the evaluated skill sets and the fix (rollout.reasoning_cut_note). True: said."""
    if note := reasoning_cut_note(cut_totals(metrics)):
        log(note)
    return note is not None


def teacher_skipped(run: Run, event: dict) -> None:
    run.state["events"].append({"event": "teacher_skip", **event})
    log(teacher_event_line(event))


def teacher_event_line(event: dict) -> str:
    """A teacher event (minskill.masa.teacher: a reply skipped, a prompt sent trimmed) as a progress
    line."""
    last = f"last error: {event['errors'][-1][:160] if event.get('errors') else '?'}"
    if event.get("event") == "teacher_trim":
        return (f"  teacher prompt ({event['what']}) refused as too long for the server's context; "
                f"sent trimmed to level {event['trim']} (less history first, then fewer examples)")
    why = {"prompt too long": "the server refused the prompt as too long for its context at every "
                              "trim level (a smaller --teacher-max-tokens or a larger server "
                              "context leaves it room)",
           "budget spent": "the call budget was spent before a retry"}.get(event.get("reason"),
                                                                             "did not parse")
    return f"  teacher reply skipped ({event['what']}): {event['attempts']} attempts; {why}; {last}"


def keep_cut_events(run: Run, search: MasaSearch) -> None:
    """The teacher events of the iteration cut short (by the budget, a failing endpoint, Ctrl-C),
    whose work is rolled back to the last checkpoint and redone on --resume: their calls were paid,
    so they stay in the run's events (state.json, search_log.jsonl) and in its count of skipped
    replies, marked "cut_short"."""
    done = len(search.last_checkpoint["events"])
    run.state["events"].extend({**event, "cut_short": True} for event in search.events[done:])


def stopped_by(run: Run, error: BaseException) -> int:
    """The exit status and the message for a run cut off by a failing endpoint (1: the client
    already retried) or Ctrl-C (130); --resume continues it (from the start if nothing is saved)."""
    failed, resume = isinstance(error, ChatError), f"python evolve_masa.py --resume --out {run.out}"
    log(f"FAILED: {error}" if failed else "interrupted")
    fix = "fix the endpoint, then " if failed else ""
    log(f"the last finished iteration is saved in {run.out / 'state.json'}; {fix}continue with: "
        f"{resume}" if (run.out / "state.json").exists() else
        f"nothing was saved yet; {fix}{resume} starts it again from the beginning")
    return 1 if failed else 130


# --------------------------------------------------------------------------------------------------
# 4. Outputs

def write_outputs(run: Run, search: MasaSearch, target, teacher, stopped: str | None) -> dict:
    """library/, library.json, sft.jsonl, reward.svg, heldout.md, results.json, run.json,
    state.json. What the budget no longer allows is left out and said in `notes`."""
    out, config, notes = run.out, run.config, []
    library = search.library().carry_resources(run.base_skills)   # resources: by name, the input's
    library.save(out / "library")
    library.save_json(out / "library.json")
    reward_out = search.climb.best.reward
    try:
        log(f"[final] evolved library on the {len(run.tasks)} search tasks  "
            f"calls {run.budget.spent}")
        reward_out = search.evaluate(library, run.tasks)[0]["adjusted_reward"]
    except BudgetExhausted:
        notes.append("budget spent: reward_out is the best general set's R, the library was not "
                     "re-evaluated")
    oneshot = None
    try:
        oneshot = masa_teacher.one_shot_rewrite(
            teacher, search.card, search.candidates[0].skills, run.task_description,
            retries=config.teacher_retries, temperature=config.teacher_temperature,
            max_tokens=config.teacher_max_tokens,
            seed=masa_teacher.teacher_seed(config.seed, "oneshot"),
            on_skip=lambda event: teacher_skipped(run, event),
            json_schema=config.teacher_json_schema)
    except (BudgetExhausted, ChatError) as e:
        notes.append(f"no one-shot teacher rewrite in sft.jsonl ({e})")
    records = masa_data.sft_records(run.state["search"], search.card, run.task_description, library,
                                    reward_out, target.model, oneshot=oneshot, seed=config.seed,
                                    copies=run.args.sft_copies)
    write_jsonl_atomic(out / "sft.jsonl", records)
    reward_plot(out, run.state["search"])
    results = {"target_model": target.model, "teacher_model": teacher.model,
               "reward_out": reward_out, "base_reward": search.candidates[0].reward,
               "stopped": stopped, "notes": notes}
    table = heldout_evaluation(run, search, target, library, results)
    run.state.update(calls_spent=run.budget.spent, usage=run_usage(run))
    save_checkpoint(out, run.state)
    write_json_atomic(out / "results.json", results)
    write_json_atomic(out / "run.json", {
        "target_model": target.model, "model_card": search.card.to_json(),
        "task_description": run.task_description, "best_skills": library.to_json(),
        "reward_out": reward_out, "calls_spent": run.budget.spent, "target_calls": target.calls,
        "target_cache_hits": target.cache_hits, "teacher_calls": teacher.calls,
        "seconds": round(time.time() - STARTED, 1), "usage": run.state["usage"],
        "args": run.state["args"]})
    return {"results": results, "records": len(records), "table": table}


def heldout_evaluation(run: Run, search: MasaSearch, target, library: SkillSet,
                       results: dict) -> str | None:
    """Base vs evolved skills on the held-out split: heldout.md and results["heldout"]; the table,
    or None (and results["heldout_error"] when every rollout of a set ended with an error:
    rollout.all_failed; main exits 1)."""
    if not run.heldout:
        return None
    try:
        runs = {}   # with --retrieve: embeddings from --embed-url, else the target's own endpoint
        retriever = retriever_from_args(run.args, getattr(target, "inner", target),
                                        run.args.task_api_key)   # (not cached)
        for name, skills in (("base", search.candidates[0].skills), ("evolved", library)):
            log(f"[held-out] {name} skills on {len(run.heldout)} tasks  calls {run.budget.spent}")
            trajs = masa.rollouts(target, run.heldout, with_retrieval(skills, retriever),
                                  run.config, run.budget)
            if all_failed(trajs):   # the target stopped answering: no table of 0s
                results["heldout_error"] = (f"the {name} skills on the held-out split: "
                                            f"{all_failed(trajs)}")
                log(f"[held-out] not evaluated: {results['heldout_error']}")
                return None
            runs[name] = (trajs, summarize(trajs, lam_nh=run.config.lam_nh))
    except BudgetExhausted:
        results["notes"].append("budget spent: no held-out evaluation (rerun with --resume and a "
                                "larger --max-calls)")
        return None
    except RetrievalError as e:
        results["notes"].append(f"no held-out evaluation: {e}")
        log(f"[held-out] not evaluated: {e}")
        return None
    paired = paired_counts(runs["base"][0], runs["evolved"][0])
    table = heldout_table(runs["base"][1], runs["evolved"][1], paired)
    results["heldout"] = {"base": runs["base"][1], "evolved": runs["evolved"][1],
                          "gained_lost": {k: list(v) for k, v in paired.items()}}
    write_text_atomic(run.out / "heldout.md", table + "\n")
    return table


def heldout_table(base: dict, evolved: dict, paired: dict) -> str:
    head = ("| task type | n | success base | success evolved | Δ | NHR base | NHR evolved | "
            "steps base | steps evolved | gained / lost | errors base | errors evolved |\n"
            + "|---" * 12 + "|")
    rows = [head]
    names = list(base["per_type"]) + ["**all**"]
    for name in names:
        b = base if name == "**all**" else base["per_type"][name]
        e = evolved if name == "**all**" else evolved["per_type"][name]
        gained, lost = paired.get(name, (0, 0))
        rows.append(f"| {name} | {b['n']} | {b['success_rate']:.2f} | {e['success_rate']:.2f} | "
                    f"{e['success_rate'] - b['success_rate']:+.2f} | {b['nhr']:.2f} | "
                    f"{e['nhr']:.2f} | {b['mean_steps']:.1f} | {e['mean_steps']:.1f} | "
                    f"{gained} / {lost} | {b['errors']} | {e['errors']} |")
    return "\n".join(rows)


def paired_counts(base_trajs, evolved_trajs) -> dict:
    """Per type and overall: (tasks the evolved set solves and the base set does not, the
    reverse)."""
    base = {t.task_id: t for t in base_trajs}
    out: dict[str, list[int]] = {}
    for e in evolved_trajs:
        b = base.get(e.task_id)
        if b is None or b.success == e.success:
            continue
        for key in (e.task_type, "**all**"):
            counts = out.setdefault(key, [0, 0])
            counts[0 if e.success else 1] += 1
    return {k: tuple(v) for k, v in out.items()}


def reward_plot(out: Path, state: dict) -> None:
    cands = state["candidates"]
    general = [x for x in cands if x["phase"] in ("base", "general") and x["reward"] is not None]
    series = {"general: candidate R": [(x["iteration"], x["reward"]) for x in general]}
    best, curve = -1e9, []
    for x in general:
        if x["accepted"]:
            best = max(best, x["reward"])
        curve.append((x["iteration"], best))
    series["general: best R"] = curve
    for task_type in sorted({x["task_type"] for x in cands if x["phase"] == "tree"}):
        best, curve = -1e9, []
        for x in cands:
            if x["phase"] == "tree" and x["task_type"] == task_type and x["reward"] is not None:
                best = max(best, x["reward"])
                curve.append((x["iteration"], best))
        series[f"tree {task_type}: best R"] = curve
    write_svg_plot(out / "reward.svg", series, title="MASA stage 1: reward over iterations",
                   xlabel="iteration", ylabel="R = SR − λ·NHR")


def print_summary(run: Run, search: MasaSearch, target, teacher, written: dict) -> None:
    """What the run did, on stdout."""
    s, results, table = run.state["search"], written["results"], written["table"]
    n_general = sum(x["phase"] == "general" for x in s["candidates"])
    n_tree = sum(x["phase"] == "tree" for x in s["candidates"])
    accepted = sum(bool(x["accepted"]) for x in s["candidates"] if x["phase"] == "general")
    skips = sum(e.get("event") == "teacher_skip" for e in s["events"] + run.state["events"])
    print(f"\nMASA stage 1 on {Path(run.args.suite).stem}: target {target.model}, "
          f"teacher {teacher.model}")
    print(f"base skills R = {results['base_reward']:.3f}; best general R = "
          f"{search.climb.best.reward:.3f} ({n_general} general candidates, {accepted} accepted); "
          f"{n_tree} tree nodes over {len(s['trees'])} task types; evolved library R = "
          f"{results['reward_out']:.3f} on the {len(run.tasks)} search tasks")
    print(calls_lines(run, target, teacher, skips))
    if table:
        print(f"\nheld-out ({len(run.heldout)} tasks), base vs evolved skills:\n{table}")
    notes = list(results["notes"])
    evaluated = [x for x in s["candidates"] if x["metrics"] is not None]
    if cut := reasoning_cut_note(cut_totals([x["metrics"] for x in evaluated])):
        notes.append(cut.removeprefix("note: "))   # the reply budget scored them 0
    if evaluated and max(x["metrics"]["success_rate"] for x in evaluated) == 0.0:
        rewards = {round(x["reward"], 6) for x in evaluated}
        notes.append("the target solved none of the search tasks under any skill set (success 0 "
                     "everywhere); "
                     + ("R differs only through NHR." if len(rewards) > 1 else
                        "every R is equal, so the search had no signal to learn from."))
    for note in notes:
        print(f"note: {note}")
    print(f"\nwrote {run.out}/library/, library.json, search_log.jsonl, sft.jsonl "
          f"({written['records']} records), reward.svg, results.json, run.json"
          + (", heldout.md" if table else ""))


def calls_lines(run: Run, target, teacher, skips: int) -> str:
    """The calls of this session (they add up: target + teacher, each call sent, failed or not, as
    the budget counts it) and, after a --resume, of the whole run (the budget's count); then the
    whole run's cost per role (failed calls, e.g. prompts refused as too long, apart)."""
    usage, session = run.state["usage"], run.budget.spent_this_session
    whole = (f", {run.budget.spent} in the whole run ({usage['sessions']} sessions)"
             if usage["sessions"] > 1 else "")
    per_role = "; ".join(
        f"{role} {u['calls']} calls" + (f" (+{u['failures']} failed)" if u.get("failures") else "")
        + f", {u['prompt_tokens'] + u['completion_tokens']} tokens, {u['busy_seconds']:.0f} s busy"
        for role, u in usage.items() if isinstance(u, dict))
    return (f"calls: {session} model calls ({target.calls} target, {target.cache_hits} target "
            f"cache hits, {teacher.calls} teacher) this session{whole}; {skips} teacher replies "
            f"skipped{' in the whole run' if whole else ''}; {time.time() - STARTED:.0f} s\n"
            f"whole run: {per_role}; {usage['wall_seconds']:.0f} s wall")


def merge(args) -> int:
    out = Path(args.out or "runs/masa-merged")
    check_run_folder(out, False, args.overwrite, "evolve_masa.py --merge", resumable=False)
    records = masa_data.merge_sft_runs(args.merge)
    open_run_folder(out, False, args.overwrite, "evolve_masa.py --merge")
    write_jsonl_atomic(out / "sft.jsonl", records)
    extra = sum(r["source"] == "other_backbone" for r in records)
    print(f"merged {len(args.merge)} runs: {len(records)} records ({extra} other_backbone) -> "
          f"{out / 'sft.jsonl'}")
    return 0


# --------------------------------------------------------------------------------------------------
# The run: set-up, resume, the endpoints

@dataclass
class Run:
    """What one run works with. `state` is what state.json holds: the arguments, the model card, the
    calls spent, the search (MasaSearch.to_json) and the run's own events (teacher skips, budget
    stop)."""
    args: argparse.Namespace
    out: Path
    state: dict
    config: MasaConfig
    prelim: list
    tasks: list
    heldout: list
    base_skills: SkillSet
    budget: CallBudget
    cache_path: Path | None
    task_description: str
    usage_before: dict = field(default_factory=dict)   # state.json's usage when this session began
    gate_tasks: list = field(default_factory=list)     # --gate fresh: its gate tasks
    roles: dict = field(default_factory=dict)   # "target", "teacher": their CachingClients
    card: ModelCard | None = None   # the card before the teacher's summary (initial_card), if known


def set_up(parser: argparse.ArgumentParser, args: argparse.Namespace, argv=None) -> Run:
    """Resume or start: arguments (`argv`: the command line they were parsed from, for --resume),
    config, tasks and base skills (a bad suite is refused before any model call), the run folder,
    the budget and the state."""
    global STARTED
    out = Path(args.out or f"runs/masa-{Path(args.suite).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    saved = None
    if args.resume:
        args, saved = resume_args(parser, args, out, argv)
    check_search_args(parser, args)
    check_run_folder(out, args.resume, args.overwrite, "evolve_masa.py")
    try:
        check_retrieval_args(args)
    except RetrievalError as e:
        parser.error(str(e))
    try:
        gates.check_gate(args.gate, args.gate_alpha)
    except ValueError as e:
        parser.error(f"--gate / --gate-alpha: {e}")
    if args.gate == "fresh" and args.gate_tasks < 1:
        parser.error(f"--gate-tasks must be at least 1, got {args.gate_tasks}")
    embedded_teacher = args.teacher_url is None
    for k in EMBEDDED_TEACHER:   # None: not given
        if getattr(args, k) is None:
            setattr(args, k, EMBEDDED_TEACHER[k] if embedded_teacher else getattr(DEFAULTS, k))
    config = MasaConfig(**{f.name: getattr(args, f.name) for f in fields(MasaConfig)
                           if hasattr(args, f.name)},   # the search's knobs: flags, same names
                        target_max_tokens=args.task_max_tokens)
    try:
        prelim, tasks, heldout = load_task_splits(args)
        gate_tasks = load_gate_tasks(args, prelim + tasks + heldout)
    except (ValueError, FileNotFoundError) as e:   # a bad suite file, too few gate tasks: before
        parser.error(str(e))                       # any model call
    if not tasks:   # MasaSearch would refuse it, but after the preliminary calls and the folder
        n = len(prelim)
        parser.error(f"--suite {args.suite}: no search tasks: its train split gives {n} "
                     f"task{'s' * (n != 1)}, and the first --n-prelim {args.n_prelim} are the "
                     f"preliminary ones; lower --n-prelim or give a suite with more train tasks")
    gate_ids = [t.id for t in gate_tasks]
    if saved is not None and saved.get("gate_tasks", gate_ids) != gate_ids:
        differ = sorted(set(gate_ids) ^ set(saved["gate_tasks"]))
        parser.error(f"--resume: the suite now gives other gate tasks than the saved run's "
                     f"({len(gate_ids)} vs {len(saved['gate_tasks'])}; differing ids: "
                     f"{', '.join(differ[:3])})")
    try:
        base_skills = load_base_skills(args)
    except ValueError as e:   # SkillFormatError: a bad --base-skills folder or .json, named
        parser.error(f"--base-skills {args.base_skills}: {e}")
    card = None
    if saved is None or saved.get("card") is None:
        try:   # a bad --model-card or checkpoint: refused before any model call or file
            card = initial_card(args)
        except (OSError, ValueError, RuntimeError) as e:
            flag = "--model-card" if args.model_card else \
                ("--target-checkpoint" if args.target_checkpoint else "--model-spec")
            parser.error(f"{flag}: {e}")
    if args.cache and not args.no_cache and Path(args.cache).is_symlink():   # (appends: through it)
        parser.error(f"--cache {args.cache} is a symbolic link; a run writes no file through one")
    state = saved or {"version": 1, "args": {k: v for k, v in vars(args).items()
                                             if k not in ("resume", "overwrite", "merge")},
                      "card": None, "calls_spent": 0, "search": None, "events": [],
                      "gate_tasks": gate_ids}
    out = open_run_folder(out, args.resume, args.overwrite, "evolve_masa.py",
                          keep=("target_cache.jsonl",), settings=state["args"])
    STARTED = time.time()   # progress lines and run.json count from here
    return Run(args, out, state, config, prelim, tasks, heldout, base_skills,
               CallBudget(args.max_calls, spent=saved["calls_spent"] if saved else 0),
               None if args.no_cache else Path(args.cache or out / "target_cache.jsonl"),
               masa_data.suite_description(tasks, Path(args.suite).stem),
               usage_before=dict(state.get("usage") or {}),   # usage: continued
               gate_tasks=gate_tasks, card=card)


def resume_args(parser: argparse.ArgumentParser, args: argparse.Namespace, out: Path, argv=None):
    """--resume: (the arguments of the resume policy, minskill.runs.resume_flags: the saved run's
    where `argv` gives none, a given one of RESUMABLE_OVERRIDES taken, another that differs refused;
    the saved state, None for a run stopped before its first checkpoint: it starts again,
    restart_flags)."""
    state_path = out / "state.json"
    if not state_path.is_file() and started_flags(out, "evolve_masa.py") is None:
        parser.error(f"--resume: no saved run in {out} (state.json is missing)")
    try:
        where = f"--resume: {state_path}"
        saved = check_state(read_json(state_path, where), where) if state_path.is_file() else None
    except ValueError as e:   # a state.json cut, edited by hand or nested too deeply: no traceback
        parser.error(str(e))
    args.out = str(out)
    flags = saved["args"] if saved else restart_flags(out, "evolve_masa.py", say=log)
    resume_flags(args, flags, given_flags(parser, argv), RESUMABLE_OVERRIDES, "evolve_masa.py")
    if saved:
        search_state = saved.get("search") or {"phase": "start", "candidates": []}
        log(f"resuming {out}: phase {search_state['phase']}, {len(search_state['candidates'])} "
            f"candidates, {saved['calls_spent']} calls spent")
    return args, saved


def check_search_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Counts that leave the search nothing to do, or that it cannot run with, refused before any
    model call or file (MasaSearch would find them only after the preliminary calls and the run
    folder)."""
    least = {"n_train": 1, "n_prelim": 0, "n_heldout": 0, "episodes": 1, "iterations": 0,
             "patience": 1, "tree_iterations": 0, "max_children": 1, "sft_copies": 0,
             "task_concurrency": 1}
    why = {"n_train": " (the search tasks)", "episodes": " (the episodes a tree node is scored on)"}
    for name, low in least.items():
        value = getattr(args, name)
        if isinstance(value, int) and value < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}{why.get(name, '')}, "
                         f"got {value}")


def load_task_splits(args):
    def load(split: str, n: int) -> list:
        return load_suite(args.suite, split=split, seed=args.task_seed, n=n)  # a name or a .jsonl
    train = load("train", args.n_train + args.n_prelim)
    heldout = load("heldout", args.n_heldout) if args.n_heldout > 0 else []
    # the first n_prelim tasks are for the model card only (built-in suites interleave types)
    return train[:args.n_prelim], train[args.n_prelim:], heldout


def load_gate_tasks(args, used: list) -> list:
    """--gate fresh: --gate-tasks train tasks for its sign test, disjoint (by id) from `used` (the
    preliminary, search and held-out tasks), types balanced: drawn from a longer train draw of the
    same suite and seed (a generated suite's longer draw need not begin with the shorter one, so
    what is used is left out by id). The search never scores them and the teacher never sees them.
    [] for the other gates."""
    if args.gate != "fresh":
        return []
    n_used, want = args.n_train + args.n_prelim, args.gate_tasks
    taken = {t.id for t in used}
    need = (f"--gate fresh needs --gate-tasks {want} train tasks beyond the {n_used} search and "
            f"preliminary ones (--n-train {args.n_train} + --n-prelim {args.n_prelim})")
    try:
        train = load_suite(args.suite, split="train", seed=args.task_seed, n=n_used + want)
    except ValueError as e:
        raise ValueError(f"{need}, but the suite cannot give {n_used + want} train tasks: "
                         f"{e}") from None
    by_type: dict[str, list] = {}
    for t in train:
        if t.id not in taken:
            by_type.setdefault(t.type, []).append(t)
    gate = interleave(by_type, list(by_type))[:want]
    if len(gate) < want:
        raise ValueError(f"{need}, but the train split of {args.suite} holds {len(train)} tasks, "
                         f"which leaves {len(gate)}; lower --gate-tasks, --n-train or --n-prelim, "
                         f"or use another gate")
    alpha = args.gate_alpha
    for task_type in sorted({t.type for t in used}):   # with no loss, k tasks give p = 2^-k at best
        k = sum(t.type == task_type for t in gate)
        if 0.5 ** k > alpha:
            log(f"note: only {k} gate tasks of type {task_type!r}: its tree's best node can never "
                f"pass the sign test (p >= {0.5 ** k:.3g} > α = {alpha}), so that tree keeps its "
                f"root")
    return gate


def load_base_skills(args):
    if args.base_skills:
        return fit_to_suite(SkillSet.load(args.base_skills), args.suite,
                            f"--base-skills {args.base_skills}")
    try:
        skills = load_skills("base", args.suite)   # a JSONL suite: the base skills of its types
    except FileNotFoundError as e:
        log(f"no built-in base skills for suite {args.suite!r} ({e}); starting from an empty "
            f"library")
        skills = None
    return skills if skills is not None else SkillSet(general=[], task_specific={},
                                                      common_mistakes=[])


@contextlib.contextmanager
def connect(run: Run):
    """(target, teacher): CachingClients (target calls cached on disk; both charged to the budget)
    around the endpoints, or around one embedded server that serves both."""
    args = run.args
    kw = dict(max_workers=args.task_concurrency, startup_timeout=args.startup_timeout,
              model_spec=args.model_spec, timeout=args.timeout, quantize=args.task_quantize)
    with contextlib.ExitStack() as stack:
        target_raw = stack.enter_context(embedded_client(**client_args(args, "task"), **kw))
        if args.teacher_url is None and args.task_url is None:   # one embedded server serves both
            teacher_raw = with_extra_body(target_raw, args.teacher_extra_body)
        else:
            teacher_raw = stack.enter_context(embedded_client(**client_args(args, "teacher"), **kw))
        saved = getattr(run, "usage_before", {})   # --resume: the counts continue
        try:
            target = CachingClient(target_raw, run.cache_path, run.budget,
                                   usage=saved.get("target"))
        except ValueError as e:   # a damaged target_cache.jsonl line, named (FILE:LINE)
            sys.exit(f"evolve_masa.py: the target-call cache: {e}; delete that line (or the file: "
                     f"its calls are then paid again, or pass --no-cache)")
        teacher = CachingClient(teacher_raw, None, run.budget, usage=saved.get("teacher"))
        getattr(run, "roles", {}).update(target=target, teacher=teacher)   # for run_usage
        c = run.config
        log(f"MASA stage 1 -> {run.out}: target {target.model} "
            f"({args.task_url or f'embedded, {args.device}'}), teacher {teacher.model} "
            f"({args.teacher_url or f'embedded, {args.device}'}); {len(run.tasks)} search tasks of "
            f"types {sorted({t.type for t in run.tasks})}, {len(run.heldout)} held-out; "
            f"I={c.iterations} p={c.patience} J={c.tree_iterations} N={c.episodes} C={c.c} "
            f"λ={c.lam_nh} gate={c.gate}"
            f"{f' α={c.gate_alpha}' if c.gate != 'strict' else ''}"
            f"{f' on {len(run.gate_tasks)} gate tasks' if c.gate == 'fresh' else ''}; cache "
            f"{run.cache_path or 'off'}; budget {args.max_calls or 'unlimited'} calls")
        yield target, teacher


def log(line: str) -> None:
    """A progress line on stderr, prefixed with the minutes:seconds since the start."""
    elapsed = int(time.time() - STARTED)
    print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
