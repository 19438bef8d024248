"""Acceptance gates: when may a new skill set replace the one it competes with (the incumbent)?

Three places in minskill keep one skill set and offer it challengers: MASA's hill climb (a candidate against
the best set so far), the choice of each MASA tree's result (the best node against the tree's root), and the
skill Skill-R1 carries between generations (the best candidate against the current skill). Each asks one
gate, chosen by a flag (`evolve_masa.py --gate`, `train_grpo.py --carry-gate`):

    strict   accept iff R(S') > R(S*)                       the papers' rule, as before this module
    paired   accept iff R(S') > R(S*)  and  gained > lost  and  p ≤ α        (α = --gate-alpha, default 0.1)

where both sets are scored on the SAME tasks t (s(t): a task's score, the mean over its rollouts) and

    gained = #{t : s_{S'}(t) > s_{S*}(t)},   lost = #{t : s_{S'}(t) < s_{S*}(t)},   m = gained + lost
    p      = P(X ≥ gained),  X ~ Bin(m, 1/2)  =  Σ_{i = gained..m} C(m, i) / 2^m
             (one-sided exact sign test of "S' beats S* no more often than S* beats S'", ties dropped;
              paired.sign_test_p_greater)

So paired accepts a subset of what strict accepts: a higher mean that rests on one gained task of four
(m = 1, p = 1/2) is rejected; five gained and none lost (p = 1/32) passes at α = 0.1. With N tasks and no
losses the smallest p is 2^-N: a paired gate at α = 0.1 needs at least 4 untied tasks, all gained.

Why: with N = 6 episodes per evaluation and greedy rollouts, R moves in steps of 1/6 and the strict rule
accepts whatever the teacher's rewrite happened to fix on those tasks (the search reward climbed 0.25 →
0.46 while the held-out result stayed 0.40 → 0.40, 3 tasks gained and 3 lost: issue 16).

Which tasks are paired. MASA evaluates every hill-climb candidate on all the search tasks and every node of
a tree on the type's first N search tasks (masa.MasaSearch.type_tasks), and each evaluation records its
per-task rewards (metrics["task_rewards"]); Skill-R1 scores every candidate and the current skill on all
tasks of the instance (Candidate.outcomes, in task order). So in both, the incumbent was already scored on
the challenger's tasks and the gate costs no model call. Where the incumbent lacks a score on some of the
challenger's tasks (a MASA state written before per-task rewards were recorded), the paired gate
re-evaluates the incumbent on exactly those tasks (`masa_decision`'s `rescore`). Re-evaluating on tasks it
was already scored on would only repeat the same greedy, cached replies, and MASA's search tasks are one
fixed draw (--n-train; the held-out split must stay unseen), so no other fresh tasks are drawn: the gate
removes the noise of a small difference on a fixed task sample, not the bias of a task sample the teacher
has seen; only the held-out split shows that (issue 16 asks for both gates to be measured there).

Every decision is a record (`decision`):

    {"gate": "strict" | "paired", "alpha", "use": "climb" | "tree result" | "carry",
     "candidate", "incumbent" (ids), "candidate_reward", "incumbent_reward",
     "n" (tasks paired), "gained", "lost", "p" (one-sided; also computed under strict, for the record),
     "rescored" (MASA: tasks the incumbent was re-evaluated on), "accepted"}
"""
from __future__ import annotations

from typing import Callable

from minskill.paired import sign_test_p_greater

GATES = ("strict", "paired")


