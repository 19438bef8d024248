"""Skill-R1's multi-generation skill evolution (for one or several task instances) and the editor's prompt.

A *task instance* x is a handful of tasks of one type (`Instance.tasks`); a skill s is the text the frozen
task model π_task reads as its system prompt. With the skill editor π_θ (a minskill model) the loop is

    H_0 = {(s_0, rollouts of s_0, r_0)}                       s_0: the seed skill ("" = no skill)
    for g = 1..G:
        s_g^(i) ~ π_θ( · | x, H_{g−1}),  i = 1..K              K candidates sampled from ONE shared prompt
        r_g^(i) = mean verifier score of n rollouts y ~ π_task( · | x, s_g^(i)) on every task of x
        A_intra(g,i) = r_g^(i) − mean_i r_g^(i)                (optionally / (std_i + 1e-4))
        A_inter(g)   = mean_i r_g^(i) − mean_i r_{g−1}^(i)      (generation 0's "mean" is r_0)
        A(g,i)       = A_intra(g,i) + λ·A_inter(g)             (grpo.bilevel_advantages)
        H_g = H_{g−1} ∪ {(s_g^(i), rollouts, r_g^(i))}
        current skill ← best s_g^(i) if its reward beats the current skill's (else it stays)

`evolve` only samples the editor (no gradient); train_grpo.py turns the candidates' tokens and advantages
into the policy loss. Every token of a candidate gets that candidate's advantage A(g,i).

Parsing a reply (`parse_candidate`). The editor is asked for an Agent Skills SKILL.md (front matter with
name and description, then a Markdown body); skills.parse_skill reads it leniently, and a reply without
front matter counts as the skill's body (a small editor rarely writes YAML; the body is what the task model
needs). A reply that is empty, whose front matter is broken or whose body is too long does not parse: the
candidate gets reward 0 without costing a task-model call, still gets its advantage (so the editor learns
not to write it), and the run goes on.

The editor's prompt (`editor_messages`): the task type and a few example tasks of x, the current skill with
its reward, and the history — earlier skills with their rewards and per-task outcomes (question, right or
wrong, the start of the reply) — newest first. To fit `context_tokens` it drops whole history entries,
oldest first, then example tasks, then shortens the current skill; if even the bare prompt does not fit it
raises ValueError, so the prompt never silently exceeds the budget.

Several instances evolve in lock-step (`evolve_batch`): generation g of every instance is ONE `generate`
call (K samples per prompt, each prompt with its own seed, so an instance's candidates do not depend on
what else is in the batch) and all candidates' rollouts go to the task model concurrently, so both the
editor and the task-model server work on full batches.
"""
from __future__ import annotations

import concurrent.futures
import re
from dataclasses import dataclass, field

from minskill.grpo import bilevel_advantages
from minskill.rollout import run_rollouts, skill_text
from minskill.sampling import generate
from minskill.skills import SkillParseError, parse_skill

EDITOR_SYSTEM = (
    "You improve skills. A skill is a short text that an AI assistant reads before it answers tasks of one "
    "kind: steps to follow, facts it needs, and a worked example. Read the tasks, the current skill and how "
    "earlier skills scored, then write one better skill. Reply with the skill only, in this form:\n"
    "---\nname: a-short-name\ndescription: what the skill does and when to use it\n---\n"
    "The instructions, facts and a worked example.")

CLIP_SKILL_CHARS = 600      # how much of an earlier skill the history shows
CLIP_QUESTION_CHARS = 300   # of an example task
CLIP_OUTCOME_CHARS = 80     # of a task/reply in an outcome line
OUTCOMES_SHOWN = 3          # outcome lines per history entry


@dataclass
class Instance:
    """A task instance x: tasks of one type that one evolving skill must help with."""
    id: str
    type: str
    tasks: list  # list[minskill.tasks.Task]


@dataclass
class Outcome:
    """One rollout of a skill, as the editor is shown it."""
    question: str
    reward: float
    reply: str           # the task model's (last) reply, or the error
    steps: int = 1


@dataclass
class Candidate:
    generation: int
    index: int
    prompt_ids: list[int]          # the editor's prompt (shared by the K candidates of a generation)
    token_ids: list[int]           # the sampled reply, stop token included when one ended it
    logprobs: list[float]          # the sampler's log-probs of token_ids (at the sampling temperature)
    text: str
    skill: str | None              # the skill as the task model reads it; None when the reply did not parse
    parse_error: str | None
    finish_reason: str = "stop"
    reward: float = 0.0
    advantage: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    task_calls: int = 0


