"""Skill retrieval as MASA's evaluation does it: per task, the top-k general and top-k task-specific
skills of a library, plus every common mistake, instead of the whole library.

For a task with text q (its question, or a multi-turn task's instruction) and type τ, the system
prompt is the rendering (SkillSet.render, within the usual token budget) of

    G(q) = the k_g general skills s with the highest score(q, s)              (--top-k-general, 6)
    T(q) = the k_t skills of τ's task-specific group with the highest score(q, s)  (--top-k-task, 5)
    M    = all common mistakes (always included, as MASA does)

in that order, each list best first (ties keep library order; a group smaller than k is taken whole;
an empty q scores every skill 0).
Each skill is scored on its document d(s) = name + description + body; two scores:

* `keyword` (lexical, in the spirit of MASA's "template" mode), Okapi BM25 over one pool P (the
  general skills, or one type's skills, ranked separately):

      tokens(x)   = lower-cased runs of letters and digits of x, minus a short list of stop words
      score(q, s) = Σ_{t ∈ set(tokens(q))} IDF(t) · f(t,s)·(k1 + 1)
                    / (f(t,s) + k1·(1 − b + b·|s| / avgdl))
      IDF(t)      = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))

  f(t,s): count of t in tokens(d(s)); |s| = len(tokens(d(s))); avgdl: mean |s| over P; N = |P|;
  n(t): skills of P whose document holds t; k1 = 1.2, b = 0.75. A skill sharing no word with q
  scores 0. (tasks/bm25.py holds tokens and bm25_scores, shared with the webshop and searchqa
  suites.)

* `embedding`, cosine similarity of vectors from any OpenAI-compatible `POST /v1/embeddings`
  endpoint (ChatClient.embed; minskill's server answers it with mean-pooled, normalised hidden
  states):

      score(q, s) = e(q)·e(d(s)) / (‖e(q)‖ ‖e(d(s))‖)

  Each skill's document is embedded once per library; the tasks' texts in batches of EMBED_BATCH.
  A zero vector, vectors of different lengths or a reply of the wrong shape is an error naming the
  URL.

`--retrieve none` (the default) keeps today's behaviour: the whole library within the token budget.
`RetrievedSkills(library, retriever)` is what the rollout code gets: it renders per task
(`render_for_tasks`, rollout.skill_prompts), and still renders per task type (`render`), scoring the
task type's name as q, for callers that have no task text.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from minskill.serve.client import ChatClient, ChatError
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from minskill.tasks.bm25 import bm25_scores

__all__ = ["Retriever", "RetrievedSkills", "RetrievalError", "cosine", "add_retrieval_args",
           "check_retrieval_args", "retriever_from_args", "with_retrieval", "MODES"]

MODES = ("none", "keyword", "embedding")
TOP_K_GENERAL, TOP_K_TASK = 6, 5       # MASA's defaults
EMBED_BATCH = 64                       # texts per /v1/embeddings request


class RetrievalError(ValueError):
    """Retrieval cannot run: bad flags, an embeddings endpoint that fails or answers in the wrong
    shape."""


# --------------------------------------------------------------------------- scores

def document(skill: Skill) -> str:
    """What a skill is scored on: its name (hyphens as spaces), description and body."""
    return f"{skill.name.replace('-', ' ')}\n{skill.description}\n{skill.body}"


def cosine(u: list[float], v: list[float]) -> float:
    nu, nv = math.sqrt(sum(x * x for x in u)), math.sqrt(sum(x * x for x in v))
    return sum(x * y for x, y in zip(u, v)) / (nu * nv)


def top_k(skills: list[Skill], scores: list[float], k: int) -> list[Skill]:
    """The k best skills, best first; equal scores keep library order (a stable sort)."""
    order = sorted(range(len(skills)), key=lambda i: -scores[i])
    return [skills[i] for i in order[:k]]


# --------------------------------------------------------------------------- the retriever

@dataclass
class Retriever:
    """How to pick skills for a task text: `mode` keyword or embedding; `client` has embed(texts)
    (embedding)."""
    mode: str = "keyword"
    top_k_general: int = TOP_K_GENERAL
    top_k_task: int = TOP_K_TASK
    client: object = None
    where: str = "--retrieve"          # how errors name the source of the settings
    endpoint: str | None = None        # how errors name the embeddings endpoint (default:
                                       # --embed-url URL)

    def __post_init__(self):
        if self.mode not in MODES[1:]:
            raise RetrievalError(
                f"{self.where}: mode must be one of {MODES[1:]}, got {self.mode!r}")
        for label, k in (("top-k-general", self.top_k_general), ("top-k-task", self.top_k_task)):
            if not isinstance(k, int) or isinstance(k, bool) or k < 0:
                raise RetrievalError(f"--{label}: must be an integer >= 0, got {k!r}")
        if self.mode == "embedding" and not callable(getattr(self.client, "embed", None)):
            raise RetrievalError(f"{self.where} embedding: needs an embeddings endpoint "
                                 "(--embed-url URL)")
        self._vectors: dict[str, list[float]] = {}   # text -> embedding, so each text is embedded
                                                     # once

    def embed(self, texts: list[str]) -> None:
        """Embed the texts not seen yet (EMBED_BATCH per request) and keep their vectors."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        label = self.endpoint or f"--embed-url {getattr(self.client, 'base_url', '?')}"
        for start in range(0, len(todo), EMBED_BATCH):
            batch = todo[start:start + EMBED_BATCH]
            try:
                vectors = self.client.embed(batch)
            except ChatError as error:
                raise RetrievalError(f"{label}: {error}") from None
            if not isinstance(vectors, list) or len(vectors) != len(batch):
                raise RetrievalError(f"{label}: "
                                     f"{len(vectors) if isinstance(vectors, list) else '?'} "
                                     f"vectors for {len(batch)} texts")
            for text, vector in zip(batch, vectors):
                self._vectors[text] = self._checked(vector, label)

    def _checked(self, vector, label: str) -> list[float]:
        known = next(iter(self._vectors.values()), None)
        if not vector or not all(isinstance(x, float | int) and math.isfinite(x) for x in vector):
            raise RetrievalError(f"{label}: an embedding that is not a list of finite numbers")
        if known is not None and len(known) != len(vector):
            raise RetrievalError(
                f"{label}: embeddings of {len(known)} and {len(vector)} dimensions")
        if not any(vector):
            raise RetrievalError(f"{label}: a zero embedding (cosine similarity is undefined)")
        return [float(x) for x in vector]

    def scores(self, query: str, skills: list[Skill]) -> list[float]:
        docs = [document(s) for s in skills]
        if not query.strip():   # nothing to match (and an empty input is refused by some embedding
                                # servers)
            return [0.0] * len(docs)
        if self.mode == "keyword":
            return bm25_scores(query, docs)
        self.embed([query] + docs)
        return [cosine(self._vectors[query], self._vectors[d]) for d in docs]

    def pick(self, library: SkillSet, task_type: str | None, query: str) -> SkillSet:
        """G(q), T(q) and all common mistakes of `library`, as a skill set (module docstring)."""
        group = list(library.task_specific.get(task_type, [])) if task_type is not None else []
        general = top_k(library.general, self.scores(query, library.general), self.top_k_general)
        specific = top_k(group, self.scores(query, group), self.top_k_task)
        return SkillSet(general=general, task_specific={task_type: specific}
                        if task_type is not None else {},
                        common_mistakes=list(library.common_mistakes))


