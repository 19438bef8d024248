"""The common task interface: `Task` (single-turn question + verifier, or multi-turn environment)
and `Environment` (text observations, a step budget, a success flag, the "Nothing happens."
counter); what an agent loop (minskill/rollout.py) needs beside them: `parse_action`, a free-form
reply read leniently as one action of the environment, and `is_context_refusal`, a server's refusal
of a prompt too long for its context.

Splits. A generated task is identified by a *problem key* (what makes it the problem it is, e.g.
("arithmetic", 3, "+", 4)). Its split is a pure function of the key:

    split(key) = "heldout" if int(sha256(key)[:8], 16) % 100 < HELDOUT_PERCENT else "train"

so train and held-out sets are disjoint by construction whatever seed generated them, and the same
problem always lands in the same split. The seed only chooses which problems (and which wording) are
drawn.
"""
from __future__ import annotations

import difflib
import hashlib
import random
import re
from dataclasses import asdict, dataclass, field
from typing import Iterable

from .verifiers import verify

NOTHING_HAPPENS = "Nothing happens."
SPLITS = ("train", "heldout")
HELDOUT_PERCENT = 50


class TaskWarning(UserWarning):
    """Something of a suite that a run goes on without: a task's missing file, skills for no task
    type of it."""


def stable_hash(text: str) -> int:
    """A hash that is the same in every process (Python's hash() of str is salted per process)."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


def split_of(key: str) -> str:
    """The split a problem key belongs to (see the module docstring)."""
    return "heldout" if stable_hash("split:" + key) % 100 < HELDOUT_PERCENT else "train"


def task_id(prefix: str, key: str) -> str:
    """A short id that depends only on the problem, so the same task has the same id in every
    run."""
    return f"{prefix}-{stable_hash('id:' + key):012x}"


_TASK_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_task_type(task_type, where: str) -> str:
    """A task type becomes the folder name of its task-specific skills, so it follows skills.py's
    rule (kept here too, so that tasks/ can be copied alone): 1-64 of A-Z a-z 0-9 _ . -, starting
    with a letter or digit, no '..'. Raises ValueError naming `where`."""
    if not isinstance(task_type, str) or not _TASK_TYPE.fullmatch(task_type) or ".." in task_type:
        raise ValueError(f"{where}: task type {task_type!r} cannot name a skill folder (use 1-64 "
                         "characters of A-Z, a-z, 0-9, '_', '.', '-', starting with a letter or "
                         "digit, no '..')")
    return task_type


def check_split(split: str, allow_all: bool = True) -> str:
    """`split` if it names one ("all" = train then held-out, where allowed), else ValueError. A
    generator makes one split; load_suite puts "all" together from the two."""
    if split not in SPLITS and (split != "all" or not allow_all):
        raise ValueError(f"unknown split {split!r}; use 'train', 'heldout'"
                         + (" or 'all'" if allow_all else ""))
    return split


def counts_per_type(types, known, n: int | None, default_per_type: int, what: str) -> dict[str,
                                                                                           int]:
    """How many tasks of each type make `n` in total (default: `default_per_type` each), as even as
    can be, earlier types taking the remainder. `what` names the types in the error for one not in
    `known`."""
    unknown = [t for t in types if t not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    total = default_per_type * len(types) if n is None else n
    return {t: total // len(types) + (1 if i < total % len(types) else 0)
            for i, t in enumerate(types)}


def interleave(by_type: dict[str, list], types) -> list:
    """Round-robin over the types (in `types` order), so that any prefix of the list is balanced."""
    out = []
    for i in range(max((len(v) for v in by_type.values()), default=0)):
        out.extend(by_type[t][i] for t in types if i < len(by_type[t]))
    return out


def rng_for(suite: str, split: str, seed: int, stream: str = "") -> random.Random:
    """A private random generator for one suite/split/seed (never the global `random` state)."""
    return random.Random(stable_hash(f"{suite}|{split}|{seed}|{stream}"))


def draw_tasks(suite: str, split: str, seed: int, types, known, n: int | None,
               default_per_type: int,
               draw) -> list:
    """`n` distinct tasks of `split` (default `default_per_type` per type), types interleaved, for a
    generator whose `draw(rng, task_type)` returns (key, build) or None (nothing usable this time):
    a key names the task's content, is kept once, and decides its split (split_of); build() makes
    the Task. Each type has its own rng (rng_for), so adding a type leaves the others' tasks as they
    were; a type that cannot be filled is an error."""
    check_split(split, allow_all=False)
    per_type = counts_per_type(types, known, n, default_per_type, f"{suite} task types")
    by_type = {}
    for task_type in types:
        rng, tasks, seen, attempts = rng_for(suite, split, seed, task_type), [], set(), 0
        while len(tasks) < per_type[task_type]:
            attempts += 1
            if attempts > 200 * (per_type[task_type] + 10):
                raise ValueError(f"{suite}/{task_type}: could not draw {per_type[task_type]} "
                                 f"distinct {split} tasks")
            drawn = draw(rng, task_type)
            if drawn is None or drawn[0] in seen or split_of(drawn[0]) != split:
                continue
            seen.add(drawn[0])
            tasks.append(drawn[1]())
        by_type[task_type] = tasks
    return interleave(by_type, types)


@dataclass
class Task:
    """One task. Single-turn: `question` + `answer` scored by `verifier`. Multi-turn:
    minskill.tasks.make_env."""
    id: str
    type: str
    question: str                 # the prompt (single-turn) or the instruction (multi-turn)
    answer: str | None = None
    verifier: str = "final"       # a key of verifiers.VERIFIERS
    multi_turn: bool = False
    max_steps: int = 1
    env_spec: dict = field(default_factory=dict)   # JSON-able: everything make_env needs; or
                                                   # choices
    metadata: dict = field(default_factory=dict)   # suite, split, level, source line, ...
    prompt: str = ""              # what the task model is shown, when not `question` (a JSONL
                                  # task's GAIA prompt and file: qa.task_prompt); retrieval,
                                  # teachers and editors quote `question`

    def score(self, reply: str) -> float:
        """1.0 when the reply is right according to this task's verifier, else 0.0."""
        if self.multi_turn:
            raise ValueError(f"task {self.id} is multi-turn: its reward is the environment's "
                             "success flag")
        if self.answer is None:
            raise ValueError(f"task {self.id} has no reference answer to score against")
        return 1.0 if verify(self.verifier, reply, self.answer, self.env_spec) else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Task":
        return cls(**data)


