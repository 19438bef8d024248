"""The tables `train_grpo.py --eval` prints and records (minskill.skill_r1.evaluate measures the
rows; combine.py joins the rows of several runs): the rows' success with its interval, and the
paired comparisons by instance.

    success(row)     = mean over the row's evaluation scores (instance x task; a task's score: the
                       mean of its n rollouts), with a 95% interval (success_interval). A row with
                       an editor samples one skill per instance, so the tasks of an instance are not
                       independent and the instances are the unit: the interval is minskill.paired's
                       sign-flip inversion applied to the per-instance means m_j (the subset means'
                       order statistics, as for a paired difference), centred where the m_j are
                       symmetric. A row without an editor (no skill, the seed skill) scores one
                       fixed skill per type, so its tasks are the unit: a Wilson interval over its
                       distinct tasks (with --eval-scoring shared a task repeated across a type's
                       instances counts once)
    paired(row, a)   = minskill.paired.compare on the per-instance scores of the two rows: D̄, the
                       mean of the per-instance differences, its sign-flip test by instance and the
                       interval that inverts it

Every row is compared with no skill, and each Skill-R1 row with every other row, each pair once.
What p and the intervals generalise over (paired.generalises_over: under the paired table, and in
the report): new instances, each a skill evolved afresh; with --eval-scoring shared not new
scoring tasks, which the instances of a type share.
"""
from __future__ import annotations

from types import SimpleNamespace

from minskill.paired import compare, generalises_over, sign_flip
from minskill.paired import wilson_interval

EVAL_FILE = "eval.json"   # an --eval run's record in its folder (evaluate.eval_record)
FROZEN_ROW = "Skill-R1 inference-only (editor frozen)"   # the editor rows' names begin so
                                                         # (evaluate.eval_editors)
GRPO_ROW = "vanilla GRPO"


def print_table(rows: list[dict], evo: list, test: list[list], args, zero_note: str = "",
                cut_note: str | None = None) -> None:
    """The rows' table, then the paired one (print_paired); `zero_note` is said when every reward
    was 0, else `cut_note` (replies cut inside their reasoning: rollout.reasoning_cut_note)."""
    n_eval, n_distinct = sum(len(t) for t in test), len({x.id for ts in test for x in ts})
    shared = (f"(instance × task: {n_distinct} distinct tasks, a type's shared by its instances, "
              f"--eval-scoring shared) " if n_distinct < n_eval else "")
    task_model = args.task_model or args.task_url or (
        f"embedded default (smollm2-135m, --task-quantize {args.task_quantize}, greedy)")
    print(f"\nSkill-R1 evaluation, held-out split of {args.suite}: {len(evo)} instances "
          f"({', '.join(sorted({i.type for i in evo}))}), {n_eval} evaluation tasks per row "
          f"{shared}({args.rollouts} rollout{'s' if args.rollouts > 1 else ''} each, averaged per "
          f"task); G={args.generations} K={args.candidates} n={args.rollouts}; task model "
          f"{task_model}\n")
    print("| method | success (95% CI) | "
          + " | ".join(f"g={g + 1}" for g in range(args.generations)) +
          " | task calls: evolve | task calls: evaluate |")
    print("|---|---|" + "---|" * args.generations + "---|---|")
    for row in rows:
        lo, hi = success_interval(row, test)
        per_gen = row["per_generation"]
        gens = " | ".join(f"{x:.3f}"
                          for x in per_gen) if per_gen else " | ".join("–" * args.generations)
        print(f"| {row['name']} | {row['success']:.3f} ({lo:.2f}–{hi:.2f}) | {gens} | "
              f"{row['evolve_calls']} | {row['eval_calls']} |")
    print("\nsuccess: share of evaluation tasks solved with the skill carried after the last "
          "generation; g=k: with the skill carried after generation k; evolve calls: task-model "
          "requests spent writing the skills (on each instance's own tasks); evaluate calls: "
          "requests spent scoring them.")
    if zero_note and all(r["success"] == 0 for r in rows) and all(x == 0 for r in rows
                                                                  for x in r["per_generation"]):
        print("note: " + zero_note)
    elif cut_note:
        print(cut_note)
    print_paired(rows, args, test)