class RetrievedSkills:
    """A skill library seen through a Retriever: what the rollout code renders, per task."""

    def __init__(self, library: SkillSet, retriever: Retriever):
        if not isinstance(library, SkillSet):
            raise RetrievalError(f"{retriever.where}: retrieval needs a skill set (a folder or a "
                                 f"MASA .json), not a {type(library).__name__}")
        self.library, self.retriever = library, retriever

    def render(self, task_type: str | None = None, max_tokens: int = 1024, count_tokens=None,
               query=None) -> str:
        """The system prompt for one task (query: its text; None: the task type's name stands
        in)."""
        picked = self.retriever.pick(self.library, task_type, query if query is not None
                                     else task_type or "")
        return picked.render(task_type, max_tokens, count_tokens)

    def render_for_tasks(self, tasks: list, max_tokens: int = 1024) -> list[str]:
        """The system prompt of each task, in order: embeddings of all task texts are asked for up
        front."""
        texts = [task_text(t) for t in tasks]
        if self.retriever.mode == "embedding":
            self.retriever.embed(texts + [document(s) for s in self.library.skills()])
        return [self.render(t.type, max_tokens, query=q).strip() for t, q in zip(tasks, texts)]

    def __repr__(self):
        r = self.retriever
        return (f"RetrievedSkills({len(self.library)} skills, {r.mode}, "
                f"top {r.top_k_general}/{r.top_k_task})")


