"""Evaluating skill editors (`python train_grpo.py --eval`): the paper's rows on held-out instances,
and the training run's held-out probe (`--probe-every`).

Each held-out instance has m = --tasks-per-instance tasks that the editor evolves the skill on (the
loop of minskill.skill_r1, with their verifier feedback) and --eval-tasks *other* tasks of the same
type on which the carried skill is scored (default 12 instances x 20 = 240 scoring tasks per row;
--eval-scoring shared: the instances of a type are all scored on the same --eval-tasks tasks of that
type, for a small split):

    success = share of those evaluation tasks solved with the skill carried after the last
    generation

The rows: no skill; the seed skill (--seed-skills; with none, the no-skill row's scores: the same
requests, not sent again); Skill-R1 inference-only (--editor, never trained); vanilla GRPO
(--grpo-editor, trained with λ = 0); Skill-R1 (--skillr1-editor, λ > 0, one row per editor
given). Every row sees the same tasks and seeds. An editor row also reports the
success of the skill carried after each generation g, and the task-model requests spent writing the
skills (evolve) apart from those spent scoring them (evaluate); a trained editor's row prints its KL
to the frozen editor on the skills it wrote (how far training moved it). A task's score is the mean
over its n rollouts (n identical greedy replies count once). A second table compares the rows paired
on the same tasks (minskill.paired.compare): every row against no skill, each Skill-R1 row against
every other row, and vanilla GRPO against inference-only. The unit is the instance (its scoring
tasks share the one skill evolved on it, so they are not independent): the mean per-instance
difference D̄ with the 95% interval by instance and the p of the exact sign-flip permutation test
on the J per-instance differences; the tasks gained / lost are counted per task, as a description
only (not a test). A trained editor's λ is read from its checkpoint, so a row cannot silently show
the wrong method.

`--eval` also writes a run folder (--out, default runs/skill-r1-eval-TIME; a non-empty one is
refused without --overwrite or --resume): OUT/eval.json (`eval_record`), rewritten after each chunk
of --eval-chunk instances of each row (default: all at once), so that --resume continues a killed
evaluation after its last whole chunk with the flags it saved; it holds the flags, the instances and
their tasks, per row the per-task scores, the skills each editor wrote on every instance (each
generation's candidates with their rewards, the carried skill), the KL, the cost (the task model's
calls, tokens, request and busy seconds from client.Usage; the editor's sampled tokens and seconds:
the evolve phase's wall time minus the task model's busy seconds in it), and the paired table as
printed. `python -m minskill.report OUT` draws it.

The probe scores the editor during training on instances of the same held-out split
(`heldout_split`): --eval takes exactly --eval-instances instances of --tasks-per-instance +
--eval-tasks tasks from the front of each type's tasks (types in turn), and a training run with
--probe-every takes --probe-instances instances of --tasks-per-instance tasks from the end of what
is left, so with the same --suite, --heldout-seed, --n-tasks, --tasks-per-instance,
--eval-instances, --eval-tasks and --probe-instances the two never share a task. The held-out draw
is seeded by --heldout-seed, not --seed: runs of two training seeds share their probe and their
evaluation (runs saved before the flag drew it with --seed: `with_heldout_seed`). A split that
cannot hold both, or fewer instances than asked, is refused (HeldoutSplitError, naming the flags and
how many instances fit), never shrunk. --eval also rebuilds the probe of every editor it evaluates
from the flags in that editor's trainer_state.pt and refuses when the probe shares a task id with
its instances (an editor trained with other --eval-* flags than the evaluation's).

This lives beside loop.py rather than in it: the loop module stays what a learner reads, and only
this module needs the model loader, the embedded server and the interval arithmetic.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time
from pathlib import Path

import torch

from minskill.cli import client_args
from minskill.files import read_json_object, write_json_atomic
from minskill.nn.shared_prefix import grouped_logprobs
from minskill.nn.weights import is_model_spec, load_model
from minskill.rollout import (all_failed, cut_totals, load_skills, reasoning_cut_note,
                              run_rollouts, skill_text, summarize)
from minskill.runs import (TRAINER_STATE, RunFolderError, check_run_folder, load_trainer_state,
                           open_run_folder, resume_flags)
from minskill.serve.client import usage_delta
from minskill.serve.embedded import embedded_client
from minskill.skill_r1.eval_table import (EVAL_FILE, FROZEN_ROW, GRPO_ROW, joined_rows,
                                          paired_rows, print_table, success_interval)
from minskill.skill_r1.loop import (EvolveConfig, Instance, TaskModelFailed, autocast,
                                    check_config, evolve_batch, load_split,
                                    reasoning_cuts, rollout_errors, step_seed, zero_reward_note)
from minskill.tasks import load_suite


class HeldoutSplitError(ValueError):
    """The held-out split cannot give what the --eval-* / --probe-* flags ask (or --eval's tasks
    would meet a trained editor's probe); train_grpo.py reports it as a usage error."""


def trained_args(spec: str) -> dict | None:
    """The flags of the training run that wrote a checkpoint folder (its trainer_state.pt), None
    when it has none (an untrained editor). Read once per version of the file (train_grpo.py checks
    them as it parses its flags, evaluate again)."""
    path = Path(spec) / TRAINER_STATE
    if not path.is_file():
        return None
    stat = path.stat()
    return dict(_trained_args(str(path.resolve()), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _trained_args(path: str, mtime_ns: int, size: int) -> dict:
    return load_trainer_state(Path(path).parent, restore_rng=False)["args"]


def eval_editors(args) -> list[tuple[str, str | None]]:
    """--eval's editor rows: (row name, editor spec or None when the row is skipped)."""
    editors = [(FROZEN_ROW, args.editor if args.frozen_row else None),
               (f"{GRPO_ROW} (λ = 0)", args.grpo_editor)]
    return editors + [("Skill-R1 (λ > 0)", spec) for spec in args.skillr1_editor or [None]]


def check_heldout(args) -> None:
    """train_grpo.py's check of the held-out flags, before any model is loaded: --eval gets exactly
    the instances it asks for, clear of the probe of every editor it evaluates (check_probes_of); a
    training run with --probe-every gets exactly its probe instances, clear of --eval's.
    HeldoutSplitError otherwise."""
    if args.eval:
        evo, test, _ = heldout_split(args)
        check_probes_of({spec: trained_args(spec) for _, spec in eval_editors(args) if spec}, evo,
                        test, args)
    elif args.probe_every:
        heldout_split(args, probe=True)


def restore_eval_flags(args, given: set[str], parser) -> None:
    """--eval --resume: the flags OUT/eval.json saved where none is given (the resume policy,
    minskill.runs.resume_flags); a given one that differs is refused, naming it, but --threads
    (which moves no figure). Without an eval.json the given flags start the evaluation."""
    if args.out is None:
        parser.error("--eval --resume needs --out, the folder of the evaluation to continue")
    check_run_folder(args.out, True, args.overwrite, "train_grpo.py --eval")
    file = Path(args.out) / EVAL_FILE
    if not file.is_file() and Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        raise RunFolderError(f"train_grpo.py --eval: --resume: --out {args.out} holds no "
                             f"{EVAL_FILE}, so no --eval run to continue (a training run?): "
                             "choose the evaluation's folder")
    if file.is_file():
        flags = saved_record(file).get("flags")
        if not isinstance(flags, dict):
            raise RunFolderError(f"train_grpo.py --eval: --resume: {file} holds no flags: not an "
                                 "--eval record")
        resume_flags(args, flags, given, {"threads"}, "train_grpo.py --eval", parser,
                     source=str(file))


def saved_record(file: Path) -> dict:
    """The object in an --eval run's eval.json; RunFolderError naming the file when it is damaged
    or not an --eval record."""
    try:
        record = read_json_object(file, "an --eval record")
    except ValueError as e:
        raise RunFolderError(f"train_grpo.py --eval: --resume: {e}") from None
    if record.get("kind") != "skill-r1-eval":
        raise RunFolderError(f"train_grpo.py --eval: --resume: {file} is not an --eval record")
    return record


def heldout_by_type(args) -> dict[str, list]:
    """The suite's held-out tasks by type (types sorted, tasks in order). Without --n-tasks the
    split is drawn large enough for --eval's instances and the probe's (qa at the defaults: 3 x 24 +
    4 = 76 tasks per type), or, where the suite holds fewer, as large as it holds (`_largest_draw`);
    heldout_split says when that is too few."""
    tasks = load_split(args, "heldout", seed=args.heldout_seed)
    n_types = len({t.type for t in tasks}) or 1
    m, s = args.tasks_per_instance, args.eval_tasks
    per_type = ((math.ceil(args.eval_instances / n_types) * m + s) if args.eval_scoring == "shared"
                else
                math.ceil(args.eval_instances / n_types)
                * (m + s)) + math.ceil(args.probe_instances / n_types) * m
    if args.n_tasks is None and per_type * n_types > len(tasks):
        tasks = _largest_draw(args, per_type * n_types, tasks)
    by_type: dict[str, list] = {}
    for t in tasks:
        by_type.setdefault(t.type, []).append(t)
    return dict(sorted(by_type.items()))


def _largest_draw(args, want: int, drawn: list) -> list:
    """The held-out split drawn with n = `want` tasks, or with the largest n below it that the suite
    can draw (found by bisection: `drawn`, the default draw, succeeds, and a larger n fails once a
    type runs out of distinct tasks, so success is monotone in n)."""
    def draw(n: int) -> list | None:
        try:
            return load_suite(args.suite, split="heldout", seed=args.heldout_seed, n=n)
        except (ValueError, FileNotFoundError):
            return None

    best = draw(want)
    if best is not None:
        return best
    works, fails, best = len(drawn), want, drawn
    while fails - works > 1:
        mid = (works + fails) // 2
        got = draw(mid)
        works, fails, best = (mid, fails, got) if got is not None else (works, mid, best)
    return best


def _in_turn(room: dict[str, int], block: int, count: int) -> list[tuple[str, int]]:
    """Up to `count` blocks of `block` tasks, one of each type in turn (type 1's first, type 2's
    first, ..., type 1's second, ...; a type without room for another block drops out): (type, k)
    for that type's k-th block. `room` (tasks left per type) is reduced by what is taken."""
    picks, taken = [], dict.fromkeys(room, 0)
    while len(picks) < count:
        fitting = [t for t in room if room[t] >= block][:count - len(picks)]
        if not fitting:
            break
        for t in fitting:
            picks.append((t, taken[t]))
            taken[t], room[t] = taken[t] + 1, room[t] - block
    return picks


def heldout_split(args, probe: bool = False) -> tuple[list[Instance], list[list], list[Instance]]:
    """(instances to evolve on, their evaluation tasks, probe instances): exactly --eval-instances
    held-out instances, types in turn, from the FRONT of each type's held-out tasks, each with m =
    --tasks-per-instance tasks the editor evolves on and then --eval-tasks other tasks that score
    the carried skill; with `probe` (a training run's --probe-every) also exactly --probe-instances
    probe instances of m tasks, types in turn, from the END of what --eval's instances leave, so
    never one of their tasks (checked by task id). Refuses (HeldoutSplitError) a split that holds
    fewer, saying how many instances fit; never gives fewer."""
    m, s, n_eval = args.tasks_per_instance, args.eval_tasks, args.eval_instances
    n_probe = args.probe_instances if probe else 0
    by_type = heldout_by_type(args)
    shared = args.eval_scoring == "shared"   # each type's first s tasks score all its instances;
                                             # blocks of m follow

    def fits(k_eval: int) -> tuple[list, list]:   # (eval blocks, probe blocks) beside k_eval eval
                                                  # instances
        room = {t: len(ts) - (s if shared else 0) for t, ts in by_type.items()}
        evals = _in_turn(room, m if shared else m + s, k_eval)
        return evals, _in_turn(room, m, n_probe)

    evals, probes = fits(n_eval)
    if len(evals) < n_eval or len(probes) < n_probe:
        beside = max((k for k in range(n_eval) if [len(x) for x in fits(k)] == [k, n_probe]),
                     default=0)
        raise HeldoutSplitError(_split_too_small(args, by_type, probe, len(evals), len(probes),
                                                 beside))
    lists = dict(by_type)
    if shared:
        evo = [Instance(f"heldout-{t}-{k}", t, lists[t][s + k * m:s + (k + 1) * m])
               for t, k in evals]
        test = [lists[t][:s] for t, k in evals]
    else:
        evo = [Instance(f"heldout-{t}-{k}", t, lists[t][k * (m + s):k * (m + s) + m])
               for t, k in evals]
        test = [lists[t][k * (m + s) + m:(k + 1) * (m + s)] for t, k in evals]
    probe_set = [Instance(f"probe-{t}-{k}", t,
                          lists[t][len(lists[t]) - (k + 1) * m:len(lists[t]) - k * m])
                 for t, k in probes]
    common = ({x.id for inst in evo for x in inst.tasks} | {x.id for ts in test for x in ts}) & \
             {x.id for inst in probe_set for x in inst.tasks}
    if common:   # by construction only when the suite repeats a task id
        raise HeldoutSplitError(f"--suite {args.suite}: the probe's and --eval's held-out "
                                f"instances share task ids {sorted(common)[:5]}: the suite repeats "
                                "them")
    return evo, test, probe_set


def _split_too_small(args, by_type: dict[str, list], probe: bool, n_evals: int, n_probes: int,
                     eval_fit: int) -> str:
    """What heldout_split refuses: the split, what was asked, and how many instances fit (n_evals,
    n_probes: what fits of each when --eval's are taken first; eval_fit: --eval instances that fit
    beside the probe)."""
    m, s = args.tasks_per_instance, args.eval_tasks
    each = (f"--tasks-per-instance {m} tasks beside their type's --eval-tasks {s} (--eval-scoring "
            "shared)"
            if args.eval_scoring == "shared"
            else f"--tasks-per-instance {m} + --eval-tasks {s} tasks")
    drawn = (f"--n-tasks {args.n_tasks}" if args.n_tasks is not None
             else "as many as the suite holds")
    split = (f"the held-out split of --suite {args.suite} ({drawn}: "
             f"{', '.join(f'{len(ts)} {t}' for t, ts in by_type.items()) or 'no'} tasks)")
    more = "raise --n-tasks" if args.n_tasks is not None else "use a suite with more held-out tasks"
    probe_text = (f"the training probe's --probe-instances {args.probe_instances} instance(s) of "
                  f"--tasks-per-instance {m} tasks (--probe-every), which never share a task with "
                  "--eval's")
    if n_evals < args.eval_instances:
        fit = eval_fit if probe else n_evals
        shared = ("" if args.eval_scoring == "shared"
                  else "score on shared tasks (--eval-scoring shared), ")
        return (f"{split} has room for {fit} instance(s) of {each}"
                f"{f' beside {probe_text}' if probe else ''}, not --eval-instances "
                f"{args.eval_instances}: ask for at most {fit}, lower --eval-tasks or "
                f"--tasks-per-instance{', or --probe-instances' if probe else ''}, "
                f"{shared}"
                f"or {more}")
    lowerable = (("--probe-instances", n_probes), ("--eval-instances", eval_fit))
    return (f"{split}, beside --eval's --eval-instances {args.eval_instances} instance(s) of "
            f"{each} (pass the --eval-* flags you will evaluate with), has room for "
            f"{n_probes} of {probe_text}, not {args.probe_instances}: lower "
            f"{''.join(f'{x} or ' for x, n in lowerable if n)}"
            f"--eval-tasks (with these flags at most {n_probes} probe instance(s) fit, or "
            f"{args.probe_instances} beside {eval_fit} --eval instance(s)), or {more}")


def heldout_instances(args) -> tuple[list[Instance], list[list]]:
    """(instances to evolve on, their evaluation tasks) of --eval: heldout_split's first two."""
    evo, test, _ = heldout_split(args)
    return evo, test


def with_heldout_seed(flags: dict) -> dict:
    """A run's saved flags with its held-out seed: runs saved before --heldout-seed existed drew
    their held-out split (and so their probe) with --seed."""
    return flags if "heldout_seed" in flags else {**flags, "heldout_seed": flags.get("seed", 0)}


def probe_instances(args) -> list[Instance]:
    """The training run's held-out probe (--probe-every): heldout_split's probe instances, clear of
    the instances --eval takes with the same flags (with the defaults on qa: --eval uses 3 x 24
    tasks of each type's 76, the probe the last 4)."""
    return heldout_split(args, probe=True)[2]


def check_probes_of(trained: dict[str, dict | None], evo: list[Instance], test: list[list],
                    args) -> None:
    """Refuse (HeldoutSplitError) when --eval's tasks meet the held-out probe of an editor it
    evaluates: the probe is rebuilt from the flags in the editor's trainer_state.pt (`trained`: spec
    -> those flags, None for an untrained editor), for runs that probed (--probe-every) on the same
    --suite."""
    ours = {x.id for inst in evo for x in inst.tasks} | {x.id for ts in test for x in ts}
    for spec, flags in trained.items():
        if not flags or not flags.get("probe_every") or flags.get("suite") != args.suite:
            continue
        try:
            theirs = {x.id
                      for inst in probe_instances(
                          argparse.Namespace(**{**vars(args), **with_heldout_seed(flags)}))
                      for x in inst.tasks}
        except HeldoutSplitError as e:   # a run of an earlier version, whose probe this rule cannot
                                         # rebuild
            print(f"warning: cannot rebuild the held-out probe of {spec} to check it against "
                  f"--eval's tasks: {e}")
            continue
        shared = sorted(ours & theirs)
        if shared:
            n_tasks = f" --n-tasks {flags['n_tasks']}" if flags.get("n_tasks") is not None else ""
            raise HeldoutSplitError(
                f"--eval's held-out tasks meet the probe of {spec} (trained with --probe-every "
                f"{flags['probe_every']}) in {len(shared)} task(s), e.g. {', '.join(shared[:3])}: "
                "evaluate with the flags that run kept its probe clear of, --eval-instances "
                f"{flags.get('eval_instances')} --eval-tasks {flags.get('eval_tasks')} "
                f"--tasks-per-instance {flags.get('tasks_per_instance')}{n_tasks} (or fewer "
                "--eval-instances)")


def probe(editor, tokenizer, client, instances: list[Instance], seed_skills: list[str],
          args) -> dict:
    """Score the current editor on the fixed held-out probe instances, cheaply: one generation of
    the evolve loop (no update) with --probe-candidates candidates, the same seeds at every probe,
    so the curve moves only with the editor. Returns the mean reward of the seed skill and of the
    candidates, and how many rollouts ended with an error (TaskModelFailed when all did); the editor
    never trains on these instances."""
    c0, u0, t0 = client.stats["calls"], client.usage, time.time()
    cfg = dataclasses.replace(EvolveConfig.from_args(args), generations=1,
                              candidates=args.probe_candidates)
    with torch.no_grad(), autocast(args.bf16, editor.device):
        evolutions = evolve_batch(editor, tokenizer, client, instances, cfg,
                                  seeds=[step_seed(args.seed, 10**6 + 1, k)
                                         for k in range(len(instances))],
                                  seed_skills=seed_skills)
    n, errors = len(evolutions), rollout_errors(evolutions, "the held-out probe")
    return {"errors": errors, **reasoning_cuts(evolutions),
            "reward_per_generation": [sum(ev.seed_reward for ev in evolutions) / n,
                                      sum(ev.generations[0].mean_reward for ev in evolutions) / n],
            "carried_reward": sum(ev.final_reward for ev in evolutions) / n,
            "beat_seed_share": sum(c.reward > ev.seed_reward for ev in evolutions
                                   for c in ev.candidates()) /
                               max(1, sum(len(ev.candidates()) for ev in evolutions)),
            "skills": [{"instance": ev.instance.id, "reward": c.reward,
                        "seed_reward": ev.seed_reward,
                        "skill": c.skill if c.skill is not None else c.text} for ev in evolutions
                       for c in ev.candidates()],
            "task_calls": client.stats["calls"] - c0, "seconds": time.time() - t0,
            "task_usage": usage_delta(client.usage, u0)}   # client.Usage: tokens, request and busy
                                                           # seconds


def success(client, skills: list[str], test: list[list], args,
            cuts: dict | None = None) -> tuple[float, int, list[list[float]]]:
    """(success rate, task-model requests, per-instance task scores) of skills[j] on the evaluation
    tasks test[j]. A task's score is the mean over its n rollouts, so n identical greedy replies
    count once. A rollout that ended with an error scores 0 and is reported apart; TaskModelFailed
    when every one did. `cuts` (loop.reasoning_cuts' keys) adds the rollouts and those that
    ended inside their reasoning."""
    c0, scores, ended = client.stats["calls"], [], []
    for skill, tasks in zip(skills, test):
        trajectories = run_rollouts(client, tasks, skill or None, n=args.rollouts,
                                    temperature=args.task_temperature,
                                    max_tokens=args.task_max_tokens, seed=args.seed)
        ended += trajectories
        per_task: dict[str, list[float]] = {}
        for tr in trajectories:
            per_task.setdefault(tr.task_id, []).append(tr.reward)
        scores.append([sum(per_task[t.id]) / len(per_task[t.id]) for t in tasks])
    if cuts is not None:
        cuts["rollouts"] += len(ended)
        cuts["reasoning_cut"] += summarize(ended)["reasoning_cut"]
    failed, errors = all_failed(ended), [t.error for t in ended if t.error is not None]
    if failed:
        raise TaskModelFailed(failed)
    if errors:
        print(f"  {len(errors)} of {len(ended)} rollouts ended with an error, scored 0 "
              f"(the first: {errors[0][:300]})", flush=True)
    flat = [x for g in scores for x in g]
    return sum(flat) / len(flat), client.stats["calls"] - c0, scores


def skill_row(client, name: str, skills: list[str], evo: list[Instance], test: list[list],
              args) -> dict:
    """A row without an editor (no skill, the seed skill): skills[j] scored on instance j's
    evaluation tasks."""
    u0, t0, cuts = client.usage, time.time(), {"rollouts": 0, "reasoning_cut": 0}
    final, calls, scores = success(client, skills, test, args, cuts)
    return {"name": name, "spec": None, "success": final, "eval_calls": calls, "scores": scores,
            **cuts,
            "per_generation": [], "evolve_calls": 0, "kl": None, "kl_reference": None,
            "skills": [{"instance": x.id, "seed_skill": s, "carried": s, "generations": []}
                       for x, s in zip(evo, skills)],
            "costs": {"task_model": {**usage_delta(client.usage, u0), "wall_seconds": time.time()
                                     - t0}}}


def editor_row(client, name: str, spec: str, evo: list[Instance], seed_skills: list[str],
               test: list[list], args, first: int = 0) -> dict:
    """One editor's row: evolve a skill on every instance, then score the skill carried after each
    generation. `evo` may be a chunk of --eval's instances, the first being instance `first`: each
    instance is seeded by its place among all of them (--eval-chunk)."""
    editor, tokenizer = load_model(spec, dtype=torch.float32, device=args.device)
    check_config(editor, EvolveConfig.from_args(args))
    editor.eval()
    c0, u0, t0 = client.stats["calls"], client.usage, time.time()
    with torch.no_grad(), autocast(args.bf16, editor.device):
        evolutions = evolve_batch(editor, tokenizer, client, evo, EvolveConfig.from_args(args),
                                  seeds=[step_seed(args.seed, 10**6, first + k)
                                         for k in range(len(evo))],
                                  seed_skills=seed_skills)
    evolve_calls, evolve_wall = client.stats["calls"] - c0, time.time() - t0
    evolve_usage = usage_delta(client.usage, u0)
    kl, t_kl, reference = None, time.time(), kl_reference(spec, args)
    if reference is not None:  # a trained editor: how far it moved from the one it started from
        kl = kl_to_frozen(editor, reference, evolutions, args)
        print(f"{name}: KL(trained ‖ {reference}) = {kl:.4f} nats per token of the skills it "
              "wrote", flush=True)
    kl_seconds = time.time() - t_kl
    del editor
    u1, t1, cuts = client.usage, time.time(), reasoning_cuts(evolutions)   # evolve + evaluate
    per_gen = [success(client, [ev.generations[g].current_skill for ev in evolutions], test, args,
                       cuts) for g in range(args.generations)]
    final, _, scores = per_gen[-1]
    sampled = sum(len(c.token_ids) for ev in evolutions for c in ev.candidates())
    return {"name": f"{name}: {spec}", "spec": spec, "success": final,
            "eval_calls": sum(c for _, c, _ in per_gen), "scores": scores,
            "per_generation": [x for x, _, _ in per_gen],
            "evolve_calls": evolve_calls, "kl": kl, "kl_reference": reference, **cuts,
            "skills": [written_skills(ev) for ev in evolutions],
            "costs": {"task_model_evolve": {**evolve_usage, "wall_seconds": evolve_wall},
                      "task_model_evaluate": {**usage_delta(client.usage, u1),
                                              "wall_seconds": time.time() - t1},
                      # the editor samples while no task-model request is out: the evolve phase's
                      # wall time minus the task model's busy seconds in it
                      "editor": {"sampled_tokens": sampled,
                                 "seconds": max(0.0, evolve_wall - evolve_usage["busy_seconds"]),
                                 "kl_seconds": kl_seconds if kl is not None else None}}}


def written_skills(ev) -> dict:
    """What the editor wrote on one instance: the seed skill, every generation's candidates with
    their rewards on the instance's own tasks, and the skill carried after each generation (scored
    on the evaluation tasks)."""
    return {"instance": ev.instance.id, "seed_skill": ev.seed_skill, "seed_reward": ev.seed_reward,
            "carried": ev.final_skill,
            "generations": [{"g": gen.g, "carried": gen.current_skill,
                             "carried_reward": gen.current_reward,
                             "candidates": [{"skill": c.skill, "reply": c.text if c.skill is None
                                             else None,
                                             "reward": c.reward} for c in gen.candidates]}
                            for gen in ev.generations]}


def kl_reference(spec: str, args) -> str | None:
    """π_0 of a row's KL: None for --editor itself (untrained); for a trained editor the one its
    training started from (the --editor in its trainer_state.pt) where that still loads from here,
    else --editor."""
    if spec == args.editor:
        return None
    started = (trained_args(spec) or {}).get("editor")
    return started if started and is_model_spec(started) else args.editor


def kl_to_frozen(editor, frozen_spec: str, evolutions, args) -> float:
    """Mean over the sampled skill tokens of log π_θ(y) − log π_0(y), π_0 `frozen_spec`
    (kl_reference): the Monte-Carlo estimate of KL(π_θ ‖ π_0) at the sampling temperature
    (exact in expectation for --editor-top-p 1)."""
    frozen = load_model(frozen_spec, dtype=torch.float32, device=editor.device)[0].eval()
    cands = [c for ev in evolutions for c in ev.candidates() if c.token_ids]
    total, n = 0.0, 0
    with torch.no_grad(), autocast(args.bf16, editor.device):
        for i in range(0, len(cands), 8):
            prompts, completions = [c.prompt_ids for c in cands[i:i + 8]], [c.token_ids
                                                                            for c in cands[i:i + 8]]
            logp, mask = grouped_logprobs(editor, prompts, completions,
                                          temperature=args.editor_temperature)
            logp_0, _ = grouped_logprobs(frozen, prompts, completions,
                                         temperature=args.editor_temperature)
            total, n = total + float(((logp - logp_0) * mask).sum()), n + int(mask.sum())
    return total / max(n, 1)


def evaluate(args) -> int:
    """Print the table of the paired rows (module docstring) for the flags of train_grpo.py and
    write the run folder --out (default runs/skill-r1-eval-TIME): eval.json, rewritten after every
    chunk of --eval-chunk instances of every row (`eval_record`); --resume continues it after its
    last whole chunk (`resumed_record`)."""
    out = Path(args.out or f"runs/skill-r1-eval-{time.strftime('%Y%m%d-%H%M%S')}")
    # before any model is loaded
    check_run_folder(out, args.resume, args.overwrite, "train_grpo.py --eval")
    evo, test = heldout_instances(args)
    editors = eval_editors(args)
    trained = {spec: trained_args(spec) for _, spec in editors if spec}
    # before any model is loaded
    check_probes_of(trained, evo, test, args)
    seed_skillset = load_skills(args.seed_skills, args.suite)
    seed_skills = [skill_text(seed_skillset, inst.type) for inst in evo]
    record = eval_record(args, evo, test)
    if args.resume:
        record = resumed_record(out, record)
        if record["finished"]:
            print(f"--resume: the evaluation in {out} has finished, nothing is left to measure; "
                  f"python -m minskill.report {out} draws it")
            return 0
    rows, saved_usage = record["rows"], record["usage"] or {}
    started, chunk = time.time() - record["wall_seconds"], args.eval_chunk or len(evo)
    opened = [out] if args.resume and (out / EVAL_FILE).is_file() else []
    with embedded_client(**client_args(args, "task"),
                         quantize=args.task_quantize, max_workers=args.task_concurrency) as client:

        def keep(row: dict, lam: float | None, done: int) -> None:
            """Write eval.json with `row` measured on the first `done` instances: a whole row
            joins `rows`, a part is the record's "row_under_way"."""
            if not opened:   # the folder is made once there is something to keep in it
                open_run_folder(out, args.resume, args.overwrite, "train_grpo.py --eval",
                                settings=record["flags"] if args.resume else None)
                opened.append(out)
            row = {**row, "lambda": lam, "ci95": success_interval(row, test[:done])}
            whole = done == len(evo)
            if whole:
                rows.append(row)
            usage = {k: v + saved_usage.get(k, 0) for k, v in client.usage.items()}
            record.update(row_under_way=None if whole else {**row, "instances_done": done},
                          usage=usage, wall_seconds=time.time() - started)
            write_json_atomic(out / EVAL_FILE, record)
            print(f"evaluated: {row['name']}"
                  + ("" if chunk == len(evo) else f", instances 1-{done} of {len(evo)}"),
                  flush=True)
            if whole and row["reasoning_cut"] and not any(r["reasoning_cut"] for r in rows[:-1]):
                # once, when first seen
                print(reasoning_cut_note(cut_totals([row], of="rollouts")), flush=True)

        plan = planned_rows(client, args, evo, test, seed_skills, seed_skillset is not None,
                            editors, trained, rows)
        for lam, measure in plan[len(rows):]:   # a resumed run's whole rows are kept
            part = record["row_under_way"]
            done = part["instances_done"] if part else 0
            for a in range(done, len(evo), chunk):
                b = min(a + chunk, len(evo))
                row = measure(a, b)
                part = row if part is None else joined_rows(part, row)
                keep(part, lam, b)
    print_table(rows, evo, test, args,
                zero_reward_note([t for ts in test for t in ts], rows, training=False),
                reasoning_cut_note(cut_totals(rows, of="rollouts")))
    record.update(paired=paired_rows(rows, args.seed), finished=True, wall_seconds=time.time()
                  - started)
    write_json_atomic(out / EVAL_FILE, record)
    print(f"\nwrote {out / EVAL_FILE}; python -m minskill.report {out} draws the evaluation as one "
          "HTML page")
    return 0


def planned_rows(client, args, evo: list[Instance], test: list[list], seed_skills: list[str],
                 seeded: bool, editors: list, trained: dict, rows: list[dict]) -> list:
    """The rows --eval measures, in order: (λ of the editor's training or None, a function of
    (a, b) that measures the row on instances a..b-1); an editor row not given is said skipped.
    With --seed-skills none the seed-skill row would ask the task model what the no-skill row asked
    (`rows`[0] once measured): it is that row's scores, at no cost (copied_row)."""
    seed = "seed skill" + ("" if seeded else " (--seed-skills none: = no skill)")
    plan = [(None, lambda a, b: skill_row(client, "no skill", [""] * (b - a), evo[a:b], test[a:b],
                                          args)),
            (None, (lambda a, b: skill_row(client, seed, seed_skills[a:b], evo[a:b], test[a:b],
                                           args)) if seeded
             else lambda a, b: copied_row(rows[0], seed, a, b))]
    for name, spec in editors:
        if not spec:
            print(f"skipped: {name} "
                  f"({'--no-frozen-row' if name == FROZEN_ROW else 'no editor given'})", flush=True)
            continue
        # λ of the run that wrote it
        trained_lam = float(trained[spec]["lam"]) if trained[spec] else None
        if trained_lam is not None and name != FROZEN_ROW:
            if (trained_lam == 0) != name.startswith(GRPO_ROW):
                print(f"warning: {spec} was trained with λ = {trained_lam}, yet it fills the "
                      f"row '{name}'")
            name = f"{name.split(' (')[0]} (λ = {trained_lam:g})"
        plan.append((trained_lam, functools.partial(
            lambda a, b, name, spec: editor_row(client, name, spec, evo[a:b], seed_skills[a:b],
                                                test[a:b], args, first=a),
            name=name, spec=spec)))
    return plan


def copied_row(row: dict, name: str, a: int, b: int) -> dict:
    """Instances a..b-1 of a measured row without an editor, as the row `name` that would have asked
    the task model the same requests: the same scores and skills; no call, rollout or cost of its
    own."""
    flat = [x for g in row["scores"][a:b] for x in g]
    return {**row, "name": name, "success": sum(flat) / len(flat), "scores": row["scores"][a:b],
            "skills": row["skills"][a:b], "eval_calls": 0, "rollouts": 0, "reasoning_cut": 0,
            "costs": {"task_model": {k: 0 for k in row["costs"]["task_model"]}}}


def eval_record(args, evo: list[Instance], test: list[list]) -> dict:
    """The head of OUT/eval.json (what `python -m minskill.report` reads as a "skill-r1-eval"
    folder):

        {"kind": "skill-r1-eval", "version": 2, "flags": {the train_grpo.py flags}, "task_model",
         "instances": [{"id", "type", "evolve_tasks": [ids], "eval_tasks": [ids],
                        "eval_questions": [...]}],
         "rows": [{"name", "spec", "lambda", "success", "ci95" (eval_table.success_interval),
                   "per_generation", "evolve_calls", "eval_calls",
                   "scores": [[score per evaluation task] per instance], "kl",
                   "kl_reference" (π_0 of "kl": kl_reference),
                   "skills": [per instance: seed skill, each generation's candidates and rewards,
                              carried skill],
                   "costs": {"task_model" | "task_model_evolve" | "task_model_evaluate":
                             client.Usage counts + wall_seconds,
                             "editor": {"sampled_tokens", "seconds", "kl_seconds"}}}],
         "paired": [paired_rows: {"row", "against", "difference" (D̄),
                    "p" (sign-flip test by instance), "ci95" (its inverted interval, by instance),
                    "test" ("exact" | "monte carlo"), "instances", "n" (tasks), "per_task_gained",
                    "per_task_lost" (descriptive counts, not a test)}],
         "row_under_way": None, or the row being measured on its first "instances_done"
                          instances (--eval-chunk; --resume continues it),
         "usage": the task model's client.Usage counts, "wall_seconds", "finished"}

    Version 2: the paired statistic is by instance (minskill.paired.compare). Rewritten after each
    chunk of each row (finished false until the paired table is in)."""
    flags = {k: v for k, v in vars(args).items()
             if isinstance(v, (str, int, float, bool, list, type(None)))}
    return {"kind": "skill-r1-eval", "version": 2, "flags": flags, "finished": False,
            "task_model": args.task_model or args.task_url or
            f"embedded default (smollm2-135m, --task-quantize {args.task_quantize}, greedy)",
            "instances": [{"id": x.id, "type": x.type, "evolve_tasks": [t.id for t in x.tasks],
                           "eval_tasks": [t.id for t in ts],
                           "eval_questions": [t.question[:300] for t in ts]}
                          for x, ts in zip(evo, test)],
            "rows": [], "row_under_way": None, "paired": [], "usage": None, "wall_seconds": 0.0}


def resumed_record(out: Path, fresh: dict) -> dict:
    """--resume: the record in OUT/eval.json, whose flags restore_eval_flags gave this run, or
    `fresh` (eval_record's) when there is none yet. RunFolderError when it is not an --eval record
    or evaluates other instances or tasks than these flags draw."""
    file = out / EVAL_FILE
    if not file.is_file():
        print(f"--resume: {out} holds no {EVAL_FILE} yet: the evaluation starts at its first row")
        return fresh
    saved = saved_record(file)
    if saved.get("instances") != fresh["instances"]:
        raise RunFolderError(f"train_grpo.py --eval: --resume: {file} evaluates other instances "
                             "or tasks than its flags draw here (another suite file or version?): "
                             "start a new evaluation in another --out")
    rows, part = saved.get("rows") or [], saved.get("row_under_way")
    done = part.get("instances_done") if isinstance(part, dict) else None
    if part is not None and not (isinstance(done, int) and 0 < done == len(part.get("scores") or [])
                                 < len(fresh["instances"])):
        raise RunFolderError(f"train_grpo.py --eval: --resume: {file}: field row_under_way is not "
                             "a row measured on its first instances_done instances")
    print(f"--resume: {len(rows)} whole row(s) kept" + (
        f", '{part['name']}' continues after {part['instances_done']} of "
        f"{len(fresh['instances'])} instances" if part else ""), flush=True)
    return {**fresh, **saved, "rows": rows, "row_under_way": part}
