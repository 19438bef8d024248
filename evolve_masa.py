"""MASA stage 1, end to end: a teacher LLM evolves a skill library for one target model.

    python evolve_masa.py                      # offline default: SmolLM2-135M as target AND teacher, small run
    python evolve_masa.py --suite qa --task-url http://gpu:8000/v1 --task-model Qwen/Qwen3-8B \\
        --teacher-url https://api.example.com/v1 --teacher-model big-model \\
        --iterations 10 --patience 3 --tree-iterations 10 --episodes 16 --out runs/masa-qwen3-8b

Steps (the algorithm and its equations are in minskill/masa/search.py):

1. model card: --model-card JSON or YAML, else built from --target-checkpoint's config.json (or the embedded
   default's); strengths/weaknesses summarised by the teacher from --n-prelim preliminary rollouts on
   train tasks that the search never sees;
2. hill climbing on the general skills (I = --iterations, p = --patience), R = SR − λ·NHR (λ = --lam-nh);
3. one UCB1 tree per task type with the general skills fixed (J = --tree-iterations, N = --episodes, C = --c);
   --gate strict|paired|fresh (minskill/gates.py) decides what a climb candidate and a tree's best node must
   show to replace the incumbent (fresh: a sign test on --gate-tasks more train tasks, apart from the search,
   the preliminary and the held-out tasks; `load_gate_tasks`); every decision is recorded on the candidate
   (`gate` in state.json, search_log.jsonl);
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
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from minskill import gates
from minskill.cli import (DefaultsHelpFormatter, add_device_args, add_task_model_args, add_teacher_args, client_args,
                          with_extra_body)
from minskill.files import read_json, write_json_atomic, write_jsonl_atomic, write_text_atomic
from minskill.masa import data as masa_data, search as masa
from minskill.masa.model_card import ModelCard, target_model_card
from minskill.masa.run_config import MasaRunConfig, check_state
from minskill.masa.search import MasaConfig, MasaSearch
from minskill.plot import write_svg_plot
from minskill.retrieval import (RetrievalError, add_retrieval_args, check_retrieval_args, retriever_from_args,
                                with_retrieval)
from minskill.rollout import all_failed, fit_to_suite, load_skills, summarize
from minskill.runs import (check_run_folder, given_flags, open_run_folder, restart_flags,
                           resume_flags, started_flags)
from minskill.serve.caching import BudgetExhausted, CachingClient, CallBudget
from minskill.serve.client import ChatError
from minskill.serve.embedded import embedded_client
from minskill.skillsets import SkillSet
from minskill.tasks import load_suite
from minskill.tasks.base import interleave


DEFAULTS = MasaRunConfig()   # every default of this script's flags, written once (argparse reads them)
# the embedded 135M teacher: short replies and no retry (a retry costs a minute and rarely parses)
EMBEDDED_TEACHER = {"teacher_retries": 0, "teacher_max_tokens": 384}
# --resume (minskill.runs.resume_flags): the flags that may change when a run is resumed (endpoints move, budgets
# grow); every other flag is the saved run's, and given with another value is refused: the same search continues.
RESUMABLE_OVERRIDES = ("max_calls", "no_cache", "cache", "task_url", "task_model", "task_api_key",
                       "teacher_url", "teacher_model", "teacher_api_key", "task_concurrency", "timeout",
                       "startup_timeout", "task_extra_body", "teacher_extra_body",
                       "embed_url", "embed_model", "device", "teacher_json_schema")


def build_parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    p = argparse.ArgumentParser(
        prog="python evolve_masa.py", usage="%(prog)s [main options] [other options, grouped below]",
        description="MASA stage 1: hill climbing on general skills and UCB1 tree search on task-specific skills "
                    "for one target model, driven by a teacher LLM. With no endpoints, the target and the "
                    "teacher are both the embedded offline default model (one local server).",
        formatter_class=DefaultsHelpFormatter)
    m = p.add_argument_group("main options")
    g = p.add_argument_group("tasks and skills")
    m.add_argument("--suite", default=d.suite, help="qa | household | webwalk | webshop | searchqa | PATH.jsonl")
    g.add_argument("--n-train", type=int, default=d.n_train, help="search tasks (train split)")
    g.add_argument("--n-prelim", type=int, default=d.n_prelim,
                   help="preliminary train tasks for the card's strengths/weaknesses (apart from the search); 0 = none")
    g.add_argument("--n-heldout", type=int, default=d.n_heldout, help="held-out tasks of the final table; 0 = no table")
    g.add_argument("--task-seed", type=int, default=d.task_seed, help="seed of the generated suite")
    g.add_argument("--base-skills", default=None,
                   help="base skill library: Agent Skills folder or MASA .json (default: the suite's built-in)")
    add_retrieval_args(p.add_argument_group("retrieval in the held-out evaluation (minskill.retrieval)"))
    g = p.add_argument_group("target model and teacher")
    g.add_argument("--model-card", default=None, help="model card of the target: JSON, or YAML as MASA's "
                   "model_cards/*.yaml (minskill.masa.model_card)")
    g.add_argument("--target-checkpoint", default=None, help="HF folder whose config.json fills the card")
    add_task_model_args(g, concurrency=d.task_concurrency, max_tokens=d.target_max_tokens,
                        url_help="; the task model is MASA's target, the "
                        "model the skills are adapted for", main=m)
    add_teacher_args(g, main=m)
    g.add_argument("--model-spec", default=d.model_spec, help="model of the embedded server (no URL given)")
    g.add_argument("--timeout", type=float, default=d.timeout,
                   help="seconds to wait for one reply (a 135M teacher on a busy CPU writes slowly)")
    g.add_argument("--startup-timeout", type=float, default=d.startup_timeout, help="seconds to wait for the embedded server")
    add_device_args(g, bf16=False, what="the embedded server (target and teacher) runs")
    g = p.add_argument_group("search")
    m.add_argument("--lam-nh", type=float, default=d.lam_nh, help="λ of R = SR − λ·NHR")
    m.add_argument("--iterations", type=int, default=d.iterations, help="I: hill-climbing iterations (paper: 10)")
    g.add_argument("--patience", type=int, default=d.patience, help="p: stop after p iterations without improvement")
    m.add_argument("--tree-iterations", type=int, default=d.tree_iterations,
                   help="J: UCB1 iterations per task type (paper: 10)")
    m.add_argument("--episodes", type=int, default=d.episodes, help="N: episodes per tree-node evaluation")
    g.add_argument("--c", type=float, default=d.c, help="UCB1 exploration constant C")
    g.add_argument("--max-children", type=int, default=d.max_children, help="rewrites per tree node before descending")
    m.add_argument("--gate", choices=gates.MASA_GATES, default=d.gate, help="acceptance gate of the climb and of "
                   "each tree's result: strict = R strictly higher (the paper); paired = also a one-sided exact sign "
                   "test on the per-task rewards at --gate-alpha; fresh = R strictly higher and that sign test on "
                   "--gate-tasks train tasks the search never scores nor shows the teacher (minskill/gates.py); "
                   "fixed on --resume")
    g.add_argument("--gate-alpha", type=float, default=d.gate_alpha, help="α of --gate paired / fresh")
    g.add_argument("--gate-tasks", type=int, default=d.gate_tasks, help="--gate fresh: train tasks drawn after the "
                   "search and preliminary ones for its sign test (the climb uses all, a tree those of its type)")
    g.add_argument("--teacher-max-tokens", type=int, default=None,
                   help=f"reply budget of the teacher (default {d.teacher_max_tokens} for --teacher-url, "
                        f"{EMBEDDED_TEACHER['teacher_max_tokens']} for the slow embedded model)")
    g.add_argument("--teacher-temperature", type=float, default=d.teacher_temperature,
                   help="teacher sampling temperature")
    g.add_argument("--teacher-retries", type=int, default=None,
                   help=f"retries of a teacher reply that does not parse (default {d.teacher_retries} for "
                        f"--teacher-url; {EMBEDDED_TEACHER['teacher_retries']} for the embedded 135M teacher, whose "
                        "retries cost a minute and rarely parse)")
    g.add_argument("--seed", type=int, default=d.seed, help="seed of target/teacher sampling and augmentations")
    g = p.add_argument_group("run control")
    m.add_argument("--max-calls", type=int, default=None, help="model-call budget of the whole run")
    g.add_argument("--cache", default=None, help="target-call cache file (default OUT/target_cache.jsonl)")
    g.add_argument("--no-cache", action="store_true", help="do not cache target calls")
    m.add_argument("--resume", action="store_true", help="continue the run saved in --out (the resume "
                   "policy: minskill/runs.py)")
    m.add_argument("--overwrite", action="store_true", help="replace the run that a non-empty --out holds, keeping "
                   "its target_cache.jsonl (without --resume or --overwrite such an --out is refused)")
    m.add_argument("--out", default=None, help="output folder (default runs/masa-SUITE-TIME)")
    g.add_argument("--sft-copies", type=int, default=d.sft_copies,
                   help="augmented copies per augmentation kind in sft.jsonl")
    m.add_argument("--merge", nargs="+", default=None, metavar="RUN_DIR",
                   help="merge the SFT records of these runs (+ other_backbone records) into OUT/sft.jsonl")
    return p


STARTED = time.time()


def log(line: str) -> None:
    """A progress line on stderr, prefixed with the minutes:seconds since the start."""
    elapsed = int(time.time() - STARTED)
    print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {line}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# The run: set-up and resume

@dataclass
class Run:
    """What one run works with. `state` is what state.json holds: the arguments, the model card, the calls
    spent, the search (MasaSearch.to_json) and the run's own events (teacher skips, budget stop)."""
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
    gate_tasks: list = field(default_factory=list)     # --gate fresh: its gate tasks (load_gate_tasks)
    roles: dict = field(default_factory=dict)   # "target", "teacher": their CachingClients, once connected
    card: ModelCard | None = None   # the target's card before the teacher's summary (initial_card), if known yet


