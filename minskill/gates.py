"""Acceptance gates: when may a new skill set replace the one it competes with (the incumbent)?

Three places in minskill keep one skill set and offer it challengers: MASA's hill climb (a candidate
against the best set so far), the choice of each MASA tree's result (the best node against the
tree's root), and the skill Skill-R1 carries between generations (the best candidate against the
current skill). Each asks one gate, chosen by a flag (`evolve_masa.py --gate`, `train_grpo.py
--carry-gate`; Skill-R1's strict carry, its default, is the paper's comparison written where it
runs, skill_r1.loop._carry, and keeps no record):

    strict   accept iff R(S') > R(S*)                     the papers' rule, as before this module
    paired   accept iff R(S') > R(S*)  and  gained > lost  and  p ≤ α   (α = --gate-alpha, 0.1)
    fresh    accept iff R(S') > R(S*)  and, on the GATE tasks,  gained > lost  and  p ≤ α   (MASA)

where both sets are scored on the SAME tasks t (s(t): a task's score, the mean over its rollouts)
and

    gained = #{t : s_{S'}(t) > s_{S*}(t)},   lost = #{t : s_{S'}(t) < s_{S*}(t)},
    m      = gained + lost
    p      = P(X ≥ gained),  X ~ Bin(m, 1/2)  =  Σ_{i = gained..m} C(m, i) / 2^m
             (one-sided exact sign test of "S' beats S* no more often than S* beats S'", ties
              dropped; paired.sign_test_p_greater)

So paired accepts a subset of what strict accepts: a higher mean that rests on one gained task of
four (m = 1, p = 1/2) is rejected; five gained and none lost (p = 1/32) passes at α = 0.1. With N
tasks and no losses the smallest p is 2^-N: a paired gate at α = 0.1 needs at least 4 untied tasks,
all gained.

Why per task here, when `train_grpo.py --eval` tests per instance (minskill/paired.py): a gate
compares two FIXED skill sets, each written once and scored on the same tasks, so conditional on the
two sets the tasks are independent draws and each is its own unit; the question is "is S' better
than S* on tasks like these", not "does the process that wrote S' tend to write better skills".
--eval scores a skill evolved afresh on each instance, so the tasks of one instance share one
sampled skill and only the instances are independent.

Why: with N = 6 episodes per evaluation and greedy rollouts, R moves in steps of 1/6 and the strict
rule accepts whatever the teacher's rewrite happened to fix on those tasks (the search reward
climbed 0.25 → 0.46 while the held-out result stayed 0.40 → 0.40, 3 tasks gained and 3 lost).

Which tasks are paired. MASA evaluates every hill-climb candidate on all the search tasks and every
node of a tree on the type's first N search tasks (masa.MasaSearch.type_tasks), and each evaluation
records its per-task rewards (metrics["task_rewards"]); Skill-R1 scores every candidate and the
current skill on all tasks of the instance (Candidate.outcomes, in task order). So in both, the
incumbent was already scored on the challenger's tasks and the gate costs no model call.
Re-evaluating it there would only repeat the same greedy, cached replies, and MASA's search tasks
are one fixed draw (--n-train; the held-out split must stay unseen), so no other fresh tasks are
drawn: the gate removes the noise of a small difference on a fixed task sample, not the bias of a
task sample the teacher has seen; only the held-out split shows that, so both gates are to be
measured there.

The fresh gate (MASA, `--gate fresh`, `fresh_decision`) is for that bias. Measured on the offline
default (qa), the climb's candidate gained 5 of the 24 search tasks and lost none (p = 1/32), so
paired accepted it like strict, and on the 40 held-out tasks it gained 3 and lost 3: a gain on the
very sample the search scores every candidate on (and picks the best of) is partly a gain on that
sample. So fresh keeps strict's R(S') > R(S*) on the search tasks and runs the sign test on GATE
tasks instead: --gate-tasks train tasks (default 24) drawn after the search and preliminary tasks
(evolve_masa.load_gate_tasks: disjoint from them and from the held-out split, by id, types
balanced), which the search never scores and the teacher never sees. The climb gates on all of them,
a tree's result on those of its type (qa's default: 6 per type). Both sets are rolled out on the
gate tasks only when R(S') > R(S*) (else there is nothing to test), and each side's gate-task
rewards are kept in the decision record (`gate_rewards`), apart from its search metrics (R on the
search tasks is unchanged); a later decision takes an incumbent's rewards from there, so it is not
paid for twice. Cost: at most |gate tasks| target rollouts per climb decision, plus |gate tasks|
once per incumbent (a tree: its type's share, per new best node and once for the root); no teacher
call.

Every decision is a record (`decision`):

    {"gate": "strict" | "paired", "alpha", "use": "climb" | "tree result" | "carry",
     "candidate", "incumbent" (ids), "candidate_reward", "incumbent_reward",
     "n" (tasks paired), "gained", "lost", "p" (one-sided; computed under strict too, as a record),
     "rescored" (fresh: gate tasks the incumbent was rolled out on for this decision; else 0),
     "accepted"}

and fresh's also says which tasks it used: n, gained, lost and p are then the gate tasks' (none when
R is not higher: n = 0, p = 1), and

     "tasks": "gate", "gate_tasks" (their ids),
     "search": {"n", "gained", "lost", "p"} (the search tasks', for the record),
     "gate_rewards": {"candidate": {task id: reward}, "incumbent": {...}}
"""
from __future__ import annotations

