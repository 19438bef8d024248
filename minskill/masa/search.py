"""MASA stage 1 (Model-Aware Skill Alignment): a teacher LLM evolves a skill library for one target.

The target F is a frozen model behind an OpenAI-compatible URL; it is described to the teacher by a
*model card* (minskill/masa/model_card.py: family, size, architecture, context, strengths,
weaknesses, ...). Strengths and weaknesses are summarised by the teacher from a few preliminary
rollouts kept apart from the search and from evaluation (`summarize_model`).

Reward of a skill set S on a list of tasks (computed once, by rollout.summarize, as
`adjusted_reward`):

    R(S) = SR − λ_nh · NHR    SR  = share of tasks solved
                              NHR = mean over episodes of (steps answered "Nothing happens.")/steps

Every skill set the search makes is a `SkillSetCandidate` (its skills, parent, reward, metrics, the
teacher's attribution): the payload of the hill climb and of the tree nodes, and one record of the
search log. `MasaSearch.run` drives both phases, one iteration at a time, yielding a progress line
after each: the caller prints it and saves the search's state (`MasaSearch.checkpoint`).

Phase 1, general skills, hill climbing (`MasaSearch.climb_iteration`):

    S* = S_0 (base skills), R* = R(S_0) on the search tasks
    for it = 1..I, while fewer than p consecutive iterations failed to improve:
        failures of S*              -> teacher: structured failure attribution A (JSON)
        (S*, A, card, top-5 sets of the whole history by R) -> teacher: new general skills S'
        accept S' (S* <- S', R* <- R(S')) only if R(S') > R*  (strictly; equal or worse is rejected)
        (--gate paired: only if it also wins a one-sided sign test on the per-task rewards; --gate
         fresh: on gate tasks apart from the search tasks instead, never shown to the teacher;
         minskill/gates.py)

Phase 2, task-specific skills, one UCB1 tree per task type t with the general skills of S* fixed
(`MasaSearch.tree_iteration`: select, expand, evaluate, backpropagate of minskill/masa/ucb.py):

    root = S*'s skills for t; a node's reward = R over N episodes of type t
    select by UCB1(n) = R̄(n) + C · sqrt(ln N(parent) / N(n))  (R̄: mean over n and its descendants)
    expand = failures of the node -> teacher attribution -> teacher rewrite of t's skills -> child
    J iterations; the tree's best node (highest own reward) gives t's skills in the evolved library
    (--gate paired / fresh: the best node replaces the root only when it wins the sign test against
     the root, fresh on the gate tasks of type t).
    (A node gets up to `max_children` sibling rewrites before selection descends below it; ucb.py.)

Both phases stop early once the best R is 1, the maximum (nothing can be strictly better). The
evolved library = the best general skills + each type's best node; its R on the search tasks is
`reward_out`. What is said to the teacher and read from it (the prompts, the retries of a reply that
does not parse, a prompt sent shorter, a step skipped and logged) is minskill/masa/teacher.py's.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Iterator

from minskill import gates
from minskill.masa import ucb
from minskill.masa.model_card import ModelCard
from minskill.masa.reply_schema import asks_json, skillset_schema
from minskill.masa.teacher import (ask_fitting, ask_teacher, attribution_messages, clip_text,
                                   general_rewrite_messages, parse_attribution,
                                   parse_skillset_reply, parse_strengths, strengths_messages,
                                   task_rewrite_messages, teacher_seed)
from minskill.rollout import LAM_NH, all_failed, run_rollouts, summarize
from minskill.serve.caching import BudgetExhausted, CallBudget
from minskill.serve.client import ChatError
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from minskill.tasks.base import interleave


@dataclass
class MasaConfig:
    lam_nh: float = LAM_NH         # λ of R = SR − λ·NHR (rollout.LAM_NH)
    iterations: int = 2            # I: hill-climbing iterations on the general skills (paper: 10)
    patience: int = 3              # p: stop after this many iterations without a strict improvement
    tree_iterations: int = 1       # J: UCB1 iterations per task type (paper: 10)
    episodes: int = 6              # N: episodes (tasks of the type) per tree-node evaluation
    c: float = 1.4                 # UCB1 exploration constant
    max_children: int = 3          # rewrites of a tree node before the search descends (ucb.select)
    seed: int = 0
    teacher_retries: int = 1       # a served teacher's; the embedded one's: EMBEDDED_TEACHER
    teacher_temperature: float = 0.7
    teacher_max_tokens: int = 1536
    teacher_json_schema: str = "auto"   # ask for the reply's JSON schema: auto | on | off
    target_temperature: float = 0.0
    target_max_tokens: int = 128
    max_failures: int = 6          # failed episodes shown to the teacher per attribution
    skill_max_tokens: int = 1024   # token budget of the skills in the target's system prompt
    gate: str = "strict"           # acceptance gate of the climb and of each tree's result
    gate_alpha: float = 0.1        # α of the paired gate's sign test


class MasaSearch:
    """Stage 1 for one target: hill climbing on the general skills, then one UCB1 tree per task
    type.

    The search holds `candidates` (every skill set it made, in order: the search log), `climb` (the
    hill climb; its best is a SkillSetCandidate), `trees` (per task type, nodes holding
    SkillSetCandidates), `events` (skipped teacher replies, prompts sent trimmed) and `phase`.
    `run()` yields a progress line after every iteration; the caller prints it (and the teacher
    events meanwhile, in `events`) and saves the state, `checkpoint()`: a search built with that
    state (`state=`, or `restore`) continues where it stopped. Model calls go through the given
    clients (CachingClient for the budget and cache); BudgetExhausted propagates to the caller, who
    can roll back to the last state saved (`last_checkpoint`)."""

    def __init__(self, target, teacher, card: ModelCard, tasks: list, base_skills: SkillSet,
                 config: MasaConfig, state: dict | None = None, budget: CallBudget | None = None,
                 gate_tasks=()):
        if not tasks:
            raise ValueError("MasaSearch: no search tasks")
        self.target, self.teacher, self.card, self.tasks = target, teacher, card, tasks
        self.config, self.base_skills, self.budget = config, base_skills, budget
        self.gate_tasks = list(gate_tasks)   # --gate fresh
        self.types = sorted({t.type for t in tasks})
        self.candidates: list[SkillSetCandidate] = []
        self.climb: HillClimbState | None = None
        self.trees: dict[str, Tree] = {}
        self.events, self.phase = [], "general"   # teacher skips and trims; general | trees | done
        if state is not None:
            self.restore(state)
        self.last_checkpoint = copy.deepcopy(self.to_json())

    def run(self) -> Iterator[str | None]:
        """Both phases, from wherever the search stands, yielding after every iteration (and after
        the base skills, each root and each phase: None) its progress line. Raises BudgetExhausted
        when the budget runs out."""
        c = self.config
        if self.phase == "general":   # phase 1: hill climbing on the general skills (search tasks)
            if self.climb is None:
                yield self.start_climb()
            while self.climb.iteration < c.iterations and self.climb.stale < c.patience \
                    and self.climb.best.reward < 1:
                yield self.climb_iteration()
            self.phase = "trees"
            yield None
        if self.phase == "trees":     # phase 2: one UCB1 tree per task type, general skills fixed
            for task_type in self.types:
                tasks = self.type_tasks(task_type)
                if task_type not in self.trees:
                    yield self.plant_tree(task_type, tasks)
                tree = self.trees[task_type]
                while tree.iterations < c.tree_iterations and ucb.best_node(tree.root).reward < 1:
                    yield self.tree_iteration(tree, task_type, tasks)
            self.phase = "done"
            yield None

    # ---- phase 1: hill climbing on the general skills ------------------------------------------
    def start_climb(self) -> str:
        base = self.add_candidate(self.base_skills, "base")
        self.evaluate_candidate(base, self.tasks)
        base.accepted = True
        self.climb = HillClimbState(best=base)
        return (f"[general] base skills: R = {base.reward:.3f} on {len(self.tasks)} tasks  "
                f"calls {self.calls()}")

    def climb_iteration(self) -> str:
        """Phase 1's iteration: a rewrite of the best set's general skills, kept if the gate
        accepts it."""
        climb, accepted = self.climb, False
        candidate = self.propose_general(climb)
        if candidate is not None:
            self.evaluate_candidate(candidate, self.tasks)
            candidate.accepted = accepted = self.gate(candidate, climb.best, "climb")
        climb.iteration += 1
        climb.best, climb.stale = (candidate, 0) if accepted else (climb.best, climb.stale + 1)
        verdict = "skipped" if candidate is None else f"R = {candidate.reward:.3f} " + \
            ("accepted" if accepted else "rejected")
        return (f"[general] iteration {climb.iteration}/{self.config.iterations}: candidate "
                f"{verdict}; best R = {climb.best.reward:.3f}; calls {self.calls()}")

    def propose_general(self, climb: HillClimbState) -> SkillSetCandidate | None:
        """The teacher attributes the best set's failures, then rewrites its general skills; None:
        a reply skipped."""
        best, it = climb.best, climb.iteration + 1
        attribution = self.ask(
            partial(attribution_messages, self.card, best.skills, best.failures, best.reward),
            parse_attribution, "attribution", it)
        history = sorted((x for x in self.candidates
                          if x.phase in ("base", "general") and x.reward is not None),
                         key=lambda x: (-x.reward, x.id))[:5]
        messages = partial(general_rewrite_messages, self.card, best.skills, best.reward,
                           attribution, [(x.skills, x.reward) for x in history],   # (trim=0): all
                           json_reply=asks_json(self.teacher, self.config.teacher_json_schema))
        new = self.ask(messages, parse_skillset_reply, "general rewrite", it)
        if new is None:
            return None
        general = _unique(new.general or new.skills())   # a reply without general skills: any
        skills = SkillSet(general=general, task_specific=dict(best.skills.task_specific),
                          common_mistakes=new.common_mistakes or best.skills.common_mistakes)
        return self.add_candidate(skills, "general", best, it, attribution=attribution)

    # ---- phase 2: one UCB1 tree per task type --------------------------------------------------
    def plant_tree(self, task_type: str, tasks: list) -> str:
        """The root: the climb's best set, evaluated on the type's episodes (before iteration 1)."""
        best = self.climb.best
        root = ucb.Node(payload=self.add_candidate(best.skills, "tree", best, 0, task_type))
        reward = ucb.set_reward(root, self.evaluate_node(root, tasks))
        ucb.backpropagate(root, reward)
        self.trees[task_type] = Tree(root)
        return (f"[tree {task_type}] root: R = {reward:.3f} on {len(tasks)} episodes  "
                f"calls {self.calls()}")

    def tree_iteration(self, tree: Tree, task_type: str, tasks: list) -> str:
        """Phase 2's iteration (ucb.py): select a node, expand it by the teacher's rewrite,
        evaluate, backpropagate."""
        c = self.config
        selected = ucb.select(tree.root, c.c, c.max_children)
        it = tree.iterations + 1
        candidate = self.propose_task_skills(selected.payload, task_type, tasks, it)
        child = None if candidate is None else ucb.expand(selected, candidate)
        if child is not None:
            ucb.backpropagate(child, ucb.set_reward(child, self.evaluate_node(child, tasks)))
        tree.iterations += 1
        self.tree_result(tree)   # decided (and saved) as the best node changes
        verdict = "skipped" if child is None else f"R = {child.reward:.3f}"
        best = ucb.best_node(tree.root).reward
        return (f"[tree {task_type}] iteration {tree.iterations}/{c.tree_iterations}: expanded "
                f"node {selected.id}, child {verdict}; best R = {best:.3f}; calls {self.calls()}")

    def propose_task_skills(self, parent: SkillSetCandidate, task_type: str, tasks: list,
                            it: int) -> SkillSetCandidate | None:
        """Expansion: the teacher attributes the node's failures, then rewrites `task_type`'s
        skills; None: skipped."""
        attribution = self.ask(partial(attribution_messages, self.card, parent.skills,
                                       parent.failures, parent.reward, task_type),
                               parse_attribution, "attribution", task_type, it)
        messages = partial(task_rewrite_messages, self.card, parent.skills, task_type,
                           parent.reward, attribution, [t.question for t in tasks[:3]],
                           json_reply=asks_json(self.teacher, self.config.teacher_json_schema))
        new = self.ask(messages, parse_skillset_reply, "task rewrite", task_type, it,
                       schema=partial(skillset_schema, task_types=[task_type], general=False))
        if new is None:
            return None
        rewritten = new.task_specific.get(task_type) or _unique(new.general + [
            s for t, group in new.task_specific.items() if t != task_type for s in group])
        skills = SkillSet(general=parent.skills.general,
                          common_mistakes=parent.skills.common_mistakes,
                          task_specific={**parent.skills.task_specific, task_type: rewritten})
        return self.add_candidate(skills, "tree", parent, it, task_type, attribution)

    def type_tasks(self, task_type: str) -> list:
        return [t for t in self.tasks if t.type == task_type][:self.config.episodes]

    # ---- the teacher (minskill/masa/teacher.py) ------------------------------------------------
    def ask(self, prompt, parse, what: str, *seed_parts, schema=None):
        """One teacher step (teacher.ask_fitting): prompt(trim=...) a builder's messages; schema:
        schema(max_tokens), the reply's (None: its reader's)."""
        c = self.config
        return ask_fitting(ask_teacher, self.teacher, prompt, parse, what=what,
                           retries=c.teacher_retries, temperature=c.teacher_temperature,
                           max_tokens=c.teacher_max_tokens,
                           seed=teacher_seed(c.seed, what, *seed_parts), on_skip=self._skip,
                           on_trim=self._trim, json_schema=c.teacher_json_schema, schema=schema)

    def _skip(self, event: dict) -> None:   # printed by the caller with the iteration's progress
        self.events.append({"event": "teacher_skip", "phase": self.phase, **event})

    def _trim(self, event: dict) -> None:   # a prompt sent shorter (ask_fitting); printed as skips
        self.events.append({"event": "teacher_trim", "phase": self.phase, **event})

    # ---- candidates and their evaluation -------------------------------------------------------
    def add_candidate(self, skills: SkillSet, phase: str, parent: SkillSetCandidate | None = None,
                      iteration: int = 0, task_type: str | None = None,
                      attribution: dict | None = None) -> SkillSetCandidate:
        # the candidate holds its skills as the log records them (a JSON round trip, which drops
        # resource files; the base skills' come back by name, skills.py), so a resumed search shows
        # the same prompts
        logged = SkillSet.from_json(skills.to_json()).carry_resources(self.base_skills)
        candidate = SkillSetCandidate(len(self.candidates), phase, logged,
                                      None if parent is None else parent.id, iteration, task_type,
                                      attribution=attribution)
        self.candidates.append(candidate)
        return candidate

    def evaluate_node(self, node: ucb.Node, tasks: list) -> float:
        node.payload.node = node.id   # the tree's name for the candidate, for the search log
        return self.evaluate_candidate(node.payload, tasks)

    def evaluate_candidate(self, candidate: SkillSetCandidate, tasks: list) -> float:
        candidate.metrics, candidate.failures = self.evaluate(candidate.skills, tasks)
        candidate.reward = candidate.metrics["adjusted_reward"]
        return candidate.reward

    def evaluate(self, skills: SkillSet, tasks: list) -> tuple[dict, list[dict]]:
        """(metrics, failure records) of `skills` on `tasks`: R is `adjusted_reward`, a task's in
        `task_rewards`."""
        trajectories = rollouts(self.target, tasks, skills, self.config, self.budget)
        metrics = _metrics(summarize(trajectories, lam_nh=self.config.lam_nh), trajectories)
        if 0 < metrics["errors"] == metrics["n"]:   # the target answered nothing: stop, not R = 0
            raise TargetFailed(all_failed(trajectories))
        return metrics, failure_records(tasks, trajectories, self.config.max_failures)

    # ---- results, and the gate a candidate must pass -------------------------------------------
    def library(self) -> SkillSet:
        """The evolved library: the best general skills, and each type's skills from its tree's
        best node."""
        if self.climb is None:
            return self.base_skills
        best = self.climb.best.skills
        task_specific = dict(best.task_specific)
        for task_type, candidate in self.best_per_type().items():
            task_specific[task_type] = candidate.skills.task_specific.get(task_type, [])
        return SkillSet(general=best.general, task_specific=task_specific,
                        common_mistakes=best.common_mistakes)

    def best_per_type(self) -> dict[str, SkillSetCandidate]:
        """Each task type's tree result (`tree_result`: its best node's candidate, or the root's
        when the gate rejects that node; types without a tree are left out; a tree is kept only once
        its root is evaluated)."""
        return {t: self.tree_result(tree) for t, tree in self.trees.items()}

    def tree_result(self, tree: Tree) -> SkillSetCandidate:
        """The tree's result: its best node's candidate if the gate lets it replace the root's
        (strict: it does), else the root's."""
        best, root = ucb.best_node(tree.root).payload, tree.root.payload
        if best is root:
            return root
        if (best.gate or {}).get("use") != "tree result" or best.gate.get("incumbent") != root.id:
            self.gate(best, root, "tree result")
        return best if best.gate["accepted"] else root

    def gate(self, candidate: SkillSetCandidate, incumbent: SkillSetCandidate, use: str) -> bool:
        """Whether `candidate` may replace `incumbent` under --gate (minskill/gates.py); the
        decision is kept on it. Fresh rolls both out on the gate tasks (in a tree: those of its
        type), which the teacher never sees."""
        c = self.config
        gate_tasks = [t for t in self.gate_tasks if candidate.task_type in (None, t.type)]
        rewards = lambda skills, tasks: \
            self.evaluate(skills, tasks)[0]["task_rewards"]  # noqa: E731
        candidate.gate = gates.masa_decision(candidate, incumbent, c.gate, c.gate_alpha, use,
                                             rewards, gate_tasks, self.candidates)
        return candidate.gate["accepted"]

    # ---- checkpoints ---------------------------------------------------------------------------
    def calls(self) -> int:
        return self.budget.spent if self.budget is not None else 0

    def checkpoint(self) -> dict:   # the state to save (the caller's, after each iteration), kept
        self.last_checkpoint = copy.deepcopy(self.to_json())   # for a rollback
        return self.last_checkpoint

    def to_json(self) -> dict:
        """The search as plain JSON: the candidates, and the climb and trees with candidate ids as
        payloads."""
        by_id, climb = (lambda candidate: candidate.id), self.climb   # noqa: E731
        candidates = [
            {k: x.skills.to_json() if k == "skills" else getattr(x, k) for k in CANDIDATE_KEYS}
            for x in self.candidates
        ]
        general = None if climb is None else {"best": climb.best.id,
                                              "best_reward": climb.best.reward,
                                              "iteration": climb.iteration, "stale": climb.stale}
        return {"candidates": candidates, "general": general,
                "trees": {t: {"root": ucb.to_dict(tree.root, by_id), "iterations": tree.iterations}
                          for t, tree in self.trees.items()},
                "events": list(self.events), "phase": self.phase}

    def restore(self, state: dict) -> None:
        """Set the search to a state written by to_json (a checkpoint)."""
        state = copy.deepcopy(state)   # the caller keeps its checkpoint as it was
        self.candidates = [  # the skills as add_candidate holds them
            SkillSetCandidate(
                **{**x, "skills": SkillSet.from_json(x["skills"]).carry_resources(self.base_skills)}
            )
            for x in state["candidates"]
        ]
        by_id, climb = self.candidates.__getitem__, state["general"]
        self.climb = None if climb is None else \
            HillClimbState(by_id(climb["best"]), climb["iteration"], climb["stale"])
        self.trees = {t: Tree(ucb.from_dict(tree["root"], by_id), tree["iterations"])
                      for t, tree in state["trees"].items()}
        self.events, self.phase = state["events"], state["phase"]