def run_usage(run: Run) -> dict:
    """The cost per role of the whole run so far, continued across --resume as calls_spent is: the target's and
    the teacher's calls, tokens, request and busy seconds (client.Usage; the target's cache hits apart, at no
    cost), and the run's wall seconds over all its sessions. Saved in state.json at every checkpoint."""
    saved = run.usage_before
    return {**{role: saved[role] for role in ("target", "teacher") if role in saved},
            **{role: client.usage for role, client in run.roles.items()},
            "wall_seconds": round(saved.get("wall_seconds", 0.0) + time.time() - STARTED, 3),
            "sessions": saved.get("sessions", 0) + 1}


def resume_args(parser: argparse.ArgumentParser, args: argparse.Namespace, out: Path, argv=None):
    """--resume: (the arguments of the resume policy, minskill.runs.resume_flags: the saved run's where `argv`
    gives none, a given one of RESUMABLE_OVERRIDES taken, another that differs refused; the saved
    state, None for a run stopped before its first checkpoint: it starts again, restart_flags)."""
    state_path = out / "state.json"
    if not state_path.is_file() and started_flags(out, "evolve_masa.py") is None:
        parser.error(f"--resume: no saved run in {out} (state.json is missing)")
    try:
        where = f"--resume: {state_path}"
        saved = check_state(read_json(state_path, where), where) if state_path.is_file() else None
    except ValueError as e:   # a state.json cut, edited by hand or nested too deeply: say so, no traceback
        parser.error(str(e))
    args.out = str(out)
    flags = saved["args"] if saved else restart_flags(out, "evolve_masa.py", say=log)
    resume_flags(args, flags, given_flags(parser, argv), RESUMABLE_OVERRIDES, "evolve_masa.py")
    if saved:
        search_state = saved.get("search") or {"phase": "start", "candidates": []}
        log(f"resuming {out}: phase {search_state['phase']}, {len(search_state['candidates'])} "
            f"candidates, {saved['calls_spent']} calls spent")
    return args, saved