class Environment:
    """Base of the multi-turn environments.

    reset() -> first observation. step(action) -> (observation, done, success). An action that
    changes nothing (unknown, impossible here, wrong object...) returns exactly NOTHING_HAPPENS and
    is counted in `nothing_happens`; purely informational actions (look, inventory, examine) are
    valid. The episode ends on success, on a final action (webwalk `answer`), or when `steps`
    reaches `max_steps`.

    What an agent loop may rely on (rollout.py reads these and nothing else about a suite):
      action_syntax          the action patterns this environment understands ("go to X", "answer
                             <text>"); shown to the agent, and their first words are the verbs found
                             in a free-form reply; () = none declared
      admissible_actions()   the actions that would do something now; [] = not listed
    """
    action_syntax: tuple[str, ...] = ()

    def __init__(self, max_steps: int):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.steps = 0
        self.nothing_happens = 0
        self.done = False
        self.success = False

    def reset(self) -> str:
        self.steps = 0
        self.nothing_happens = 0
        self.done = False
        self.success = False
        return self._reset()

    def step(self, action: str) -> tuple[str, bool, bool]:
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self.steps += 1
        observation = self._step(normalize_action(action))
        if observation == NOTHING_HAPPENS:
            self.nothing_happens += 1
        if self.steps >= self.max_steps:
            self.done = True
        return observation, self.done, self.success

    def admissible_actions(self) -> list[str]:
        return []

    # subclasses implement these
    def _reset(self) -> str:
        raise NotImplementedError

    def _step(self, action: str) -> str:
        raise NotImplementedError


def normalize_action(action: str) -> str:
    """Lower-case, single spaces, no surrounding quotes/backticks or trailing full stop."""
    text = " ".join(str(action).strip().split()).lower()
    text = text.strip("`'\"")
    return text[:-1].rstrip() if text.endswith(".") else text


# --------------------------------------------------------------------------------------------------
# Lenient action parsing

_PREFIX = re.compile(r"^\s*(?:[-*•>]+\s*|\d+[.)]\s+|(?:next\s+)?action\s*\d*\s*[:=-]\s*|"
                     r"(?:i\s+will|i'll|let's|let\s+me)\s+)+", re.IGNORECASE)


def _verbs(syntax: Iterable[str], admissible: Iterable[str]) -> list[str]:
    """First words of the allowed actions ("go", "take", "click", ...), longest first."""
    words = {s.split()[0].lower() for s in list(syntax) + list(admissible) if s.split()}
    return sorted(words, key=len, reverse=True)