def summarize_model(teacher, card: ModelCard, target, tasks: list, config: MasaConfig,
                    on_skip: Callable[[dict], None] | None = None, skills: SkillSet | None = None,
                    budget: CallBudget | None = None) -> ModelCard:
    """Fill the card's strengths and weaknesses: roll the target out on `tasks` (preliminary tasks,
    kept apart from search and evaluation) and let the teacher summarise what it saw. Unchanged if
    skipped."""
    trajectories = rollouts(target, tasks, skills, config, budget)
    if failed := all_failed(trajectories):   # a card written from errors would stay for the run
        raise TargetFailed(f"the preliminary rollouts: {failed}")
    summary = summarize(trajectories, lam_nh=config.lam_nh)
    stats = "; ".join(f"{t}: {s['success_rate']:.2f} solved of {s['n']}"
                      for t, s in summary["per_type"].items())
    by_id = {t.id: t for t in tasks}
    successes = [episode_record(by_id.get(tr.task_id), tr) for tr in trajectories if tr.success][:3]
    failures = failure_records(tasks, trajectories, config.max_failures)
    result = ask_fitting(ask_teacher, teacher,
                         partial(strengths_messages, card, failures, successes, stats),
                         parse_strengths, what="model summary", retries=config.teacher_retries,
                         temperature=config.teacher_temperature,
                         max_tokens=config.teacher_max_tokens,
                         seed=teacher_seed(config.seed, "summary"), on_skip=on_skip,
                         json_schema=config.teacher_json_schema)
    if result is None:
        return card
    return replace(card, strengths=result["strengths"] or card.strengths,
                   weaknesses=result["weaknesses"] or card.weaknesses)


