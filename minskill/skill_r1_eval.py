"""Evaluating skill editors (`python train_grpo.py --eval`): the paper's rows on held-out instances, and the
training run's held-out probe (`--probe-every`).

Each held-out instance has m = --tasks-per-instance tasks that the editor evolves the skill on (the loop of
minskill.skill_r1, with their verifier feedback) and --eval-tasks *other* tasks of the same type on which
the carried skill is scored (default 12 instances x 20 = 240 scoring tasks per row):

    success = share of those evaluation tasks solved with the skill carried after the last generation

The rows: no skill; the seed skill (--seed-skills); Skill-R1 inference-only (--editor, never trained);
vanilla GRPO (--grpo-editor, trained with λ = 0); Skill-R1 (--skillr1-editor, λ > 0, one row per editor
given). Every row sees the same tasks and seeds. An editor row also reports the success of the skill
carried after each generation g, and the task-model requests spent writing the skills (evolve) apart from
those spent scoring them (evaluate); a trained editor's row prints its KL to the frozen editor on the skills
it wrote (how far training moved it). A task's score is the mean over its n rollouts (n identical greedy
replies count once). A second table compares the rows paired on the same tasks (minskill.paired): every
row against no skill, and each Skill-R1 row against every other row: the difference with a 95% bootstrap
interval that resamples instances (the tasks of one instance share one skill), gained/lost tasks and the
exact sign-test p. A trained editor's λ is read from its checkpoint, so a row cannot silently show the
wrong method.

The probe scores the editor during training on instances of the same held-out split, taken from the end
of each type's tasks while --eval takes its instances from the front, so the two never share a task.

This lives beside skill_r1.py rather than in it: the loop module stays what a learner reads, and only this
module needs the model loader, the embedded server and the interval arithmetic.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import torch

from minskill.paired import compare
from minskill.rollout import load_skills, run_rollouts, skill_text, wilson_interval
from minskill.runs import TRAINER_STATE, load_trainer_state
from minskill.server import embedded_client
from minskill.shared_prefix import grouped_logprobs
from minskill.skill_r1 import (EvolveConfig, Instance, all_zero_note, autocast, device, evolve_batch,
                               load_tasks, step_seed)
from minskill.tasks import load_suite
from minskill.weights import load_model


def trained_with_lambda(spec: str) -> float | None:
    """λ of the run that wrote a checkpoint folder (from its trainer_state.pt), None when unknown."""
    if not (Path(spec) / TRAINER_STATE).is_file():
        return None
    return float(load_trainer_state(spec, restore_rng=False)["args"]["lam"])


def heldout_by_type(args) -> dict[str, list]:
    """The suite's held-out tasks by type (types sorted, tasks in order). Without --n-tasks the split is drawn
    large enough for --eval's instances and the probe's (qa: 80 tasks per type), where the suite holds that."""
    tasks = load_tasks(args, "heldout")
    n_types = len({t.type for t in tasks}) or 1
    per_type = (math.ceil(args.eval_instances / n_types) * (args.tasks_per_instance + args.eval_tasks) +
                math.ceil(args.probe_instances / n_types) * args.tasks_per_instance)
    if args.n_tasks is None and per_type * n_types > len(tasks):
        try:
            tasks = load_suite(args.suite, split="heldout", seed=args.seed, n=per_type * n_types)
        except (ValueError, FileNotFoundError):
            pass  # the suite holds fewer: use what it gives; the callers say when that is too few
    by_type: dict[str, list] = {}
    for t in tasks:
        by_type.setdefault(t.type, []).append(t)
    return dict(sorted(by_type.items()))


def _types_in_turn(groups: dict[str, list], count: int) -> list:
    """Up to `count` items, one of each type in turn: type 1's first, type 2's first, ..., type 1's second..."""
    longest = max(map(len, groups.values()), default=0)
    return [items[k] for k in range(longest) for items in groups.values() if k < len(items)][:count]