def _clean(line: str) -> str:
    line = line.strip().strip("`").strip()
    prev = None
    while prev != line:  # prefixes can stack: "> Action: `go to desk 1`"
        prev = line
        line = _PREFIX.sub("", line).strip().strip("`\"'*").strip()
    return re.sub(r"\s+", " ", line).rstrip(" .!;:")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip().rstrip(" .!;:")


def match_admissible(candidate: str, admissible: list[str], cutoff: float = 0.75,
                     same_verb: bool = True) -> str | None:
    """The admissible action `candidate` means: equal up to case/spacing/trailing punctuation; else
    the longest admissible action it starts with ("go to desk 1 to look" -> "go to desk 1"); else
    the closest one (with the same first word, when `same_verb`) whose difflib similarity ratio is
    >= cutoff. None when nothing fits."""
    cand = _norm(candidate)
    if not cand:
        return None
    by_norm = {_norm(a): a for a in admissible}
    if cand in by_norm:
        return by_norm[cand]
    prefixes = [a for n, a in by_norm.items() if cand.startswith(n + " ")]
    if prefixes:
        return max(prefixes, key=len)
    verb = cand.split()[0]
    pool = [n for n in by_norm if n.split()[0] == verb or not same_verb]
    close = difflib.get_close_matches(cand, pool, n=1, cutoff=cutoff)
    return by_norm[close[0]] if close else None


def parse_action(reply: str, admissible: list[str] | None = None,
                 syntax: list[str] | None = None) -> str:
    """One action out of a free-form reply. Each line is stripped of "Action:", "> ", bullets,
    numbering and quotes; the first line that starts with an action verb wins (failing that, the
    first line holding a verb, from that verb on); with admissible actions the result is matched to
    one of them when its verb is among theirs (free-text actions such as "answer <text>" pass
    through). "" when the reply is empty."""
    admissible = list(admissible or [])
    verbs = _verbs(syntax or [], admissible)
    lines = [c for c in (_clean(l) for l in (reply or "").splitlines()) if c]
    if not lines:
        return ""
    candidate, by_verb = None, False
    if verbs:
        verb_alt = "|".join(re.escape(v) for v in verbs)
        starts = re.compile(rf"^(?:{verb_alt})\b", re.IGNORECASE)
        inside = re.compile(rf"\b(?:{verb_alt})\b", re.IGNORECASE)
        candidate = next((l for l in lines if starts.match(l)), None)
        if candidate is None:
            for l in lines:
                m = inside.search(l)
                if m:
                    candidate = _clean(l[m.start():])
                    break
    if candidate is None:
        candidate = lines[0]
    else:
        # "Answer: 42" / "answer is 42" -> "answer 42" (the verb as the syntax spells it)
        by_verb = True
        m = re.match(rf"^({verb_alt})\b\s*(?:[:=]|\bis\b)?\s*", candidate, re.IGNORECASE)
        candidate = (m.group(1).lower() + " " + candidate[m.end():]).strip()
    if admissible:
        matched = match_admissible(candidate, admissible)
        if matched is not None:
            return matched
        # no action verb anywhere: perhaps a line is a misspelt admissible action ("opne cabinet 1")
        for l in lines if not by_verb else []:
            matched = match_admissible(l, admissible, cutoff=0.85, same_verb=False)
            if matched is not None:
                return matched
    return candidate


# --------------------------------------------------------------------------------------------------
# A prompt too long for the task model

# What a server's HTTP 400 says when the prompt (with the reply's max_tokens) does not fit its
# context: llama.cpp "the request exceeds the available context size", vLLM and OpenAI "This model's
# maximum context length is N tokens" (OpenAI's code: context_length_exceeded), minskill's server
# "... but the model's context is N tokens". Conservative: only these phrases, so that no other 400
# (a bad field) is taken for a prompt to trim. Kept here, below both readers: the agent loop
# (minskill/rollout.py trims an episode's history) and the teacher's prompts
# (minskill/masa/teacher.py).
CONTEXT_REFUSAL = re.compile(r"exceeds the available context size|maximum context length|"
                             r"context_length_exceeded|the model's context is \d+ tokens", re.I)


def is_context_refusal(error) -> bool:
    """Whether `error` is a server's refusal of a prompt too long for its context: HTTP 400 and
    CONTEXT_REFUSAL in its message. Read off the error's `status` and `message`
    (minskill.serve.client.ChatError's), so that tasks/ still imports nothing else of minskill."""
    message = getattr(error, "message", None)
    return (isinstance(error, Exception) and getattr(error, "status", None) == 400
            and isinstance(message, str) and CONTEXT_REFUSAL.search(message) is not None)