def search_log(state: dict) -> list[dict]:
    """The search log of a search's JSON state: every candidate (reward, parent, phase, tree node,
    teacher attribution, accepted, metrics) in creation order, then the events (teacher skips and
    trims, budget stop)."""
    keys = ("id", "phase", "task_type", "parent", "iteration", "node", "reward", "accepted",
            "attribution", "metrics", "skills")
    return ([{"kind": "candidate", **{k: x[k] for k in keys}, "gate": x.get("gate")}
             for x in state.get("candidates", [])]
            + [{"kind": "event", **e} for e in state.get("events", [])])


@dataclass(eq=False)
class SkillSetCandidate:
    """One skill set of the search (module docstring). `parent`: the id of the candidate it was
    rewritten from; `node`: its tree node's id; `failures`: once evaluated, the failed episodes the
    teacher is shown."""
    id: int
    phase: str                      # "base" | "general" | "tree"
    skills: SkillSet
    parent: int | None = None
    iteration: int = 0
    task_type: str | None = None
    node: str | None = None
    attribution: dict | None = None
    reward: float | None = None
    metrics: dict | None = None
    accepted: bool | None = None
    failures: list[dict] = field(default_factory=list)
    gate: dict | None = None        # the gate's decision on it, when it challenged an incumbent


# a SkillSetCandidate in the search's state (MasaSearch.to_json, state.json), its fields in order
CANDIDATE_KEYS = ("id", "phase", "task_type", "parent", "iteration", "node", "skills", "reward",
                  "metrics", "attribution", "accepted", "failures", "gate")


