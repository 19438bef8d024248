"""Skill-R1's multi-generation skill evolution (one or several task instances); the editor's prompt.

A *task instance* x is a handful of tasks of one type (`Instance.tasks`); a skill s is the text the
frozen task model π_task reads as its system prompt. With the skill editor π_θ (a minskill model)
the loop is

    H_0 = {(s_0, rollouts of s_0, r_0)}                  s_0: the seed skill ("" = no skill)
    for g = 1..G:
        s_g^(i) ~ π_θ( · | x, H_{g−1}),  i = 1..K         K candidates, sampled from ONE prompt
        r_g^(i) = mean verifier score of n rollouts y ~ π_task( · | x, s_g^(i)) on every task of x
        H_g = H_{g−1} ∪ {(s_g^(i), rollouts, r_g^(i))}
        current skill ← best s_g^(i) if its reward beats the current skill's (else it stays); with
                        --carry-gate paired, only if it also wins a sign test on the tasks

and then, for every candidate (`assign_advantages`, with grpo.bilevel_advantages):

        A_intra(g,i) = r_g^(i) − mean_i r_g^(i)                (optionally / (std_i + 1e-4))
        A_inter(g)   = mean_i r_g^(i) − mean_i r_{g−1}^(i)      (generation 0's "mean" is r_0)
        A(g,i)       = A_intra(g,i) + λ·A_inter(g)      (--inter-scale pooled-std: / S, grpo.py)

The advantages do not steer the loop (the carried skill follows the rewards), so they are computed
after it, as a step of their own. `evolve_batch` only samples the editor (no gradient);
train_grpo.py turns the candidates' tokens and advantages into the policy loss. Every token of a
candidate gets that candidate's advantage A(g,i). The loop's knobs are one `EvolveConfig`, shared by
training and evaluation.

Parsing a reply (`parse_candidate`). The editor is asked for an Agent Skills SKILL.md (front matter
with name and description, then a Markdown body); replies.parse_skill reads it leniently, and a
reply without front matter counts as the skill's body (a small editor rarely writes YAML; the body
is what the task model needs). A reply that is empty, whose front matter is broken or whose body is
too long does not parse: the candidate gets reward 0 without costing a task-model call, still gets
its advantage (so the editor learns not to write it), and the run goes on.

The editor's prompt (`editor_messages`): the task type and a few example tasks of x, the current
skill with its reward, and the history: earlier skills with their rewards and per-task outcomes
(question, right or wrong, the start of the reply), newest first. To fit `context_tokens` it drops
whole history entries, oldest first, then example tasks, then shortens the current skill; if even
the bare prompt does not fit it raises ValueError, so the prompt never silently exceeds the budget.

Several instances evolve in lock-step (`evolve_batch`): generation g of every instance is ONE
`generate` call (K samples per prompt, each prompt with its own seed, so an instance's candidates do
not depend on what else is in the batch) and all candidates' rollouts go to the task model
concurrently, so both the editor and the task-model server work on full batches.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import re
from dataclasses import dataclass, field, fields

import torch

from minskill import gates
from minskill.nn.sampling import generate
from minskill.replies import parse_skill
from minskill.rollout import (Trajectory, all_failed, cut_totals, reasoning_cut_note,
                              run_rollouts, skill_text, summarize)
from minskill.skill_r1.grpo import bilevel_advantages, inter_divisor
from minskill.skills import SkillParseError
from minskill.tasks import load_suite

EDITOR_SYSTEM = (
    "You improve skills. A skill is a short text that an AI assistant reads before it answers "
    "tasks of one kind: steps to follow, facts it needs, and a worked example. Read the tasks, the "
    "current skill and how earlier skills scored, then write one better skill. Reply with the "
    "skill only, in this form:\n---\nname: a-short-name\ndescription: what the skill does and when "
    "to use it\n---\nThe instructions, facts and a worked example.")

CLIP_SKILL_CHARS = 600      # how much of an earlier skill the history shows
CLIP_QUESTION_CHARS = 300   # of an example task
CLIP_OUTCOME_CHARS = 80     # of a task/reply in an outcome line
OUTCOMES_SHOWN = 3          # outcome lines per history entry


@dataclass
class EvolveConfig:
    """The loop's knobs (docs/skill-r1.md); the fields are train_grpo.py's flags of the same names
    and defaults."""
    generations: int = 2              # G
    candidates: int = 4               # K skills sampled per generation from one shared prompt
    rollouts: int = 1                 # n task-model rollouts per skill and task
    editor_temperature: float = 1.0
    editor_top_p: float = 1.0
    max_skill_tokens: int = 64        # the longest skill the editor may write
    context_tokens: int = 512         # the editor's prompt budget; the history is trimmed to fit
    task_max_tokens: int = 32         # the longest task-model reply
    task_temperature: float = 0.0     # 0: the frozen task model answers greedily
    carry_gate: str = "strict"        # which best candidate replaces the current skill
                                      # (minskill/gates.py)
    carry_gate_alpha: float = 0.1     # α of the paired carry gate

    @classmethod
    def from_args(cls, args) -> "EvolveConfig":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


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
    error: str | None = None   # why it ended unscored (Trajectory.error), counted apart
    reasoning: str = ""  # the task model's thinking before (or instead of) its reply


@dataclass
class Candidate:
    """s_g^(i): one sampled reply of the editor, what it scored and (after assign_advantages) its
    A(g,i)."""
    generation: int
    prompt_ids: list[int]          # the editor's prompt (shared by the K candidates of a
                                   # generation)
    token_ids: list[int]           # the sampled reply, stop token included when one ended it
    logprobs: list[float]          # the sampler's log-probs of token_ids (at the sampling
                                   # temperature)
    text: str
    skill: str | None              # the skill as the task model reads it; None when the reply did
                                   # not parse
    parse_error: str | None
    reward: float = 0.0
    advantage: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)


@dataclass
class HistoryEntry:
    """One skill of H_g as the editor's prompt shows it."""
    generation: int
    skill: str | None              # None: the reply did not parse
    reward: float
    outcomes: list[Outcome]
    error: str | None = None