@dataclass
class HistoryEntry:
    generation: int
    skill: str | None              # None: the reply did not parse
    reward: float
    outcomes: list[Outcome]
    error: str | None = None


@dataclass
class Generation:
    g: int
    candidates: list[Candidate]
    mean_reward: float
    inter_advantage: float         # A_inter(g)
    best_index: int                # the candidate with the highest reward (first among ties)
    current_skill: str             # the skill carried forward after this generation, and its reward
    current_reward: float

    @property
    def zero_variance(self) -> bool:
        """All K rewards equal: A_intra = 0 for every candidate, only λ·A_inter moves this group."""
        return len({c.reward for c in self.candidates}) == 1


@dataclass
class Evolution:
    """What the loop produced on one instance."""
    instance: Instance
    seed_skill: str
    seed_reward: float
    seed_outcomes: list[Outcome]
    generations: list[Generation] = field(default_factory=list)
    task_calls: int = 0            # task-model requests spent on this instance (seed skill included)

    @property
    def final_skill(self) -> str:
        """The skill carried forward so far (the seed skill until a candidate beats it)."""
        return self.generations[-1].current_skill if self.generations else self.seed_skill

    @property
    def final_reward(self) -> float:
        return self.generations[-1].current_reward if self.generations else self.seed_reward

    def candidates(self) -> list[Candidate]:
        return [c for gen in self.generations for c in gen.candidates]


# ----------------------------------------------------------------------------------------------------------
# Replies -> skills


def parse_candidate(reply: str, task_type: str) -> tuple[str | None, str | None]:
    """(the skill text the task model reads, None), or (None, why the reply is not a skill).

    skills.parse_skill reads the reply leniently (fences, missing front matter and chatter are tolerated).
    A skill with front matter is rendered as any skill set is (rollout.skill_text: title, description,
    body); for a reply without front matter, the description and title parse_skill derives from the text
    would repeat it, so the task model reads the body alone."""
    try:
        skill = parse_skill(reply)
    except SkillParseError as error:
        return None, str(error)
    text = skill_text(skill, task_type) if _has_front_matter(reply) else skill.body.strip()
    return (text, None) if text.strip() else (None, "the skill has no text")


def _has_front_matter(reply: str) -> bool:
    return re.search(r"^---[ \t]*\r?\n\s*(?:name|description)\s*:", reply, re.M) is not None


# ----------------------------------------------------------------------------------------------------------
# The editor's prompt