@dataclass
class HillClimbState:
    """The climb's best SkillSetCandidate, its iterations, and `stale`: iterations since it improved
    (stop at `patience`)."""
    best: SkillSetCandidate
    iteration: int = 0
    stale: int = 0


@dataclass
class Tree:
    """One task type's UCB1 tree (node payloads: SkillSetCandidates) and the iterations it has
    run."""
    root: ucb.Node
    iterations: int = 0


class TargetFailed(ChatError):
    """Every rollout of an evaluation ended with an error (rollout.all_failed): the target answered
    nothing, so no R of 0 is taken. A ChatError: evolve_masa.py stops as on a failing endpoint
    (exit 1, the last finished iteration saved for --resume)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.args = (message,)   # said as it is, without ChatError's "chat request failed" frame


def rollouts(target, tasks: list, skills: SkillSet | None, config: MasaConfig,
             budget: CallBudget | None = None):
    """One rollout per task under `skills`; BudgetExhausted if the budget refused a call (cached
    calls are free)."""
    refusals = budget.refusals if budget is not None else 0
    trajectories = run_rollouts(target, tasks, skills, n=1, temperature=config.target_temperature,
                                max_tokens=config.target_max_tokens, seed=config.seed,
                                skill_max_tokens=config.skill_max_tokens)
    if budget is not None and budget.refusals > refusals:
        raise BudgetExhausted(f"call budget spent ({budget.spent} of {budget.max_calls} calls)")
    return trajectories


def _metrics(summary: dict, trajectories=()) -> dict:
    keep = ("n", "success_rate", "nhr", "adjusted_reward", "mean_steps", "errors")
    return {**{k: summary[k] for k in keep + ("reasoning_cut",)},   # (not per type)
            "task_rewards": {t.task_id: t.reward for t in trajectories},
            "per_type": {t: {k: s[k] for k in keep} for t, s in summary["per_type"].items()}}


def failure_records(tasks, trajectories, limit: int) -> list[dict]:
    """Up to `limit` failed trajectories as short records for the teacher, round-robin over the
    task types."""
    by_id, by_type = {t.id: t for t in tasks}, {}
    for traj in (t for t in trajectories if not t.success):
        by_type.setdefault(traj.task_type, []).append(traj)
    return [episode_record(by_id.get(traj.task_id), traj)
            for traj in interleave(by_type, sorted(by_type))[:limit]]


def episode_record(task, traj) -> dict:
    transcript = _transcript(traj) if traj.actions else ""   # multi-turn: the episode's last steps
    return {"task_id": traj.task_id, "task_type": traj.task_type, "error": traj.error,
            "question": clip_text(getattr(task, "question", ""), 1500),   # task None: not there
            "expected": getattr(task, "answer", None), "reply": clip_text(traj.reply, 800),
            "transcript": transcript, "steps": traj.steps, "nothing_happens": traj.nothing_happens}


def _transcript(traj) -> str:
    steps = [f"> {a} -> {o}" for a, o in zip(traj.actions, traj.observations[1:])]
    first = traj.observations[0] if traj.observations else ""
    return clip_text(first + "\n" + "\n".join(steps[-8:]), 1500)


def _unique(skills: list[Skill]) -> list[Skill]:
    """The skills with repeated names made distinct (name-2, name-3, ...): a group may not repeat a
    name."""
    out, taken = [], set()
    for skill in skills:
        name, k = skill.name, 2
        while name in taken:
            name, k = f"{skill.name[:60].rstrip('-')}-{k}", k + 1
        taken.add(name)
        out.append(skill if name == skill.name else replace(skill, name=name))
    return out