def joined_rows(first: dict, then: dict) -> dict:
    """One row from the rows of two runs of instances, `then`'s after `first`'s (--eval-chunk):
    per-instance fields joined, counts and costs summed; success is the mean of all the scores,
    each generation's success the mean weighted by the scoring tasks, the KL the mean over all the
    sampled tokens (each part's weighted by its own)."""
    n_first, n_then = (sum(len(g) for g in r["scores"]) for r in (first, then))
    flat = [x for g in first["scores"] + then["scores"] for x in g]
    kl = first["kl"]
    if kl is not None:
        weights = [r["costs"]["editor"]["sampled_tokens"] for r in (first, then)]
        kl = (first["kl"] * weights[0] + then["kl"] * weights[1]) / max(1, sum(weights))
    return {**{k: v for k, v in first.items() if k != "instances_done"},
            "success": sum(flat) / len(flat), "scores": first["scores"] + then["scores"],
            "skills": first["skills"] + then["skills"], "kl": kl,
            "per_generation": [(x * n_first + y * n_then) / (n_first + n_then)
                               for x, y in zip(first["per_generation"], then["per_generation"])],
            **{k: first[k] + then[k] for k in ("eval_calls", "evolve_calls", "rollouts",
                                                "reasoning_cut")},
            "costs": _summed(first["costs"], then["costs"])}


def _summed(a, b):
    """Two cost records (nested dicts of numbers or None) added leaf by leaf."""
    if isinstance(a, dict):
        return {k: _summed(v, b[k]) for k, v in a.items()}
    return None if a is None else a + b


def recorded_tasks(instances: list[dict]) -> list[list]:
    """The evaluation tasks of eval.json's instances as print_table and success_interval take them
    (objects with an id)."""
    return [[SimpleNamespace(id=t) for t in x["eval_tasks"]] for x in instances]


def success_interval(row: dict, test: list[list]) -> list[float]:
    """The 95% interval of a row's success (module docstring): by instance for a row with an editor
    (its "spec"), a Wilson interval over the distinct tasks for a row without one."""
    if row.get("spec"):
        means = [sum(g) / len(g) for g in row["scores"] if g]
        low, high = sign_flip(means)[1]
        return [max(0.0, low), min(1.0, high)]     # too few instances: sign_flip's (-1, 1) is
                                                   # "anything"
    n = len({t.id for ts in test for t in ts})
    return list(wilson_interval(row["success"] * n, n))


def paired_rows(rows: list[dict], seed: int) -> list[dict]:
    """Every row against no skill, each Skill-R1 row against every other row (each pair once), and
    each vanilla GRPO row against the inference-only row (what GRPO training did to the editor it
    started from), compared on the same tasks by instance (minskill.paired.compare: the sign-flip
    test on the per-instance differences and its interval; the per-task counts only describe)."""
    by_name = {r["name"]: r["scores"] for r in rows}
    pairs = [(r["name"], rows[0]["name"]) for r in rows[1:]]
    skill_r1 = [r["name"] for r in rows if r["name"].startswith("Skill-R1 (")]
    for k, name in enumerate(skill_r1):
        pairs += [(name, r["name"]) for r in rows[1:] if r["name"] != name
                  and r["name"] not in skill_r1[:k]]
    frozen = [r["name"] for r in rows if r["name"].startswith(FROZEN_ROW)]
    pairs += [(r["name"], f) for r in rows if r["name"].startswith(GRPO_ROW) for f in frozen]
    return [{"row": b, "against": a, **compare(by_name[a], by_name[b], seed=seed)}
            for b, a in pairs]


def print_paired(rows: list[dict], args, test: list[list]) -> None:
    """The paired table (paired_rows) as Markdown: by instance first, the per-task counts last, then
    what its p-values generalise over (paired.generalises_over)."""
    pairs = paired_rows(rows, args.seed)
    print("\n| row | against | paired difference (95% CI, by instance) | p (sign-flip, by "
          "instance) | per task: gained / lost |\n|---|---|---|---|---|")
    for c in pairs:
        lo, hi = c["ci95"]
        print(f"| {c['row']} | {c['against']} | {c['difference']:+.3f} ({lo:+.2f} to {hi:+.2f}) | "
              f"{c['p']:.3f} | {c['per_task_gained']} / {c['per_task_lost']} |")
    if pairs:
        print("\nby instance: the unit is the instance (its evaluation tasks share one evolved "
              f"skill): difference = mean over the {pairs[0]['instances']} instances of the "
              "per-instance mean difference; p: two-sided sign-flip permutation test on those "
              f"differences ({pairs[0]['test']}); the interval inverts it (minskill/paired.py; "
              "with fewer than 6 instances it is the whole range). per task: tasks scored higher "
              "/ lower, a description only, not a test.")
        print(generalises_over([[x.id for x in ts] for ts in test]))