def task_text(task) -> str:
    """What a task is matched on: its question (a multi-turn task's instruction)."""
    return str(getattr(task, "question", "") or getattr(task, "instruction", "") or "")


# --------------------------------------------------------------------------- command line

def add_retrieval_args(parser) -> None:
    """--retrieve, --embed-url, --embed-model, --top-k-general, --top-k-task (on a parser or
    argument group)."""
    parser.add_argument("--retrieve", choices=MODES, default="none",
                        help="skills in a task's prompt: none = the whole library within the token "
                             "budget (default); keyword = top-k by BM25 on the task text; "
                             "embedding = top-k by cosine similarity of --embed-url embeddings "
                        "(minskill.retrieval); common mistakes always")
    parser.add_argument("--embed-url", default=None,
                        help="OpenAI-compatible base URL serving /v1/embeddings "
                        "(--retrieve embedding; default: the task model's endpoint where there is "
                        "one)")
    parser.add_argument("--embed-model", default=None,
                        help="model name sent to --embed-url (default: its first)")
    parser.add_argument("--top-k-general", type=int, default=TOP_K_GENERAL,
                        help="general skills retrieved per task (MASA: 6)")
    parser.add_argument("--top-k-task", type=int, default=TOP_K_TASK,
                        help="task-specific skills retrieved per task (MASA: 5)")


def check_retrieval_args(args: argparse.Namespace) -> None:
    """Refuse flags that cannot work before anything is started (a script calls it with its other
    checks)."""
    mode = args.retrieve
    if args.embed_url and mode != "embedding":
        raise RetrievalError("--embed-url is only used with --retrieve embedding")
    for label in ("top_k_general", "top_k_task"):
        k = getattr(args, label)
        if mode != "none" and (not isinstance(k, int) or k < 0):
            raise RetrievalError(f"--{label.replace('_', '-')}: must be an integer >= 0, got {k!r}")


def retriever_from_args(args: argparse.Namespace, fallback_client=None, api_key: str | None = None):
    """The Retriever the flags ask for (add_retrieval_args's), or None for --retrieve none.
    The embeddings come from --embed-url, else from `fallback_client` (the task model's
    ChatClient)."""
    check_retrieval_args(args)
    mode, embed_url = args.retrieve, args.embed_url
    if mode == "none":
        return None
    client, endpoint = None, None
    if mode == "embedding":
        if embed_url:
            try:
                client = ChatClient(embed_url, model=args.embed_model, api_key=api_key,
                                    # rewrite.py has no --timeout
                                    timeout=float(getattr(args, "timeout", 120.0)))
            except ValueError as error:
                raise RetrievalError(f"--embed-url: {error}") from None
        elif callable(getattr(fallback_client, "embed", None)):
            client = fallback_client
            endpoint = (f"the task model's endpoint {getattr(client, 'base_url', '')} (embeddings; "
                        f"no --embed-url given)")
    return Retriever(mode, args.top_k_general, args.top_k_task, client, endpoint=endpoint)


def with_retrieval(skills, retriever: Retriever | None):
    """`skills` as the rollout code should see them: unchanged without a retriever (or without
    skills), else a RetrievedSkills (a single Skill counts as a library of one general skill)."""
    if retriever is None or skills is None:
        return skills
    if isinstance(skills, Skill):
        skills = SkillSet(general=[skills])
    return RetrievedSkills(skills, retriever)
