"""MASA stage 1, end to end: a teacher LLM evolves a skill library for one target model.

    python evolve_masa.py                      # offline default: SmolLM2-135M as target AND teacher, small run
    python evolve_masa.py --suite qa --target-url http://gpu:8000/v1 --target-model Qwen/Qwen3-8B \\
        --teacher-url https://api.example.com/v1 --teacher-model big-model \\
        --iterations 10 --patience 3 --tree-iterations 10 --episodes 16 --out runs/masa-qwen3-8b

Steps (the algorithm and its equations are in minskill/masa.py):

1. model card: --model-card JSON, else built from --target-checkpoint's config.json (or the embedded
   default's); strengths/weaknesses summarised by the teacher from --n-prelim preliminary rollouts on
   train tasks that the search never sees;
2. hill climbing on the general skills (I = --iterations, p = --patience), R = SR − λ·NHR (λ = --lam-nh);
3. one UCB1 tree per task type with the general skills fixed (J = --tree-iterations, N = --episodes, C = --c);
4. outputs in --out: library/ (Agent Skills folders) and library.json (MASA JSON), search_log.jsonl (every
   candidate: reward, parent, phase, teacher attribution; teacher skips), sft.jsonl (rewriter records),
   heldout.md / results.json (base vs evolved on the held-out split), reward.svg, run.json, state.json.

Target calls are cached on disk (--cache, default OUT/target_cache.jsonl; --no-cache turns it off), so a
rerun or a resumed run does not pay twice. State is checkpointed after every iteration: an interrupted run
continues with --resume --out OUT. --max-calls bounds the model calls (target calls that miss the cache, plus
teacher calls) of the whole run; when it is spent the run stops cleanly and keeps the best skills so far.

`--merge RUN_DIR RUN_DIR ... --out DIR` merges the SFT records of runs on different target models and adds
"other_backbone" records (another backbone's best set as the input).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from minskill import masa
from minskill.runs import check_run_folder, open_run_folder
from minskill.client import ChatError
from minskill.masa import (BudgetExhausted, CachingClient, CallBudget, MasaConfig, MasaSearch, ModelCard,
                           write_json_atomic, write_jsonl_atomic, write_text_atomic)

# Flags that may change when a run is resumed (endpoints move, budgets grow); every other flag is restored
# from the saved run so that the resumed search is the same search.
RESUMABLE_OVERRIDES = ("max_calls", "no_cache", "cache", "target_url", "target_model", "target_api_key",
                       "teacher_url", "teacher_model", "teacher_api_key", "concurrency", "timeout", "startup_timeout")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python evolve_masa.py",
        description="MASA stage 1: hill climbing on general skills and UCB1 tree search on task-specific skills "
                    "for one target model, driven by a teacher LLM. With no endpoints, the target and the "
                    "teacher are both the embedded offline default model (one local server).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("tasks and skills")
    g.add_argument("--suite", default="qa", help="qa | household | webwalk | PATH.jsonl")
    g.add_argument("--n-train", type=int, default=24, help="search tasks (train split)")
    g.add_argument("--n-prelim", type=int, default=4,
                   help="preliminary train tasks for the card's strengths/weaknesses (apart from the search); 0 = none")
    g.add_argument("--n-heldout", type=int, default=40, help="held-out tasks of the final table; 0 = no table")
    g.add_argument("--task-seed", type=int, default=0, help="seed of the generated suite")
    g.add_argument("--base-skills", default=None,
                   help="base skill library: Agent Skills folder or MASA .json (default: the suite's built-in)")
    g = p.add_argument_group("target model and teacher")
    g.add_argument("--model-card", default=None, help="model card JSON of the target")
    g.add_argument("--target-checkpoint", default=None, help="HF folder whose config.json fills the card")
    g.add_argument("--target-url", default=None, help="OpenAI-compatible base URL of the target")
    g.add_argument("--target-model", default=None, help="model name at --target-url")
    g.add_argument("--target-api-key", default=None, help="API key of the target (default $OPENAI_API_KEY)")
    g.add_argument("--teacher-url", default=None, help="OpenAI-compatible base URL of the teacher")
    g.add_argument("--teacher-model", default=None, help="model name at --teacher-url")
    g.add_argument("--teacher-api-key", default=None, help="API key of the teacher (default $OPENAI_API_KEY)")
    g.add_argument("--model-spec", default="smollm2-135m", help="model of the embedded server (no URL given)")
    g.add_argument("--concurrency", type=int, default=16, help="requests in flight per endpoint")
    g.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for one reply (a 135M teacher on a busy CPU writes slowly)")
    g.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for the embedded server")
    g = p.add_argument_group("search")
    g.add_argument("--lam-nh", type=float, default=0.1, help="λ of R = SR − λ·NHR")
    g.add_argument("--iterations", type=int, default=2, help="I: hill-climbing iterations (paper: 10)")
    g.add_argument("--patience", type=int, default=3, help="p: stop after p iterations without improvement")
    g.add_argument("--tree-iterations", type=int, default=1, help="J: UCB1 iterations per task type (paper: 10)")
    g.add_argument("--episodes", type=int, default=6, help="N: episodes per tree-node evaluation")
    g.add_argument("--c", type=float, default=1.4, help="UCB1 exploration constant C")
    g.add_argument("--max-children", type=int, default=3, help="rewrites per tree node before descending")
    g.add_argument("--max-tokens", type=int, default=128, help="reply budget of the target per task")
    g.add_argument("--teacher-max-tokens", type=int, default=None,
                   help="reply budget of the teacher (default 1536 for --teacher-url, 384 for the slow embedded model)")
    g.add_argument("--teacher-temperature", type=float, default=0.7, help="teacher sampling temperature")
    g.add_argument("--teacher-retries", type=int, default=None,
                   help="retries of a teacher reply that does not parse (default 1 for --teacher-url; 0 for the "
                        "embedded 135M teacher, whose retries cost a minute and rarely parse)")
    g.add_argument("--seed", type=int, default=0, help="seed of target/teacher sampling and augmentations")
    g = p.add_argument_group("run control")
    g.add_argument("--max-calls", type=int, default=None, help="model-call budget of the whole run")
    g.add_argument("--cache", default=None, help="target-call cache file (default OUT/target_cache.jsonl)")
    g.add_argument("--no-cache", action="store_true", help="do not cache target calls")
    g.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    g.add_argument("--overwrite", action="store_true", help="replace the run that a non-empty --out holds, keeping "
                   "its target_cache.jsonl (without --resume or --overwrite such an --out is refused)")
    g.add_argument("--out", default=None, help="output folder (default runs/masa-SUITE-TIME)")
    g.add_argument("--sft-copies", type=int, default=1, help="augmented copies per augmentation kind in sft.jsonl")
    g.add_argument("--merge", nargs="+", default=None, metavar="RUN_DIR",
                   help="merge the SFT records of these runs (+ other_backbone records) into OUT/sft.jsonl")
    return p


STARTED = time.time()


def log(line: str) -> None:
    """A progress line on stderr, prefixed with the minutes:seconds since the start."""
    elapsed = int(time.time() - STARTED)
    print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {line}", file=sys.stderr, flush=True)


def save_checkpoint(out: Path, run_state: dict) -> None:
    """state.json and search_log.jsonl, both atomically (called after every iteration)."""
    write_json_atomic(out / "state.json", run_state)
    log_records = masa.search_log(run_state["search"] or {})
    log_records += [{"kind": "event", **e} for e in run_state["events"]]
    write_jsonl_atomic(out / "search_log.jsonl", log_records)


def load_tasks(args):
    from minskill.tasks import load_suite

    def load(split: str, n: int) -> list:
        return load_suite(args.suite, split=split, seed=args.task_seed, n=n)  # a name, or a .jsonl path
    train = load("train", args.n_train + args.n_prelim)
    heldout = load("heldout", args.n_heldout) if args.n_heldout > 0 else []
    # the first n_prelim tasks are for the model card only (built-in suites interleave types: balanced)
    return train[:args.n_prelim], train[args.n_prelim:], heldout


def load_base_skills(args):
    from minskill.rollout import load_skills
    from minskill.skills import SkillSet
    if args.base_skills:
        return SkillSet.load(args.base_skills)
    try:
        suite = Path(args.suite).stem if args.suite.endswith(".jsonl") else args.suite
        skills = load_skills("base", suite)
    except FileNotFoundError as e:
        log(f"no built-in base skills for suite {args.suite!r} ({e}); starting from an empty library")
        skills = None
    return skills if skills is not None else SkillSet(general=[], task_specific={}, common_mistakes=[])


def initial_card(args, target) -> ModelCard:
    if args.model_card:
        return ModelCard.load(args.model_card)
    if args.target_checkpoint:
        return masa.model_card_from_config(args.target_checkpoint, name=args.target_model or
                                           Path(args.target_checkpoint).name)
    if args.target_url is None:  # the embedded model: its (converted) checkpoint has a config.json
        from minskill.weights import DEFAULT_MODEL, resolve_model
        # what SmolLM2-135M-Instruct's own model card says (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct:
        # "trained on 2 trillion tokens", "SFT ... then DPO using UltraFeedback", English), which no config.json holds
        known = (dict(family="SmolLM2", variant="135M-Instruct", base_or_instruct="instruct",
                      alignment_method="SFT + DPO", training_data_size="2T tokens", multilingual=False)
                 if args.model_spec == DEFAULT_MODEL else {})
        return masa.model_card_from_config(resolve_model(args.model_spec), name=args.model_spec, **known)
    return ModelCard(name=target.model)


def heldout_table(base: dict, evolved: dict, paired: dict) -> str:
    head = ("| task type | n | success base | success evolved | Δ | NHR base | NHR evolved | steps base | "
            "steps evolved | gained / lost |\n|---|---|---|---|---|---|---|---|---|---|")
    rows = [head]
    names = list(base["per_type"]) + ["**all**"]
    for name in names:
        b = base if name == "**all**" else base["per_type"][name]
        e = evolved if name == "**all**" else evolved["per_type"][name]
        gained, lost = paired.get(name, (0, 0))
        rows.append(f"| {name} | {b['n']} | {b['success_rate']:.2f} | {e['success_rate']:.2f} | "
                    f"{e['success_rate'] - b['success_rate']:+.2f} | {b['nhr']:.2f} | {e['nhr']:.2f} | "
                    f"{b['mean_steps']:.1f} | {e['mean_steps']:.1f} | {gained} / {lost} |")
    return "\n".join(rows)


def paired_counts(base_trajs, evolved_trajs) -> dict:
    """Per type and overall: (tasks the evolved set solves and the base set does not, the reverse)."""
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
    from minskill.plot import write_svg_plot
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
        for x in (x for x in cands if x["phase"] == "tree" and x["task_type"] == task_type and x["reward"] is not None):
            best = max(best, x["reward"])
            curve.append((x["iteration"], best))
        series[f"tree {task_type}: best R"] = curve
    write_svg_plot(out / "reward.svg", series, title="MASA stage 1: reward over iterations",
                   xlabel="iteration", ylabel="R = SR − λ·NHR")


def merge(args) -> int:
    out = Path(args.out or "runs/masa-merged")
    check_run_folder(out, False, args.overwrite, "evolve_masa.py --merge")
    records = masa.merge_sft_runs(args.merge)
    open_run_folder(out, False, args.overwrite, "evolve_masa.py --merge")
    write_jsonl_atomic(out / "sft.jsonl", records)
    extra = sum(r["source"] == "other_backbone" for r in records)
    print(f"merged {len(args.merge)} runs: {len(records)} records ({extra} other_backbone) -> {out / 'sft.jsonl'}")
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args)
    out = Path(args.out or f"runs/masa-{Path(args.suite).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    state_path = out / "state.json"
    saved = None
    if args.resume:
        if not state_path.is_file():
            parser.error(f"--resume: no saved run in {out} (state.json is missing)")
        saved = json.loads(state_path.read_text(encoding="utf-8-sig"))
        explicit = {k: v for k, v in vars(args).items() if k in RESUMABLE_OVERRIDES and v != parser.get_default(k)}
        args = argparse.Namespace(**{**saved["args"], **explicit, "resume": True, "overwrite": False, "out": str(out),
                                  "merge": None})
        search_state = saved.get("search") or {"phase": "start", "candidates": []}
        log(f"resuming {out}: phase {search_state['phase']}, {len(search_state['candidates'])} candidates, "
            f"{saved['calls_spent']} calls spent")
    check_run_folder(out, args.resume, args.overwrite, "evolve_masa.py")

    embedded_teacher = args.teacher_url is None
    if args.teacher_max_tokens is None:
        args.teacher_max_tokens = 384 if embedded_teacher else 1536
    if args.teacher_retries is None:
        args.teacher_retries = 0 if embedded_teacher else 1
    config = MasaConfig(lam_nh=args.lam_nh, iterations=args.iterations, patience=args.patience,
                        tree_iterations=args.tree_iterations, episodes=args.episodes, c=args.c,
                        max_children=args.max_children, seed=args.seed, teacher_retries=args.teacher_retries,
                        teacher_temperature=args.teacher_temperature, teacher_max_tokens=args.teacher_max_tokens,
                        target_max_tokens=args.max_tokens)
    try:
        prelim, tasks, heldout = load_tasks(args)
    except (ValueError, FileNotFoundError) as e:   # a bad suite file: refused before any model call
        parser.error(str(e))
    base_skills = load_base_skills(args)
    out = open_run_folder(out, args.resume, args.overwrite, "evolve_masa.py", keep=("target_cache.jsonl",))
    suite_name = Path(args.suite).stem
    task_description = masa.suite_description(tasks, suite_name)
    budget = CallBudget(args.max_calls, spent=saved["calls_spent"] if saved else 0)
    cache_path = None if args.no_cache else Path(args.cache or out / "target_cache.jsonl")
    run_state = saved or {"version": 1, "args": {k: v for k, v in vars(args).items() if k not in ("resume", "overwrite", "merge")},
                          "card": None, "calls_spent": 0, "search": None, "events": []}
    global STARTED
    STARTED = time.time()   # progress lines and run.json count from here

    def checkpoint(search_state: dict) -> None:
        run_state["search"] = search_state
        run_state["calls_spent"] = budget.spent
        save_checkpoint(out, run_state)

    with contextlib.ExitStack() as stack:
        from minskill.server import embedded_client
        kw = dict(max_workers=args.concurrency, startup_timeout=args.startup_timeout, model_spec=args.model_spec,
                  timeout=args.timeout)
        target_raw = stack.enter_context(embedded_client(url=args.target_url, model=args.target_model,
                                                         api_key=args.target_api_key, **kw))
        if args.teacher_url is None and args.target_url is None:
            teacher_raw = target_raw  # one embedded server serves both
        else:
            teacher_raw = stack.enter_context(embedded_client(url=args.teacher_url, model=args.teacher_model,
                                                              api_key=args.teacher_api_key, **kw))
        target = CachingClient(target_raw, cache_path, budget)
        teacher = CachingClient(teacher_raw, None, budget)
        log(f"MASA stage 1 -> {out}: target {target.model} ({args.target_url or 'embedded'}), teacher "
            f"{teacher.model} ({args.teacher_url or 'embedded'}); {len(tasks)} search tasks of types "
            f"{sorted({t.type for t in tasks})}, {len(heldout)} held-out; I={config.iterations} p={config.patience} "
            f"J={config.tree_iterations} N={config.episodes} C={config.c} λ={config.lam_nh}; cache "
            f"{cache_path or 'off'}; budget {args.max_calls or 'unlimited'} calls")

        def skipped(event: dict) -> None:
            run_state["events"].append({"event": "teacher_skip", **event})
            log(f"  teacher reply skipped ({event['what']}) after {event['attempts']} attempts")

        stopped = None
        search = None
        try:
            # 1. model card
            if run_state["card"] is None:
                card = initial_card(args, target)
                if prelim and not card.weaknesses:
                    log(f"[card] summarising the target from {len(prelim)} preliminary rollouts")
                    card = masa.summarize_model(teacher, card, target, prelim, config, on_skip=skipped, budget=budget)
                run_state["card"] = card.to_json()
                card.save(out / "model_card.json")
            card = ModelCard.from_json(run_state["card"])
            # 2-3. hill climbing, then the trees
            search = MasaSearch(target, teacher, card, tasks, base_skills, config, state=run_state["search"],
                                log=log, checkpoint=checkpoint, budget=budget)
            checkpoint(search.state)
            search.run()
        except BudgetExhausted as e:
            stopped = str(e)
        except ChatError as e:  # the client already retried; an endpoint that keeps failing ends the run
            if search is not None:
                checkpoint(search.last_checkpoint)
            log(f"FAILED: {e}")
            if state_path.exists():
                log(f"The last finished iteration is saved; fix the endpoint and continue with: "
                    f"python evolve_masa.py --resume --out {out}")
            return 1
        except KeyboardInterrupt:
            if search is not None:
                checkpoint(search.last_checkpoint)
            if state_path.exists():
                log(f"interrupted; the state of the last finished iteration is in {state_path}. "
                    f"Continue with: python evolve_masa.py --resume --out {out}")
            else:
                log("interrupted before the first checkpoint; there is nothing to resume")
            return 130
        if stopped:
            if search is not None:
                search.state = search.last_checkpoint
                checkpoint(search.state)
            run_state["events"].append({"event": "budget_stop", "message": stopped})
            log(f"STOPPED: {stopped}. Keeping the best skills so far (resume with a larger --max-calls).")
        if search is None or run_state["search"]["general"] is None:
            run_state["calls_spent"] = budget.spent
            save_checkpoint(out, run_state)
            log("no skill set was evaluated; nothing to write")
            return 0

        # 4. outputs
        library = search.library()
        library.save(out / "library")
        library.save_json(out / "library.json")
        best_general = search.candidate(search.best_general())
        reward_out = best_general["reward"]
        notes = []
        try:
            log(f"[final] evolved library on the {len(tasks)} search tasks  calls {budget.spent}")
            metrics, _ = search.evaluate(library, tasks)
            reward_out = metrics["adjusted_reward"]
        except BudgetExhausted:
            notes.append("budget spent: reward_out is the best general set's R, the library was not re-evaluated")
        oneshot = None
        try:
            oneshot = masa.one_shot_rewrite(teacher, card, search.skills_of(0), task_description,
                                            retries=config.teacher_retries, temperature=config.teacher_temperature,
                                            max_tokens=config.teacher_max_tokens,
                                            seed=masa.teacher_seed(config.seed, "oneshot"), on_skip=skipped)
        except (BudgetExhausted, ChatError) as e:
            notes.append(f"no one-shot teacher rewrite in sft.jsonl ({e})")
        records = masa.sft_records(search.state, card, task_description, library, reward_out, target.model,
                                   oneshot=oneshot, seed=config.seed, copies=args.sft_copies)
        write_jsonl_atomic(out / "sft.jsonl", records)
        reward_plot(out, search.state)
        results = {"target_model": target.model, "teacher_model": teacher.model, "reward_out": reward_out,
                   "base_reward": search.candidate(0)["reward"], "stopped": stopped, "notes": notes}
        table = None
        if heldout:
            try:
                from minskill.rollout import summarize
                runs = {}
                for name, skills in (("base", search.skills_of(0)), ("evolved", library)):
                    log(f"[held-out] {name} skills on {len(heldout)} tasks  calls {budget.spent}")
                    trajs = masa.rollouts(target, heldout, skills, config, budget)
                    runs[name] = (trajs, summarize(trajs, lam_nh=config.lam_nh))
                paired = paired_counts(runs["base"][0], runs["evolved"][0])
                table = heldout_table(runs["base"][1], runs["evolved"][1], paired)
                results["heldout"] = {"base": runs["base"][1], "evolved": runs["evolved"][1],
                                      "gained_lost": {k: list(v) for k, v in paired.items()}}
                write_text_atomic(out / "heldout.md", table + "\n")
            except BudgetExhausted:
                notes.append("budget spent: no held-out evaluation (rerun with --resume and a larger --max-calls)")
        run_state["calls_spent"] = budget.spent
        save_checkpoint(out, run_state)
        write_json_atomic(out / "results.json", results)
        write_json_atomic(out / "run.json", {
            "target_model": target.model, "model_card": card.to_json(), "task_description": task_description,
            "best_skills": library.to_json(), "reward_out": reward_out, "calls_spent": budget.spent,
            "target_calls": target.calls, "target_cache_hits": target.cache_hits, "teacher_calls": teacher.calls,
            "seconds": round(time.time() - STARTED, 1), "args": run_state["args"]})

    # what it did
    s = search.state
    n_general = sum(x["phase"] == "general" for x in s["candidates"])
    n_tree = sum(x["phase"] == "tree" for x in s["candidates"])
    skips = sum(e.get("event") == "teacher_skip" for e in s["events"] + run_state["events"])
    print(f"\nMASA stage 1 on {suite_name}: target {target.model}, teacher {teacher.model}")
    print(f"base skills R = {results['base_reward']:.3f}; best general R = {best_general['reward']:.3f} "
          f"({n_general} general candidates, {sum(bool(x['accepted']) for x in s['candidates'] if x['phase'] == 'general')}"
          f" accepted); {n_tree} tree nodes over {len(s['trees'])} task types; evolved library R = {reward_out:.3f} "
          f"on the {len(tasks)} search tasks")
    print(f"calls: {budget.spent} model calls ({target.calls} target, {target.cache_hits} target cache hits, "
          f"{teacher.calls} teacher); {skips} teacher replies skipped; {time.time() - STARTED:.0f} s")
    if table:
        print(f"\nheld-out ({len(heldout)} tasks), base vs evolved skills:\n{table}")
    evaluated = [x for x in s["candidates"] if x["metrics"] is not None]
    if evaluated and max(x["metrics"]["success_rate"] for x in evaluated) == 0.0:
        rewards = {round(x["reward"], 6) for x in evaluated}
        notes.append("the target solved none of the search tasks under any skill set (success 0 everywhere); "
                     + ("R differs only through NHR." if len(rewards) > 1 else
                        "every R is equal, so the search had no signal to learn from."))
    for note in notes:
        print(f"note: {note}")
    print(f"\nwrote {out}/library/, library.json, search_log.jsonl, sft.jsonl ({len(records)} records), "
          f"reward.svg, results.json, run.json" + (", heldout.md" if table else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