def check_gate(kind: str, alpha: float) -> None:
    if kind not in GATES:
        raise ValueError(f"gate must be one of {', '.join(GATES)}, got {kind!r}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"gate alpha must be in (0, 1], got {alpha}")


def decision(kind: str, alpha: float, use: str, candidate, incumbent, candidate_reward: float,
             incumbent_reward: float, scores: list[tuple[float, float]], strict_ok: bool, rescored: int = 0) -> dict:
    """The gate's decision record (module docstring). `scores`: (candidate's, incumbent's) score per paired
    task; `strict_ok`: the strict rule's verdict (R(S') > R(S*), plus whatever the caller requires, e.g. that
    the skill parsed)."""
    check_gate(kind, alpha)
    gained = sum(a > b for a, b in scores)
    lost = sum(a < b for a, b in scores)
    p = sign_test_p_greater(gained, lost)
    accepted = bool(strict_ok) if kind == "strict" else bool(strict_ok and gained > lost and p <= alpha)
    return {"gate": kind, "alpha": alpha, "use": use, "candidate": candidate, "incumbent": incumbent,
            "candidate_reward": candidate_reward, "incumbent_reward": incumbent_reward, "n": len(scores),
            "gained": gained, "lost": lost, "p": p, "rescored": rescored, "accepted": accepted}


# ---------------------------------------------------------------------------------------------- MASA

def _task_rewards(candidate) -> dict:
    return dict((candidate.metrics or {}).get("task_rewards") or {})


def masa_decision(candidate, incumbent, kind: str, alpha: float, use: str,
                  rescore: Callable[[list[str]], dict] | None = None) -> dict:
    """May MASA candidate `candidate` (masa.Candidate, evaluated) replace `incumbent`? Strict: its R is higher.
    Paired: also significantly more tasks gained than lost, on the candidate's tasks; the incumbent is first
    re-evaluated (rescore(task ids) -> {task id: reward}) on those of them it has no score for."""
    mine, theirs = _task_rewards(candidate), _task_rewards(incumbent)
    missing = [t for t in mine if t not in theirs]
    if kind == "paired" and missing and rescore is not None:
        theirs.update(rescore(missing))
    scores = [(mine[t], theirs[t]) for t in mine if t in theirs]
    return decision(kind, alpha, use, candidate.id, incumbent.id, candidate.reward, incumbent.reward, scores,
                    candidate.reward > incumbent.reward,
                    rescored=len(missing) if kind == "paired" and rescore is not None else 0)


# ---------------------------------------------------------------------------------------------- Skill-R1

def per_task_means(outcomes: list, n_tasks: int) -> list[float] | None:
    """Outcomes come in task order, a task's n rollouts together (skill_r1.score_skills): the mean per task;
    None when they do not split evenly (e.g. a reply that did not parse has no outcomes)."""
    if not outcomes or n_tasks == 0 or len(outcomes) % n_tasks:
        return None
    n = len(outcomes) // n_tasks
    return [sum(o.reward for o in outcomes[i * n:(i + 1) * n]) / n for i in range(n_tasks)]


def carried(ev) -> tuple[str, list]:
    """(id, outcomes) of the skill an Evolution carries now: "g0" (the seed skill) or "g<g>.<i>" (a candidate;
    the ids of provenance.lineage_records). A generation without a decision record counts as accepting
    exactly when its carried reward changed (the strict rule only takes a strictly better skill)."""
    cid, outcomes, reward = "g0", ev.seed_outcomes, ev.seed_reward
    for gen in ev.generations:
        took = gen.gate["accepted"] if gen.gate is not None else gen.current_reward != reward
        if took:
            cid, outcomes = f"g{gen.g}.{gen.best_index}", gen.candidates[gen.best_index].outcomes
        reward = gen.current_reward
    return cid, outcomes


def carry(ev, group: list, best: int, cfg) -> tuple[str, float, dict]:
    """Skill-R1's carry gate (skill_r1._carry): (the skill carried after this generation, its reward, the
    decision). The challenger is the generation's best candidate group[best]; strict accepts it when it parsed
    and its reward beats the current skill's; paired also compares its per-task scores with the current
    skill's on the instance's tasks (cfg.carry_gate, cfg.carry_gate_alpha)."""
    challenger, n_tasks = group[best], len(ev.instance.tasks)
    incumbent_id, incumbent_outcomes = carried(ev)
    mine, theirs = per_task_means(challenger.outcomes, n_tasks), per_task_means(incumbent_outcomes, n_tasks)
    scores = list(zip(mine, theirs)) if mine is not None and theirs is not None else []
    strict_ok = challenger.skill is not None and challenger.reward > ev.final_reward
    record = decision(cfg.carry_gate, cfg.carry_gate_alpha, "carry", f"g{challenger.generation}.{best}",
                      incumbent_id, challenger.reward, ev.final_reward, scores, strict_ok)
    if record["accepted"]:
        return challenger.skill, challenger.reward, record
    return ev.final_skill, ev.final_reward, record