def _clip(text: str, limit: int) -> str:
    """One line of at most `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _outcome_line(o: Outcome) -> str:
    verdict = "correct" if o.reward >= 1.0 else ("partly correct" if o.reward > 0 else "wrong")
    steps = f" after {o.steps} steps" if o.steps > 1 else ""
    return f"  task: {_clip(o.question, CLIP_OUTCOME_CHARS)} -> {verdict}{steps}; " \
           f"reply: {_clip(o.reply, CLIP_OUTCOME_CHARS) or '(empty)'}"


def _history_block(entry: HistoryEntry) -> str:
    if entry.skill is None:
        head = f"[generation {entry.generation}, reward 0.00] (the reply was not a skill: " \
               f"{_clip(entry.error or 'unparseable', 120)})"
        return head
    skill = _clip(entry.skill, CLIP_SKILL_CHARS) if entry.skill.strip() else "(no skill)"
    lines = [f"[generation {entry.generation}, reward {entry.reward:.2f}]", skill]
    lines += [_outcome_line(o) for o in entry.outcomes[:OUTCOMES_SHOWN]]
    return "\n".join(lines)


def editor_messages(instance: Instance, current_skill: str, current_reward: float, history: list[HistoryEntry],
                    count_tokens, context_tokens: int = 1024, max_examples: int = 3) -> list[dict]:
    """The editor's chat messages. `history` is oldest first; it is shown newest first.

    count_tokens(messages) -> the prompt's length in editor tokens. The result's length is at most
    context_tokens: history entries are dropped oldest first, then example tasks, then the current skill is
    shortened; ValueError if the instructions and one example task alone exceed the budget.
    """
    blocks = [_history_block(e) for e in history]

    def render(n_history: int, n_examples: int, skill_chars: int | None) -> list[dict]:
        examples = "\n".join(f"- {_clip(t.question, CLIP_QUESTION_CHARS)}" for t in instance.tasks[:n_examples])
        skill = current_skill.strip()
        if skill_chars is not None and len(skill) > skill_chars:
            skill = skill[:skill_chars].rstrip() + " [... cut to fit the prompt]"
        parts = [f"Task type: {instance.type}", f"Example tasks:\n{examples}",
                 f"Current skill (reward {current_reward:.2f}):\n{skill or '(no skill yet)'}"]
        if n_history:
            parts.append("Earlier skills, newest first:\n" + "\n".join(reversed(blocks[len(blocks) - n_history:])))
        parts.append("Write a better skill for these tasks.")
        return [{"role": "system", "content": EDITOR_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]

    n_examples = max(1, min(max_examples, len(instance.tasks)))
    for n_history in range(len(blocks), -1, -1):
        messages = render(n_history, n_examples, None)
        if count_tokens(messages) <= context_tokens:
            return messages
    for n in range(n_examples - 1, 0, -1):
        messages = render(0, n, None)
        if count_tokens(messages) <= context_tokens:
            return messages
    chars = len(current_skill)
    while chars > 0:
        chars //= 2
        messages = render(0, 1, chars)
        if count_tokens(messages) <= context_tokens:
            return messages
    raise ValueError(f"editor_messages: context_tokens={context_tokens} is too small for the editor's "
                     f"instructions and one example task ({count_tokens(render(0, 1, 0))} tokens)")


# ----------------------------------------------------------------------------------------------------------
# Scoring skills with the frozen task model


def score_skill(client, instance: Instance, skill: str, *, n: int = 1, temperature: float = 0.0,
                max_tokens: int = 96, seed: int = 0) -> tuple[float, list[Outcome], int]:
    """r = mean verifier score of n rollouts of every task of the instance under `skill`.

    Returns (r, outcomes in task order, task-model requests made). Rollout failures are failed tasks."""
    trajectories = run_rollouts(client, instance.tasks, skill or None, n=n, temperature=temperature,
                                max_tokens=max_tokens, seed=seed)
    by_id = {t.id: t for t in instance.tasks}
    order = {t.id: k for k, t in enumerate(instance.tasks)}
    trajectories = sorted(trajectories, key=lambda tr: (order.get(tr.task_id, len(order)), tr.sample))
    outcomes, calls = [], 0
    for tr in trajectories:
        task = by_id.get(tr.task_id)
        multi = bool(task is not None and task.multi_turn)
        # a single-turn task is one request for all n rollouts; a multi-turn episode is one request a step
        calls += tr.steps if multi else int(tr.sample == 0)
        reply = tr.reply or (f"error: {tr.error}" if tr.error else "")
        outcomes.append(Outcome(task.question if task is not None else tr.task_id, float(tr.reward), reply,
                                max(tr.steps, 1)))
    reward = sum(o.reward for o in outcomes) / max(len(outcomes), 1)
    return reward, outcomes, calls


def _score_all(client, jobs: list[tuple[Instance, str | None, dict]]) -> list[tuple[float, list[Outcome], int]]:
    """score_skill(client, instance, skill, **kwargs) for many jobs at once; a None skill (a reply that did
    not parse) scores 0 with no task-model call."""
    def run(job):
        instance, skill, kwargs = job
        return (0.0, [], 0) if skill is None else score_skill(client, instance, skill, **kwargs)

    # concurrent, so that the task-model server batches the requests of all candidates together
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(jobs), 16))) as pool:
        return list(pool.map(run, jobs))


# ----------------------------------------------------------------------------------------------------------
# The loop


def evolve_batch(editor, tokenizer, client, instances: list[Instance], *, seeds: list[int],
                 seed_skills: list[str] | None = None, generations: int = 2, candidates: int = 4,
                 rollouts: int = 1, lam: float = 0.5, scale_by_std: bool = False, temperature: float = 1.0,
                 top_p: float = 1.0, max_skill_tokens: int = 160, context_tokens: int = 1024,
                 task_max_tokens: int = 96, task_temperature: float = 0.0) -> list[Evolution]:
    """Run G generations of K candidates on each instance, in lock-step; the editor is only sampled.

    seeds[j] seeds instance j's editor samples (generation g uses seeds[j] * 1000 + g) and its task-model
    rollouts, so a run is reproducible whatever else shares its batches."""
    if len(seeds) != len(instances):
        raise ValueError(f"evolve_batch: {len(seeds)} seeds for {len(instances)} instances")
    if generations < 1 or candidates < 1 or rollouts < 1:
        raise ValueError(f"evolve_batch: generations, candidates and rollouts must be >= 1, got "
                         f"{generations}, {candidates}, {rollouts}")
    seed_skills = list(seed_skills) if seed_skills is not None else [""] * len(instances)
    limit = getattr(getattr(editor, "config", None), "max_position_embeddings", None)
    if limit is not None and context_tokens + max_skill_tokens > limit:
        raise ValueError(f"evolve_batch: context_tokens + max_skill_tokens = {context_tokens + max_skill_tokens}"
                         f" exceeds the editor's context of {limit} tokens")

    def count_tokens(messages):
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def rollout_kwargs(j):
        return dict(n=rollouts, temperature=task_temperature, max_tokens=task_max_tokens, seed=seeds[j])

    # generation 0: the seed skills
    scored = _score_all(client, [(inst, skill, rollout_kwargs(j))
                                 for j, (inst, skill) in enumerate(zip(instances, seed_skills))])
    evolutions = [Evolution(inst, skill, reward, outcomes, task_calls=calls)
                  for inst, skill, (reward, outcomes, calls) in zip(instances, seed_skills, scored)]
    histories = [[HistoryEntry(0, ev.seed_skill, ev.seed_reward, ev.seed_outcomes)] for ev in evolutions]

    for g in range(1, generations + 1):
        prompts = []
        for ev, history in zip(evolutions, histories):
            messages = editor_messages(ev.instance, ev.final_skill, ev.final_reward, history, count_tokens,
                                       context_tokens)
            prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        samples = generate(editor, prompts, n=candidates, max_new_tokens=max_skill_tokens, temperature=temperature,
                           top_p=top_p, stop_token_ids=tokenizer.stop_token_ids,
                           seed=[s * 1000 + g for s in seeds], tokenizer=tokenizer, pad_id=tokenizer.pad_token_id)
        cands: list[list[Candidate]] = []
        for j, ev in enumerate(evolutions):
            group = []
            for i, s in enumerate(samples[j * candidates:(j + 1) * candidates]):
                skill, error = parse_candidate(s.text, ev.instance.type)
                group.append(Candidate(g, i, prompts[j], list(s.token_ids), list(s.logprobs), s.text, skill,
                                       error, s.finish_reason))
            cands.append(group)

        results = iter(_score_all(client, [(ev.instance, c.skill, rollout_kwargs(j))
                                           for j, (ev, group) in enumerate(zip(evolutions, cands)) for c in group]))
        for j, (ev, group) in enumerate(zip(evolutions, cands)):
            for c in group:
                c.reward, c.outcomes, c.task_calls = next(results)
                ev.task_calls += c.task_calls
            rewards = [c.reward for c in group]
            prev_mean = ev.generations[-1].mean_reward if ev.generations else ev.seed_reward
            for c, a in zip(group, bilevel_advantages(rewards, prev_mean, lam, scale_by_std=scale_by_std).tolist()):
                c.advantage = a
            mean = sum(rewards) / len(rewards)
            best = max(range(len(group)), key=lambda i: (group[i].reward, -i))
            current, current_r = ev.final_skill, ev.final_reward      # carried so far
            if group[best].skill is not None and group[best].reward > current_r:
                current, current_r = group[best].skill, group[best].reward
            ev.generations.append(Generation(g, group, mean, mean - prev_mean, best, current, current_r))
            histories[j].extend(HistoryEntry(g, c.skill, c.reward, c.outcomes, c.parse_error) for c in group)
    return evolutions


def evolve(editor, tokenizer, client, instance: Instance, *, seed: int = 0, seed_skill: str = "",
           **kwargs) -> Evolution:
    """The loop on one instance (see evolve_batch for the keyword arguments)."""
    return evolve_batch(editor, tokenizer, client, [instance], seeds=[seed], seed_skills=[seed_skill], **kwargs)[0]


def make_instances(tasks: list, tasks_per_instance: int, prefix: str = "x") -> list[Instance]:
    """Group tasks by type (types sorted, tasks in order) and cut each group into instances of
    `tasks_per_instance` tasks (a remainder smaller than that is left out)."""
    if tasks_per_instance < 1:
        raise ValueError(f"make_instances: tasks_per_instance must be >= 1, got {tasks_per_instance}")
    by_type: dict[str, list] = {}
    for t in tasks:
        by_type.setdefault(t.type, []).append(t)
    instances = []
    for ttype in sorted(by_type):
        group = by_type[ttype]
        for start in range(0, len(group) - tasks_per_instance + 1, tasks_per_instance):
            instances.append(Instance(f"{prefix}-{ttype}-{start // tasks_per_instance}", ttype,
                                      group[start:start + tasks_per_instance]))
    return instances