def set_up(parser: argparse.ArgumentParser, args: argparse.Namespace, argv=None) -> Run:
    """Resume or start: arguments (`argv`: the command line they were parsed from, for --resume), config, tasks
    and base skills (a bad suite is refused before any model call), the run folder, the budget and the state."""
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
    config = MasaConfig(**{f.name: getattr(args, f.name) for f in fields(MasaConfig) if hasattr(args, f.name)},
                        target_max_tokens=args.task_max_tokens)   # the search's knobs: flags of the same names
    try:
        prelim, tasks, heldout = load_tasks(args)
        gate_tasks = load_gate_tasks(args, prelim + tasks + heldout)
    except (ValueError, FileNotFoundError) as e:   # a bad suite file, too few gate tasks: before any model call
        parser.error(str(e))
    if not tasks:   # MasaSearch would refuse it, but only after the preliminary calls and the run folder
        n = len(prelim)
        parser.error(f"--suite {args.suite}: no search tasks: its train split gives {n} task{'s' * (n != 1)}, and "
                     f"the first --n-prelim {args.n_prelim} are the preliminary ones; lower --n-prelim or give a "
                     f"suite with more train tasks")
    gate_ids = [t.id for t in gate_tasks]
    if saved is not None and saved.get("gate_tasks", gate_ids) != gate_ids:
        differ = sorted(set(gate_ids) ^ set(saved["gate_tasks"]))
        parser.error(f"--resume: the suite now gives other gate tasks than the saved run's ({len(gate_ids)} vs "
                     f"{len(saved['gate_tasks'])}; differing ids: {', '.join(differ[:3])})")
    try:
        base_skills = load_base_skills(args)
    except ValueError as e:   # SkillFormatError: a bad --base-skills folder or .json, named
        parser.error(f"--base-skills {args.base_skills}: {e}")
    card = None
    if saved is None or saved.get("card") is None:
        try:   # a bad --model-card or checkpoint: refused before any model call or file
            card = initial_card(args)
        except (OSError, ValueError, RuntimeError) as e:
            flag = "--model-card" if args.model_card else ("--target-checkpoint" if args.target_checkpoint
                                                           else "--model-spec")
            parser.error(f"{flag}: {e}")
    if args.cache and not args.no_cache and Path(args.cache).is_symlink():   # (appends: through it)
        parser.error(f"--cache {args.cache} is a symbolic link; a run writes no file through one")
    state = saved or {"version": 1, "args": {k: v for k, v in vars(args).items()
                                             if k not in ("resume", "overwrite", "merge")},
                      "card": None, "calls_spent": 0, "search": None, "events": [], "gate_tasks": gate_ids}
    out = open_run_folder(out, args.resume, args.overwrite, "evolve_masa.py",
                          keep=("target_cache.jsonl",), settings=state["args"])
    STARTED = time.time()   # progress lines and run.json count from here
    return Run(args, out, state, config, prelim, tasks, heldout, base_skills,
               CallBudget(args.max_calls, spent=saved["calls_spent"] if saved else 0),
               None if args.no_cache else Path(args.cache or out / "target_cache.jsonl"),
               masa_data.suite_description(tasks, Path(args.suite).stem),
               usage_before=dict(state.get("usage") or {}), gate_tasks=gate_tasks, card=card)   # usage: continued