from typing import Callable

from minskill.paired import sign_test_p_greater

GATES = ("strict", "paired")            # every place (Skill-R1's --carry-gate too)
MASA_GATES = (*GATES, "fresh")          # evolve_masa.py --gate: fresh needs train tasks of its own


def check_gate(kind: str, alpha: float) -> None:   # at set-up, where evolve_masa.py parses flags
    if kind not in MASA_GATES:
        raise ValueError(f"gate must be one of {', '.join(MASA_GATES)}, got {kind!r}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"gate alpha must be in (0, 1], got {alpha}")


# ----------------------------------------------------------------------------------------------
# MASA

def masa_decision(candidate, incumbent, kind: str, alpha: float, use: str,
                  rewards: Callable[[object, list], dict] | None = None, gate_tasks: list = (),
                  history: list = ()) -> dict:
    """May MASA `candidate` (a SkillSetCandidate, evaluated) replace `incumbent`? Strict: its R
    is higher; paired: also significantly more tasks gained than lost (of those both were scored
    on); fresh: fresh_decision."""
    if kind == "fresh":
        return fresh_decision(candidate, incumbent, alpha, use, rewards, gate_tasks, history)
    mine, theirs = candidate.metrics["task_rewards"], incumbent.metrics["task_rewards"]
    scores = [(mine[t], theirs[t]) for t in mine if t in theirs]
    return decision(kind, alpha, use, candidate.id, incumbent.id, candidate.reward,
                    incumbent.reward, scores,
                    candidate.reward > incumbent.reward)


def fresh_decision(candidate, incumbent, alpha: float, use: str,
                   rewards: Callable[[object, list], dict],
                   gate_tasks: list, history: list = ()) -> dict:
    """--gate fresh (module docstring): R(S') > R(S*) on the search tasks, then the sign test on
    `gate_tasks`, both sides rolled out there (rewards(skills, tasks) -> {task id: reward}) where no
    earlier record in `history` (candidates) holds their reward yet."""
    strict_ok = candidate.reward > incumbent.reward
    mine, theirs, before = {}, {}, 0
    if strict_ok and gate_tasks:
        mine = _gate_rewards(candidate, gate_tasks, rewards, history)
        before = len(_recorded_gate_rewards(incumbent, history).keys() & {t.id for t in gate_tasks})
        theirs = _gate_rewards(incumbent, gate_tasks, rewards, history)
    on_search = masa_decision(candidate, incumbent, "paired", alpha, use)   # for the record only
    record = decision("fresh", alpha, use, candidate.id, incumbent.id, candidate.reward,
                      incumbent.reward,
                      [(mine[t], theirs[t]) for t in mine], strict_ok, rescored=len(theirs) - before
                      if theirs else 0)
    return {**record, "tasks": "gate", "gate_tasks": [t.id for t in gate_tasks],
            "search": {k: on_search[k] for k in ("n", "gained", "lost", "p")},
            "gate_rewards": {"candidate": mine, "incumbent": theirs}}


def _recorded_gate_rewards(candidate, history: list) -> dict:
    """The gate-task rewards that earlier fresh decisions (on any candidate in `history`) recorded
    for `candidate`."""
    known = {}
    for other in history:
        record = other.gate or {}
        for side in ("candidate", "incumbent"):
            if record.get(side) == candidate.id:
                known.update((record.get("gate_rewards") or {}).get(side) or {})
    return known


def _gate_rewards(candidate, gate_tasks: list, rewards: Callable[[object, list], dict],
                  history: list) -> dict:
    """{gate task id: reward} of `candidate`: recorded ones reused, the others rolled out now."""
    known = _recorded_gate_rewards(candidate, history)
    missing = [t for t in gate_tasks if t.id not in known]
    if missing:
        known.update(rewards(candidate.skills, missing))
    return {t.id: known[t.id] for t in gate_tasks}


# ----------------------------------------------------------------------------------------------
# Skill-R1

def carry(ev, group: list, best: int, cfg) -> tuple[str, float, dict]:
    """Skill-R1's carry gate (--carry-gate paired; loop._carry decides strict itself): (the skill
    carried on, its reward, the decision record) when group[best] challenges it."""
    challenger, n_tasks = group[best], len(ev.instance.tasks)
    incumbent_id, incumbent_outcomes = carried(ev)
    mine, theirs = per_task_means(challenger.outcomes, n_tasks), per_task_means(incumbent_outcomes,
                                                                                n_tasks)
    scores = list(zip(mine, theirs)) if mine is not None and theirs is not None else []
    strict_ok = challenger.skill is not None and challenger.reward > ev.final_reward
    record = decision(cfg.carry_gate, cfg.carry_gate_alpha, "carry",
                      f"g{challenger.generation}.{best}",
                      incumbent_id, challenger.reward, ev.final_reward, scores, strict_ok)
    if not record["accepted"]:
        return ev.final_skill, ev.final_reward, record
    return challenger.skill, challenger.reward, record


def carried(ev) -> tuple[str, list]:
    """(id, outcomes) of the skill an Evolution carries now: "g0" (the seed) or "g<g>.<i>"
    (lineage_records' ids)."""
    cid, outcomes = "g0", ev.seed_outcomes
    for gen in ev.generations:
        if gen.gate["accepted"]:
            cid, outcomes = f"g{gen.g}.{gen.best_index}", gen.candidates[gen.best_index].outcomes
    return cid, outcomes


def per_task_means(outcomes: list, n_tasks: int) -> list[float] | None:
    """The mean per task of outcomes in task order (skill_r1.score_skills); None when they do not
    split evenly."""
    if not outcomes or n_tasks == 0 or len(outcomes) % n_tasks:
        return None
    n = len(outcomes) // n_tasks
    return [sum(o.reward for o in outcomes[i * n:(i + 1) * n]) / n for i in range(n_tasks)]


# ----------------------------------------------------------------------------------------------
# Both: the decision record

def decision(kind: str, alpha: float, use: str, candidate, incumbent, candidate_reward: float,
             incumbent_reward: float, scores: list[tuple[float, float]], strict_ok: bool,
             rescored: int = 0) -> dict:
    """The gate's decision record (module docstring). `scores`: (candidate's, incumbent's) score per
    paired task; `strict_ok`: the strict rule's verdict (R(S') > R(S*), and e.g. that the skill
    parsed)."""
    gained = sum(a > b for a, b in scores)
    lost = sum(a < b for a, b in scores)
    p = sign_test_p_greater(gained, lost)
    accepted = bool(strict_ok) if kind == "strict" else bool(strict_ok and gained > lost
                                                             and p <= alpha)
    return {"gate": kind, "alpha": alpha, "use": use, "candidate": candidate,
            "incumbent": incumbent,
            "candidate_reward": candidate_reward, "incumbent_reward": incumbent_reward,
            "n": len(scores),
            "gained": gained, "lost": lost, "p": p, "rescored": rescored, "accepted": accepted}