def heldout_instances(args) -> tuple[list[Instance], list[list]]:
    """(instances to evolve on, their evaluation tasks): --eval-instances held-out instances, spread over the
    task types, taken from the FRONT of each type's held-out tasks. Each has m = --tasks-per-instance tasks
    that the editor evolves on, then --eval-tasks other tasks that score the carried skill."""
    m, s = args.tasks_per_instance, args.eval_tasks
    groups = {t: [Instance(f"heldout-{t}-{k}", t, ts[k * (m + s):(k + 1) * (m + s)])
                  for k in range(len(ts) // (m + s))] for t, ts in heldout_by_type(args).items()}
    pairs = _types_in_turn(groups, args.eval_instances)
    if not pairs:
        sys.exit(f"suite {args.suite!r}: no task type has {m + s} held-out tasks "
                 f"(--tasks-per-instance {m} + --eval-tasks {s})")
    return [Instance(p.id, p.type, p.tasks[:m]) for p in pairs], [p.tasks[m:] for p in pairs]


def probe_instances(args) -> list[Instance]:
    """The training run's held-out probe (--probe-every): --probe-instances instances of m tasks, types in
    turn, taken from the END of each type's held-out tasks, so they are never among --eval's instances while
    both fit in the split (with the defaults on qa: --eval uses 3 x 24 tasks of each type's 80, the probe 4)."""
    m = args.tasks_per_instance
    groups = {t: [Instance(f"probe-{t}-{k}", t, ts[len(ts) - (k + 1) * m:len(ts) - k * m])
                  for k in range(len(ts) // m)] for t, ts in heldout_by_type(args).items()}
    picked = _types_in_turn(groups, args.probe_instances)
    if len(picked) < args.probe_instances:
        sys.exit(f"suite {args.suite!r}: the held-out split holds {len(picked)} probe instances of {m} tasks, "
                 f"not --probe-instances {args.probe_instances}")
    return picked


def probe(editor, tokenizer, client, instances: list[Instance], seed_skills: list[str], args) -> dict:
    """Score the current editor on the fixed held-out probe instances, cheaply: one generation of the evolve
    loop (no update) with --probe-candidates candidates, the same seeds at every probe, so the curve moves only
    with the editor. Returns the mean reward of the seed skill and of the candidates; the editor never trains
    on these instances."""
    c0, t0 = client.stats["calls"], time.time()
    cfg = dataclasses.replace(EvolveConfig.from_args(args), generations=1, candidates=args.probe_candidates)
    with torch.no_grad(), autocast(args.bf16):
        evolutions = evolve_batch(editor, tokenizer, client, instances, cfg,
                                  seeds=[step_seed(args.seed, 10**6 + 1, k) for k in range(len(instances))],
                                  seed_skills=seed_skills)
    n = len(evolutions)
    return {"reward_per_generation": [sum(ev.seed_reward for ev in evolutions) / n,
                                      sum(ev.generations[0].mean_reward for ev in evolutions) / n],
            "carried_reward": sum(ev.final_reward for ev in evolutions) / n,
            "beat_seed_share": sum(c.reward > ev.seed_reward for ev in evolutions for c in ev.candidates()) /
                               max(1, sum(len(ev.candidates()) for ev in evolutions)),
            "skills": [{"instance": ev.instance.id, "reward": c.reward, "seed_reward": ev.seed_reward,
                        "skill": c.skill if c.skill is not None else c.text} for ev in evolutions for c in ev.candidates()],
            "task_calls": client.stats["calls"] - c0, "seconds": time.time() - t0}


def success(client, skills: list[str], test: list[list], args) -> tuple[float, int, list[list[float]]]:
    """(success rate, task-model requests, per-instance task scores) of skills[j] on the evaluation tasks
    test[j]. A task's score is the mean over its n rollouts, so n identical greedy replies count once."""
    c0, scores = client.stats["calls"], []
    for skill, tasks in zip(skills, test):
        trajectories = run_rollouts(client, tasks, skill or None, n=args.rollouts, temperature=args.task_temperature,
                                    max_tokens=args.task_max_tokens, seed=args.seed)
        per_task: dict[str, list[float]] = {}
        for tr in trajectories:
            per_task.setdefault(tr.task_id, []).append(tr.reward)
        scores.append([sum(per_task[t.id]) / len(per_task[t.id]) for t in tasks])
    flat = [x for g in scores for x in g]
    return sum(flat) / len(flat), client.stats["calls"] - c0, scores


def editor_row(client, name: str, spec: str, evo: list[Instance], seed_skills: list[str], test: list[list],
               args) -> tuple:
    """One editor's row: evolve a skill on every instance, then score the skill carried after each generation."""
    editor, tokenizer = load_model(spec, dtype=torch.float32, device=device())
    editor.eval()
    c0 = client.stats["calls"]
    with torch.no_grad(), autocast(args.bf16):
        evolutions = evolve_batch(editor, tokenizer, client, evo, EvolveConfig.from_args(args),
                                  seeds=[step_seed(args.seed, 10**6, k) for k in range(len(evo))],
                                  seed_skills=seed_skills)
    evolve_calls = client.stats["calls"] - c0
    if spec != args.editor:  # a trained editor: how far it moved from the one it started from
        print(f"{name}: KL(trained ‖ frozen editor) = {kl_to_frozen(editor, args.editor, evolutions, args):.4f} "
              f"nats per token of the skills it wrote", flush=True)
    del editor
    per_gen = [success(client, [ev.generations[g].current_skill for ev in evolutions], test, args)
               for g in range(args.generations)]
    final, _, scores = per_gen[-1]
    return f"{name}: {spec}", final, sum(c for _, c, _ in per_gen), scores, [s for s, _, _ in per_gen], evolve_calls


def kl_to_frozen(editor, frozen_spec: str, evolutions, args) -> float:
    """Mean over the sampled skill tokens of log π_θ(y) − log π_0(y), π_0 the untrained editor: the Monte-Carlo
    estimate of KL(π_θ ‖ π_0) at the sampling temperature (exact in expectation for --editor-top-p 1)."""
    frozen = load_model(frozen_spec, dtype=torch.float32, device=device())[0].eval()
    cands = [c for ev in evolutions for c in ev.candidates() if c.token_ids]
    total, n = 0.0, 0
    with torch.no_grad(), autocast(args.bf16):
        for i in range(0, len(cands), 8):
            prompts, completions = [c.prompt_ids for c in cands[i:i + 8]], [c.token_ids for c in cands[i:i + 8]]
            logp, mask = grouped_logprobs(editor, prompts, completions, temperature=args.editor_temperature)
            logp_0, _ = grouped_logprobs(frozen, prompts, completions, temperature=args.editor_temperature)
            total, n = total + float(((logp - logp_0) * mask).sum()), n + int(mask.sum())
    return total / max(n, 1)


def evaluate(args) -> int:
    """Print the table of the paper's rows (module docstring) for the flags of train_grpo.py."""
    evo, test = heldout_instances(args)
    seed_skillset = load_skills(args.seed_skills, args.suite)
    seed_skills = [skill_text(seed_skillset, inst.type) for inst in evo]
    rows = []
    with embedded_client(args.task_url, args.task_model, api_key=args.task_api_key,
                         quantize=args.task_quantize, max_workers=args.task_concurrency) as client:
        rows.append(("no skill", *success(client, [""] * len(evo), test, args), [], 0))
        print("evaluated: no skill", flush=True)
        rows.append(("seed skill" + ("" if seed_skillset is not None else " (--seed-skills none: = no skill)"),
                     *success(client, seed_skills, test, args), [], 0))
        print("evaluated: seed skill", flush=True)
        frozen = "Skill-R1 inference-only (editor frozen)"
        editors = [(frozen, args.editor if args.frozen_row else None), ("vanilla GRPO (λ = 0)", args.grpo_editor)]
        editors += [("Skill-R1 (λ > 0)", spec) for spec in args.skillr1_editor or [None]]
        for name, spec in editors:
            if not spec:
                print(f"skipped: {name} ({'--no-frozen-row' if name == frozen else 'no editor given'})", flush=True)
                continue
            trained_lam = trained_with_lambda(spec)
            if trained_lam is not None and name != frozen:
                if (trained_lam == 0) != name.startswith("vanilla"):
                    print(f"warning: {spec} was trained with λ = {trained_lam}, yet it fills the row '{name}'")
                name = f"{name.split(' (')[0]} (λ = {trained_lam:g})"
            rows.append(editor_row(client, name, spec, evo, seed_skills, test, args))
            print(f"evaluated: {name}", flush=True)
    print_table(rows, evo, test, args)
    return 0


def print_table(rows: list[tuple], evo: list[Instance], test: list[list], args) -> None:
    n_eval = sum(len(t) for t in test)
    print(f"\nSkill-R1 evaluation, held-out split of {args.suite}: {len(evo)} instances "
          f"({', '.join(sorted({i.type for i in evo}))}), {n_eval} evaluation tasks per row "
          f"({args.rollouts} rollout{'s' if args.rollouts > 1 else ''} each, averaged per task); "
          f"G={args.generations} K={args.candidates} n={args.rollouts}; task model "
          f"{args.task_model or args.task_url or f'embedded default (smollm2-135m, --task-quantize {args.task_quantize}, greedy)'}\n")
    print("| method | success (95% CI) | " + " | ".join(f"g={g + 1}" for g in range(args.generations)) +
          " | task calls: evolve | task calls: evaluate |")
    print("|---|---|" + "---|" * args.generations + "---|---|")
    for name, s, eval_calls, scores, per_gen, evolve_calls in rows:
        n = sum(len(g) for g in scores)
        lo, hi = wilson_interval(s * n, n)
        gens = " | ".join(f"{x:.3f}" for x in per_gen) if per_gen else " | ".join("–" * args.generations)
        print(f"| {name} | {s:.3f} ({lo:.2f}–{hi:.2f}) | {gens} | {evolve_calls} | {eval_calls} |")
    print("\nsuccess: share of evaluation tasks solved with the skill carried after the last generation; g=k: "
          "with the skill carried after generation k; evolve calls: task-model requests spent writing the skills "
          "(on each instance's own tasks); evaluate calls: requests spent scoring them.")
    if all(s == 0 for _, s, _, _, per_gen, _ in rows) and all(x == 0 for r in rows for x in r[4]):
        print("note: " + all_zero_note([t for ts in test for t in ts], training=False))
    print_paired(rows, args)


def print_paired(rows: list[tuple], args) -> None:
    """Every row against no skill, and the Skill-R1 row against every other row (minskill.paired): the
    same tasks, so the comparison is paired; the interval resamples instances."""
    by_name = {r[0]: r[3] for r in rows}
    pairs = [(r[0], rows[0][0]) for r in rows[1:]]
    skill_r1 = [r[0] for r in rows if r[0].startswith("Skill-R1 (")]
    for k, name in enumerate(skill_r1):   # each Skill-R1 row against every other row (each pair once)
        pairs += [(name, r[0]) for r in rows[1:] if r[0] != name and r[0] not in skill_r1[:k]]
    print("\n| row | against | paired difference (95% CI, by instance) | gained / lost | sign test p |\n"
          "|---|---|---|---|---|")
    for b, a in pairs:
        c = compare(by_name[a], by_name[b], seed=args.seed)
        lo, hi = c["ci95"]
        print(f"| {b} | {a} | {c['difference']:+.3f} ({lo:+.2f} to {hi:+.2f}) | {c['gained']} / {c['lost']} | "
              f"{c['p']:.3f} |")