@dataclass
class Generation:
    """Generation g of one instance: its K candidates, their mean reward, and the skill carried
    after it."""
    g: int
    candidates: list[Candidate]
    mean_reward: float             # mean_i r_g^(i)
    inter_advantage: float         # A_inter(g) = mean_reward − the previous generation's (or the
                                   # seed's)
    best_index: int                # the candidate with the highest reward (first among ties)
    current_skill: str             # the skill carried forward after this generation, and its reward
    current_reward: float
    gate: dict | None = None       # --carry-gate paired: its decision record (minskill/gates.py);


@dataclass
class Evolution:
    """What the loop produced on one instance."""
    instance: Instance
    seed_skill: str
    seed_reward: float
    seed_outcomes: list[Outcome]
    generations: list[Generation] = field(default_factory=list)

    @property
    def final_skill(self) -> str:  # the skill carried so far: the seed skill until a candidate
                                   # beats it
        return self.generations[-1].current_skill if self.generations else self.seed_skill

    @property
    def final_reward(self) -> float:
        return self.generations[-1].current_reward if self.generations else self.seed_reward

    def candidates(self) -> list[Candidate]:
        return [c for gen in self.generations for c in gen.candidates]

    # H_g, oldest first: the seed skill, then every candidate so far
    def history(self) -> list[HistoryEntry]:
        return [HistoryEntry(0, self.seed_skill, self.seed_reward, self.seed_outcomes)] + [
            HistoryEntry(c.generation, c.skill, c.reward, c.outcomes, c.parse_error)
            for c in self.candidates()]


# --------------------------------------------------------------------------------------------------
# The loop (train_grpo.py's train_step: step_seed, autocast, evolve_batch, assign_advantages)


def step_seed(seed: int, step: int, j: int) -> int:
    """The sampling seed of the j-th instance of a training step (editor samples and rollouts)."""
    return seed * 1_000_003 + step * 1009 + j