def check_search_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Counts that leave the search nothing to do, or that it cannot run with, refused before any model call or
    file (MasaSearch would find them only after the preliminary calls and the run folder)."""
    least = {"n_train": 1, "n_prelim": 0, "n_heldout": 0, "episodes": 1, "iterations": 0, "patience": 1,
             "tree_iterations": 0, "max_children": 1, "sft_copies": 0, "task_concurrency": 1}
    why = {"n_train": " (the search tasks)", "episodes": " (the episodes a tree node is scored on)"}
    for name, low in least.items():
        value = getattr(args, name)
        if isinstance(value, int) and value < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}{why.get(name, '')}, got {value}")


def load_tasks(args):
    def load(split: str, n: int) -> list:
        return load_suite(args.suite, split=split, seed=args.task_seed, n=n)  # a name, or a .jsonl path
    train = load("train", args.n_train + args.n_prelim)
    heldout = load("heldout", args.n_heldout) if args.n_heldout > 0 else []
    # the first n_prelim tasks are for the model card only (built-in suites interleave types: balanced)
    return train[:args.n_prelim], train[args.n_prelim:], heldout


def load_gate_tasks(args, used: list) -> list:
    """--gate fresh: --gate-tasks train tasks for its sign test, disjoint (by id) from `used` (the preliminary,
    search and held-out tasks), types balanced: drawn from a longer train draw of the same suite and seed (a
    generated suite's longer draw need not begin with the shorter one, so what is used is left out by id).
    The search never scores them and the teacher never sees them. [] for the other gates."""
    if args.gate != "fresh":
        return []
    n_used, want = args.n_train + args.n_prelim, args.gate_tasks
    taken = {t.id for t in used}
    need = (f"--gate fresh needs --gate-tasks {want} train tasks beyond the {n_used} search and preliminary ones "
            f"(--n-train {args.n_train} + --n-prelim {args.n_prelim})")
    try:
        train = load_suite(args.suite, split="train", seed=args.task_seed, n=n_used + want)
    except ValueError as e:
        raise ValueError(f"{need}, but the suite cannot give {n_used + want} train tasks: {e}") from None
    by_type: dict[str, list] = {}
    for t in train:
        if t.id not in taken:
            by_type.setdefault(t.type, []).append(t)
    gate = interleave(by_type, list(by_type))[:want]
    if len(gate) < want:
        raise ValueError(f"{need}, but the train split of {args.suite} holds {len(train)} tasks, which leaves "
                         f"{len(gate)}; lower --gate-tasks, --n-train or --n-prelim, or use another gate")
    alpha = args.gate_alpha
    for task_type in sorted({t.type for t in used}):   # with no loss, k tasks give p = 2^-k at best
        k = sum(t.type == task_type for t in gate)
        if 0.5 ** k > alpha:
            log(f"note: only {k} gate tasks of type {task_type!r}: its tree's best node can never pass the sign "
                f"test (p >= {0.5 ** k:.3g} > α = {alpha}), so that tree keeps its root")
    return gate


def load_base_skills(args):
    if args.base_skills:
        return fit_to_suite(SkillSet.load(args.base_skills), args.suite, f"--base-skills {args.base_skills}")
    try:
        skills = load_skills("base", args.suite)   # a JSONL suite: the base skills of its task types
    except FileNotFoundError as e:
        log(f"no built-in base skills for suite {args.suite!r} ({e}); starting from an empty library")
        skills = None
    return skills if skills is not None else SkillSet(general=[], task_specific={}, common_mistakes=[])


@contextlib.contextmanager
def connect(run: Run):
    """(target, teacher): CachingClients (target calls cached on disk; both charged to the budget) around the
    endpoints, or around one embedded server that serves both."""
    args = run.args
    kw = dict(max_workers=args.task_concurrency, startup_timeout=args.startup_timeout, model_spec=args.model_spec,
              timeout=args.timeout, quantize=args.task_quantize)
    with contextlib.ExitStack() as stack:
        target_raw = stack.enter_context(embedded_client(**client_args(args, "task"), **kw))
        if args.teacher_url is None and args.task_url is None:   # one embedded server serves both
            teacher_raw = with_extra_body(target_raw, args.teacher_extra_body)
        else:
            teacher_raw = stack.enter_context(embedded_client(**client_args(args, "teacher"), **kw))
        saved = getattr(run, "usage_before", {})   # --resume: the counts continue
        try:
            target = CachingClient(target_raw, run.cache_path, run.budget, usage=saved.get("target"))
        except ValueError as e:   # a damaged target_cache.jsonl line, named (FILE:LINE)
            sys.exit(f"evolve_masa.py: the target-call cache: {e}; delete that line (or the file: its calls are "
                     f"then paid again, or pass --no-cache)")
        teacher = CachingClient(teacher_raw, None, run.budget, usage=saved.get("teacher"))
        getattr(run, "roles", {}).update(target=target, teacher=teacher)   # for run_usage
        c = run.config
        log(f"MASA stage 1 -> {run.out}: target {target.model} ({args.task_url or f'embedded, {args.device}'}), teacher "
            f"{teacher.model} ({args.teacher_url or f'embedded, {args.device}'}); {len(run.tasks)} search tasks of types "
            f"{sorted({t.type for t in run.tasks})}, {len(run.heldout)} held-out; I={c.iterations} p={c.patience} "
            f"J={c.tree_iterations} N={c.episodes} C={c.c} λ={c.lam_nh} gate={c.gate}"
            f"{f' α={c.gate_alpha}' if c.gate != 'strict' else ''}"
            f"{f' on {len(run.gate_tasks)} gate tasks' if c.gate == 'fresh' else ''}; cache "
            f"{run.cache_path or 'off'}; budget {args.max_calls or 'unlimited'} calls")
        yield target, teacher


def save_checkpoint(out: Path, run_state: dict) -> None:
    """state.json and search_log.jsonl, both atomically (called after every iteration)."""
    write_json_atomic(out / "state.json", run_state)
    write_jsonl_atomic(out / "search_log.jsonl", masa.search_log(run_state["search"] or {}) +
                       [{"kind": "event", **e} for e in run_state["events"]])


def checkpoint(run: Run, search_state: dict) -> None:
    run.state.update(search=search_state, calls_spent=run.budget.spent, usage=run_usage(run))
    save_checkpoint(run.out, run.state)


def teacher_skipped(run: Run, event: dict) -> None:
    run.state["events"].append({"event": "teacher_skip", **event})
    log(teacher_event_line(event))


def teacher_event_line(event: dict) -> str:
    """A teacher event (minskill.masa.fitting: a reply skipped, a prompt sent trimmed) as a progress line."""
    last = f"last error: {event['errors'][-1][:160] if event.get('errors') else '?'}"
    if event.get("event") == "teacher_trim":
        return (f"  teacher prompt ({event['what']}) refused as too long for the server's context; sent trimmed to "
                f"level {event['trim']} (less history first, then fewer examples)")
    why = {"prompt too long": "the server refused the prompt as too long for its context at every trim level (a "
                              "smaller --teacher-max-tokens or a larger server context leaves it room)",
           "budget spent": "the call budget was spent before a retry"}.get(event.get("reason"), "did not parse")
    return f"  teacher reply skipped ({event['what']}): {event['attempts']} attempts; {why}; {last}"


def log_progress(search: MasaSearch, shown: int, line: str | None = None) -> int:
    """Print the search's teacher events (after the first `shown`), then `line`; returns its event count."""
    for event in search.events[shown:]:
        log(teacher_event_line(event))
    if line is not None:
        log(line)
    return len(search.events)


def keep_cut_events(run: Run, search: MasaSearch) -> None:
    """The teacher events of the iteration cut short (by the budget, a failing endpoint, Ctrl-C), whose work is rolled
    back to the last checkpoint and redone on --resume: their calls were paid, so they stay in the run's events
    (state.json, search_log.jsonl) and in its count of skipped replies, marked "cut_short"."""
    done = len(search.last_checkpoint["events"])
    run.state["events"].extend({**event, "cut_short": True} for event in search.events[done:])


# ----------------------------------------------------------------------------------------------------------
# The phases

def initial_card(args, target=None) -> ModelCard | None:
    """The target's card before the teacher's summary: --model-card, else built from --target-checkpoint or the
    embedded model's spec (model_card.target_model_card, the builder rewrite.py apply and transfer use too), else
    (a URL target) just its name, once `target` is connected (None before)."""
    if args.model_card:
        return ModelCard.load(args.model_card)
    if args.target_checkpoint:
        return target_model_card(args.target_checkpoint, name=args.task_model)
    if args.task_url is None:  # the embedded model: its (converted) checkpoint has a config.json
        return target_model_card(args.model_spec)
    return None if target is None else ModelCard(name=target.model)


def model_card(run: Run, target, teacher) -> ModelCard:
    """1. The target's card; its strengths and weaknesses summarised from the preliminary rollouts, once."""
    if run.state["card"] is None:
        card = getattr(run, "card", None) or initial_card(run.args, target)
        if run.prelim and not card.weaknesses:
            log(f"[card] summarising the target from {len(run.prelim)} preliminary rollouts")
            card = masa.summarize_model(teacher, card, target, run.prelim, run.config,
                                        on_skip=lambda event: teacher_skipped(run, event), budget=run.budget)
        run.state["card"] = card.to_json()
        card.save(run.out / "model_card.json")
    return ModelCard.from_json(run.state["card"])


def run_search(run: Run, target, teacher) -> tuple[MasaSearch | None, str | None]:
    """1-3: the card, hill climbing, the trees; after every iteration its progress is printed and the search's
    state saved (checkpointed). Returns (the search, or None when the budget ran out before it began; why it
    stopped early, or None). On a spent budget the search is rolled back to its last checkpoint (an iteration cut
    short is not a result); on an endpoint failure or Ctrl-C that checkpoint is saved and the exception passes on."""
    search, shown = None, 0
    try:
        search = MasaSearch(target, teacher, model_card(run, target, teacher), run.tasks, run.base_skills, run.config,
                            run.state["search"], run.budget, run.gate_tasks)   # 1. the card, then 2-3
        checkpoint(run, search.to_json())
        shown = len(search.events)   # an earlier session printed those
        for line in search.run():   # after every iteration: its progress printed, the search's state saved
            shown = log_progress(search, shown, line)
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


# ----------------------------------------------------------------------------------------------------------
# 4. Outputs

def write_outputs(run: Run, search: MasaSearch, target, teacher, stopped: str | None) -> dict:
    """library/, library.json, sft.jsonl, reward.svg, heldout.md, results.json, run.json, state.json.
    What the budget no longer allows is left out and said in `notes`."""
    out, config, notes = run.out, run.config, []
    library = search.library().carry_resources(run.base_skills)   # resources: by name, from the input
    library.save(out / "library")
    library.save_json(out / "library.json")
    reward_out = search.climb.best.reward
    try:
        log(f"[final] evolved library on the {len(run.tasks)} search tasks  calls {run.budget.spent}")
        reward_out = search.evaluate(library, run.tasks)[0]["adjusted_reward"]
    except BudgetExhausted:
        notes.append("budget spent: reward_out is the best general set's R, the library was not re-evaluated")
    oneshot = None
    try:
        oneshot = masa.one_shot_rewrite(teacher, search.card, search.candidates[0].skills, run.task_description,
                                        retries=config.teacher_retries, temperature=config.teacher_temperature,
                                        max_tokens=config.teacher_max_tokens,
                                        seed=masa.teacher_seed(config.seed, "oneshot"),
                                        on_skip=lambda event: teacher_skipped(run, event),
                                        json_schema=config.teacher_json_schema)
    except (BudgetExhausted, ChatError) as e:
        notes.append(f"no one-shot teacher rewrite in sft.jsonl ({e})")
    records = masa_data.sft_records(run.state["search"], search.card, run.task_description, library, reward_out,
                                    target.model, oneshot=oneshot, seed=config.seed, copies=run.args.sft_copies)
    write_jsonl_atomic(out / "sft.jsonl", records)
    reward_plot(out, run.state["search"])
    results = {"target_model": target.model, "teacher_model": teacher.model, "reward_out": reward_out,
               "base_reward": search.candidates[0].reward, "stopped": stopped, "notes": notes}
    table = heldout_evaluation(run, search, target, library, results)
    run.state.update(calls_spent=run.budget.spent, usage=run_usage(run))
    save_checkpoint(out, run.state)
    write_json_atomic(out / "results.json", results)
    write_json_atomic(out / "run.json", {
        "target_model": target.model, "model_card": search.card.to_json(), "task_description": run.task_description,
        "best_skills": library.to_json(), "reward_out": reward_out, "calls_spent": run.budget.spent,
        "target_calls": target.calls, "target_cache_hits": target.cache_hits, "teacher_calls": teacher.calls,
        "seconds": round(time.time() - STARTED, 1), "usage": run.state["usage"], "args": run.state["args"]})
    return {"results": results, "records": len(records), "table": table}


def heldout_evaluation(run: Run, search: MasaSearch, target, library: SkillSet, results: dict) -> str | None:
    """Base vs evolved skills on the held-out split: heldout.md and results["heldout"]; the table, or None (and
    results["heldout_error"] when every rollout of a set ended with an error: rollout.all_failed; main exits 1)."""
    if not run.heldout:
        return None
    try:
        runs = {}   # with --retrieve: embeddings from --embed-url, else the target's own endpoint (not cached)
        retriever = retriever_from_args(run.args, getattr(target, "inner", target), run.args.task_api_key)
        for name, skills in (("base", search.candidates[0].skills), ("evolved", library)):
            log(f"[held-out] {name} skills on {len(run.heldout)} tasks  calls {run.budget.spent}")
            trajs = masa.rollouts(target, run.heldout, with_retrieval(skills, retriever), run.config, run.budget)
            if all_failed(trajs):   # the target stopped answering: no table of 0s
                results["heldout_error"] = f"the {name} skills on the held-out split: {all_failed(trajs)}"
                log(f"[held-out] not evaluated: {results['heldout_error']}")
                return None
            runs[name] = (trajs, summarize(trajs, lam_nh=run.config.lam_nh))
    except BudgetExhausted:
        results["notes"].append("budget spent: no held-out evaluation (rerun with --resume and a larger --max-calls)")
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
    head = ("| task type | n | success base | success evolved | Δ | NHR base | NHR evolved | steps base | "
            "steps evolved | gained / lost | errors base | errors evolved |\n" + "|---" * 12 + "|")
    rows = [head]
    names = list(base["per_type"]) + ["**all**"]
    for name in names:
        b = base if name == "**all**" else base["per_type"][name]
        e = evolved if name == "**all**" else evolved["per_type"][name]
        gained, lost = paired.get(name, (0, 0))
        rows.append(f"| {name} | {b['n']} | {b['success_rate']:.2f} | {e['success_rate']:.2f} | "
                    f"{e['success_rate'] - b['success_rate']:+.2f} | {b['nhr']:.2f} | {e['nhr']:.2f} | "
                    f"{b['mean_steps']:.1f} | {e['mean_steps']:.1f} | {gained} / {lost} | "
                    f"{b['errors']} | {e['errors']} |")
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


def calls_lines(run: Run, target, teacher, skips: int) -> str:
    """The calls of this session (they add up: target + teacher, each call sent, failed or not, as the budget counts
    it) and, after a --resume, of the whole run (the budget's count); then the whole run's cost per role (failed
    calls, e.g. prompts refused as too long, apart)."""
    usage, session = run.state["usage"], run.budget.spent_this_session
    whole = f", {run.budget.spent} in the whole run ({usage['sessions']} sessions)" if usage["sessions"] > 1 else ""
    per_role = "; ".join(f"{role} {u['calls']} calls" + (f" (+{u['failures']} failed)" if u.get("failures") else "")
                         + f", {u['prompt_tokens'] + u['completion_tokens']} tokens, {u['busy_seconds']:.0f} s busy"
                         for role, u in usage.items() if isinstance(u, dict))
    return (f"calls: {session} model calls ({target.calls} target, {target.cache_hits} target cache hits, "
            f"{teacher.calls} teacher) this session{whole}; {skips} teacher replies skipped"
            f"{' in the whole run' if whole else ''}; {time.time() - STARTED:.0f} s\n"
            f"whole run: {per_role}; {usage['wall_seconds']:.0f} s wall")


def print_summary(run: Run, search: MasaSearch, target, teacher, written: dict) -> None:
    """What the run did, on stdout."""
    s, results, table = run.state["search"], written["results"], written["table"]
    n_general = sum(x["phase"] == "general" for x in s["candidates"])
    n_tree = sum(x["phase"] == "tree" for x in s["candidates"])
    accepted = sum(bool(x["accepted"]) for x in s["candidates"] if x["phase"] == "general")
    skips = sum(e.get("event") == "teacher_skip" for e in s["events"] + run.state["events"])
    print(f"\nMASA stage 1 on {Path(run.args.suite).stem}: target {target.model}, teacher {teacher.model}")
    print(f"base skills R = {results['base_reward']:.3f}; best general R = {search.climb.best.reward:.3f} "
          f"({n_general} general candidates, {accepted} accepted); {n_tree} tree nodes over {len(s['trees'])} task "
          f"types; evolved library R = {results['reward_out']:.3f} on the {len(run.tasks)} search tasks")
    print(calls_lines(run, target, teacher, skips))
    if table:
        print(f"\nheld-out ({len(run.heldout)} tasks), base vs evolved skills:\n{table}")
    notes = list(results["notes"])
    evaluated = [x for x in s["candidates"] if x["metrics"] is not None]
    if evaluated and max(x["metrics"]["success_rate"] for x in evaluated) == 0.0:
        rewards = {round(x["reward"], 6) for x in evaluated}
        notes.append("the target solved none of the search tasks under any skill set (success 0 everywhere); "
                     + ("R differs only through NHR." if len(rewards) > 1 else
                        "every R is equal, so the search had no signal to learn from."))
    for note in notes:
        print(f"note: {note}")
    print(f"\nwrote {run.out}/library/, library.json, search_log.jsonl, sft.jsonl ({written['records']} records), "
          f"reward.svg, results.json, run.json" + (", heldout.md" if table else ""))


def merge(args) -> int:
    out = Path(args.out or "runs/masa-merged")
    check_run_folder(out, False, args.overwrite, "evolve_masa.py --merge", resumable=False)
    records = masa_data.merge_sft_runs(args.merge)
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
    run = set_up(parser, args, argv)
    with connect(run) as (target, teacher):
        try:   # a failing endpoint, or a target that answered none of an evaluation (TargetFailed)
            search, stopped = run_search(run, target, teacher)         # 1-3: card, hill climbing, trees
            if search is None or search.climb is None:
                run.state.update(calls_spent=run.budget.spent, usage=run_usage(run))
                save_checkpoint(run.out, run.state)
                log("no skill set was evaluated; nothing to write")
                return 0
            written = write_outputs(run, search, target, teacher, stopped)   # 4: outputs
        except (ChatError, KeyboardInterrupt) as e:
            return stopped_by(run, e)
    print_summary(run, search, target, teacher, written)
    if written["results"].get("heldout_error"):   # the library is written; the held-out table is not
        log(f"error: no held-out table: {written['results']['heldout_error']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