def autocast(bf16: bool, device):
    """bf16 autocast on `device` (the resolved --device) when asked: matmuls in bfloat16, weights
    and AdamW state in float32 (pure bf16 weights would round away updates of lr·1 relative size
    below 2^-8): docs/gpu.md."""
    return torch.autocast(torch.device(device).type,
                          dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def evolve_batch(editor, tokenizer, client, instances: list[Instance], cfg: EvolveConfig, *,
                 seeds: list[int],
                 seed_skills: list[str] | None = None) -> list[Evolution]:
    """G generations of K candidates on each instance, in lock-step; seeds[j] seeds instance j's
    editor samples (generation g: seeds[j] * 1000 + g) and its task-model rollouts."""
    if len(seeds) != len(instances):
        raise ValueError(f"evolve_batch: {len(seeds)} seeds for {len(instances)} instances")
    seed_skills = list(seed_skills) if seed_skills is not None else [""] * len(instances)
    # H_0: the seed skills
    scored = score_skills(client, list(zip(instances, seed_skills, seeds)), cfg)
    evolutions = [Evolution(x, skill, reward, outcomes)
                  for x, skill, (reward, outcomes) in zip(instances, seed_skills, scored)]
    K = cfg.candidates

    def count_tokens(messages):
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    for g in range(1, cfg.generations + 1):
        # one shared prompt per instance: its tasks, the current skill and H_{g-1}
        prompts = [tokenizer.apply_chat_template(editor_messages(ev.instance, ev.final_skill,
                                                                 ev.final_reward,
                                                                 ev.history(), count_tokens,
                                                                 cfg.context_tokens),
                                                 add_generation_prompt=True) for ev in evolutions]
        samples = generate(editor, prompts, n=K, max_new_tokens=cfg.max_skill_tokens,
                           temperature=cfg.editor_temperature, top_p=cfg.editor_top_p,
                           stop_token_ids=tokenizer.stop_token_ids,
                           seed=[s * 1000 + g for s in seeds],
                           tokenizer=tokenizer, pad_id=tokenizer.pad_token_id)
        groups = [[Candidate(g, prompts[j], list(s.token_ids), list(s.logprobs), s.text,
                             *parse_candidate(s.text, ev.instance.type))
                   for s in samples[j * K:(j + 1) * K]] for j, ev in enumerate(evolutions)]
        jobs = [(ev.instance, c.skill, seed) for ev, group, seed in zip(evolutions, groups, seeds)
                for c in group]
        scores = iter(score_skills(client, jobs, cfg))
        for ev, group in zip(evolutions, groups):
            for c in group:
                c.reward, c.outcomes = next(scores)
            ev.generations.append(_carry(ev, g, group, cfg))
    return evolutions


def score_skills(client, jobs: list[tuple[Instance, str | None, int]],
                 cfg: EvolveConfig) -> list[tuple[float, list[Outcome]]]:
    """(r, outcomes) per job (instance, skill, seed): the mean score of n rollouts per task; a None
    skill scores 0."""
    def score(job):
        instance, skill, seed = job
        if skill is None:
            return 0.0, []
        trajectories = run_rollouts(client, instance.tasks, skill or None, n=cfg.rollouts,
                                    seed=seed, temperature=cfg.task_temperature,
                                    max_tokens=cfg.task_max_tokens)
        task = {t.id: t for t in instance.tasks}
        # run_rollouts keeps task order, a task's samples together
        outcomes = [Outcome(task[tr.task_id].question, float(tr.reward),
                            tr.reply or (f"error: {tr.error}" if tr.error else ""),
                            max(tr.steps, 1), tr.error, tr.reasoning) for tr in trajectories]
        return sum(o.reward for o in outcomes) / max(len(outcomes), 1), outcomes

    # concurrent (up to the client's cap on requests in flight), so that the server batches all
    # candidates' requests
    workers = max(1, min(len(jobs), getattr(client, "max_workers", 16)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(score, jobs))


# --------------------------------------------------------------------------------------------------
# The editor's prompt


def editor_messages(instance: Instance, current_skill: str, current_reward: float,
                    history: list[HistoryEntry], count_tokens, context_tokens: int = 1024,
                    max_examples: int = 3) -> list[dict]:
    """The editor's chat messages, at most context_tokens long by count_tokens(messages); `history`:
    oldest first."""
    blocks = [_history_block(e) for e in history]

    def render(n_history: int, n_examples: int, skill_chars: int | None) -> list[dict]:
        examples = "\n".join(f"- {_one_line(t.question, CLIP_QUESTION_CHARS)}"
                             for t in instance.tasks[:n_examples])
        skill = current_skill.strip()
        if skill_chars is not None and len(skill) > skill_chars:
            skill = skill[:skill_chars].rstrip() + " [... cut to fit the prompt]"
        parts = [f"Task type: {instance.type}", f"Example tasks:\n{examples}",
                 f"Current skill (reward {current_reward:.2f}):\n{skill or '(no skill yet)'}"]
        if n_history:
            parts.append("Earlier skills, newest first:\n"
                         + "\n".join(reversed(blocks[len(blocks) - n_history:])))
        parts.append("Write a better skill for these tasks.")
        return [{"role": "system", "content": EDITOR_SYSTEM},
                {"role": "user", "content": "\n\n".join(parts)}]

    n_examples = max(1, min(max_examples, len(instance.tasks)))
    # drop history, oldest first,
    tries = [(n, n_examples, None) for n in range(len(blocks), -1, -1)]
    tries += [(0, n, None) for n in range(n_examples - 1, 0, -1)]          # then example tasks,
    chars = len(current_skill)
    # then halve the current skill
    while chars > 0:
        chars //= 2
        tries.append((0, 1, chars))
    for n_history, n, skill_chars in tries:
        messages = render(n_history, n, skill_chars)
        if count_tokens(messages) <= context_tokens:
            return messages
    raise ValueError(f"editor_messages: context_tokens={context_tokens} is too small for the "
                     f"editor's instructions and one example task "
                     f"({count_tokens(render(0, 1, 0))} tokens)")


def _history_block(entry: HistoryEntry) -> str:
    if entry.skill is None:
        return f"[generation {entry.generation}, reward 0.00] (the reply was not a skill: " \
               f"{_one_line(entry.error or 'unparseable', 120)})"
    skill = _one_line(entry.skill, CLIP_SKILL_CHARS) if entry.skill.strip() else "(no skill)"
    lines = [f"[generation {entry.generation}, reward {entry.reward:.2f}]", skill]
    return "\n".join(lines + [outcome_line(o) for o in entry.outcomes[:OUTCOMES_SHOWN]])


def outcome_line(o: Outcome) -> str:
    """One past task as the editor's prompt shows it (skill_r1.cold_start finds its worked examples
    by it)."""
    verdict = "correct" if o.reward >= 1.0 else ("partly correct" if o.reward > 0 else "wrong")
    steps = f" after {o.steps} steps" if o.steps > 1 else ""
    return f"  task: {_one_line(o.question, CLIP_OUTCOME_CHARS)} -> {verdict}{steps}; " \
           f"reply: {_one_line(o.reply, CLIP_OUTCOME_CHARS) or '(empty)'}"


def _one_line(text: str, limit: int) -> str:   # one line of at most `limit` characters
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


# --------------------------------------------------------------------------------------------------
# Replies -> skills, the carried skill, the advantages


def parse_candidate(reply: str, task_type: str) -> tuple[str | None, str | None]:
    """(the skill text the task model reads, None), or (None, why the reply is not a skill) (module
    docstring)."""
    try:
        skill = parse_skill(reply)
    except SkillParseError as error:
        return None, str(error)
    # without front matter the task model reads the body alone: the title and description
    # parse_skill derives from the text would repeat it
    front_matter = re.search(r"^---[ \t]*\r?\n\s*(?:name|description)\s*:", reply, re.M) is not None
    text = skill_text(skill, task_type) if front_matter else skill.body.strip()
    return (text, None) if text.strip() else (None, "the skill has no text")


def _carry(ev: Evolution, g: int, group: list[Candidate], cfg: EvolveConfig) -> Generation:
    """Generation g of `ev`: mean reward, A_inter, and the carried skill: the best candidate when it
    parsed and its reward beats the current skill's (strict, the paper's rule); with --carry-gate
    paired, when gates.carry accepts."""
    mean = sum(c.reward for c in group) / len(group)
    prev_mean = ev.generations[-1].mean_reward if ev.generations else ev.seed_reward
    best = max(range(len(group)), key=lambda i: (group[i].reward, -i))
    if cfg.carry_gate == "paired":   # also a sign test on the instance's tasks, kept as the
                                     # decision record
        return Generation(g, group, mean, mean - prev_mean, best,
                          *gates.carry(ev, group, best, cfg))
    current, current_r = ev.final_skill, ev.final_reward
    if group[best].skill is not None and group[best].reward > current_r:
        current, current_r = group[best].skill, group[best].reward
    return Generation(g, group, mean, mean - prev_mean, best, current, current_r)


def assign_advantages(evolutions: list[Evolution], lam: float, scale_by_std: bool = False,
                      inter_scale: str = "raw") -> list[Candidate]:
    """Set A(g,i) on every candidate (grpo.bilevel_advantages, inter_divisor); return them all."""
    for ev in evolutions:
        prev_means = [ev.seed_reward] + [gen.mean_reward for gen in ev.generations]
        divisor = inter_divisor(ev.seed_reward, [[c.reward for c in gen.candidates]
                                                  for gen in ev.generations], inter_scale)
        for gen, prev_mean in zip(ev.generations, prev_means):
            advantages = bilevel_advantages([c.reward for c in gen.candidates], prev_mean, lam,
                                            scale_by_std, inter_divisor=divisor)
            for c, a in zip(gen.candidates, advantages.tolist()):
                c.advantage = a
    return [c for ev in evolutions for c in ev.candidates()]


# --------------------------------------------------------------------------------------------------
# Run helpers that train_grpo.py (training) and evaluate.py (--eval) share


def make_instances(tasks: list, tasks_per_instance: int, prefix: str = "x") -> list[Instance]:
    """Group tasks by type (types sorted, tasks in order) and cut each group into instances of
    `tasks_per_instance` tasks (a remainder smaller than that is left out)."""
    if tasks_per_instance < 1:
        raise ValueError(
            f"make_instances: tasks_per_instance must be >= 1, got {tasks_per_instance}")
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


def check_config(editor, cfg: EvolveConfig) -> None:
    """At set-up, once: the loop's knobs make sense and the editor's prompt and skill fit its
    context (ValueError)."""
    if cfg.generations < 1 or cfg.candidates < 1 or cfg.rollouts < 1:
        raise ValueError(f"EvolveConfig: generations, candidates and rollouts must be >= 1, got "
                         f"{cfg.generations}, {cfg.candidates}, {cfg.rollouts}")
    limit = getattr(getattr(editor, "config", None), "max_position_embeddings", None)
    if limit is not None and cfg.context_tokens + cfg.max_skill_tokens > limit:
        raise ValueError(f"EvolveConfig: context_tokens + max_skill_tokens = "
                         f"{cfg.context_tokens + cfg.max_skill_tokens} exceeds the editor's "
                         f"context of {limit} tokens")


class TaskModelFailed(RuntimeError):
    """Every rollout of a training step, a held-out probe or an --eval row ended with an error (the
    task model did not answer): nothing is recorded as 0s; train_grpo.py stops with the message and
    exit status 1."""


def rollout_errors(evolutions: list[Evolution], what: str) -> int:
    """How many rollouts behind `evolutions` (seed skills and candidates) ended with an error, each
    scored 0 and counted apart; TaskModelFailed naming `what` and the first error when all did."""
    outcomes = all_outcomes(evolutions)
    if failed := all_failed(outcomes):
        raise TaskModelFailed(f"{what}: {failed}")
    return sum(o.error is not None for o in outcomes)


def all_outcomes(evolutions: list[Evolution]) -> list[Outcome]:
    """Every rollout behind `evolutions`: the seed skills' and the candidates'."""
    return [o for ev in evolutions
            for o in ev.seed_outcomes + [o for c in ev.candidates() for o in c.outcomes]]


class SuiteError(ValueError):
    """--suite names no readable suite (a missing file, a malformed line): the script reports it as
    a usage error."""


def load_split(args, split: str, seed: int | None = None) -> list:
    """--suite's tasks of `split`, drawn with `seed` (default --seed); a bad suite file raises
    SuiteError naming it, before any model call."""
    try:
        return load_suite(args.suite, split=split, seed=args.seed if seed is None else seed,
                          n=args.n_tasks)
    except (ValueError, FileNotFoundError) as e:
        raise SuiteError(f"--suite {args.suite}: {e}") from e


def all_zero_note(tasks, training: bool = True) -> str:
    """What to say when every reward of a run was 0 (it happens on multi-turn suites with a weak
    model)."""
    multi = any(t.multi_turn for t in tasks)
    consequence = ("so every advantage is 0 and the editor got no gradient: nothing was learned"
                   if training
                   else "so these rows cannot tell the methods apart")
    return (f"every reward was 0: the task model never succeeded on "
            f"{'this multi-turn suite' if multi else 'these tasks'}, {consequence}. " +
            ("The offline 135M task model mostly echoes the observation in multi-turn play; "
             if multi else "") +
            "use a stronger task model (--task-url) or an easier suite.")


def reasoning_cuts(evolutions: list[Evolution]) -> dict:
    """{"rollouts": n, "reasoning_cut": how many of them ended inside the task model's reasoning}
    over the seed skills' and the candidates' rollouts, by rollout.summarize's rule."""
    outcomes = all_outcomes(evolutions)
    replies = [Trajectory(task_id="", task_type="", messages=[], reply=o.reply,
                          reasoning=o.reasoning, error=o.error) for o in outcomes]
    return {"rollouts": len(outcomes), "reasoning_cut": summarize(replies)["reasoning_cut"]}


def zero_reward_note(tasks, records: list[dict], training: bool = True) -> str:
    """What to say when every reward was 0: when replies of `records` ended inside their reasoning,
    that (the reply budget scored them 0, not the task model's skill) with the fixes; otherwise
    all_zero_note."""
    cut = reasoning_cut_note(cut_totals(records, of="rollouts"))
    return f"every reward was 0, and {cut.removeprefix('note: ')}" if cut \
        else all_zero_note(tasks, training)
