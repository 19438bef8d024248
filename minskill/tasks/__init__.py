"""Task suites with verifiable rewards.

    load_suite("qa" | "household" | "webwalk" | "webshop" | "searchqa" | "path/to/tasks.jsonl",
    split="train",
               seed=0, n=None)

* `qa` — single-turn questions (counting, lookup, arithmetic, conversion), lenient final-answer
  check; `load_suite("qa", path=FILE)` (or a .jsonl name) reads GAIA-format or {question, answer,
  type} JSONL; a GAIA task whose answer is hidden (GAIA's test split: "?") is refused unless
  `hidden_answers=True` (then its answer is None: answered, never scored; `gaia_submission` makes
  what GAIA's leaderboard takes instead).
* `household` — ALFWorld-like text environment, six task types.
* `alfworld` — ALFWorld itself on its TextWorld/PDDL engine (an optional extra): games generated
  offline from the alfworld wheel's layouts, or ALFWorld's own (`data=`, $MINSKILL_ALFWORLD_DATA:
  --alfworld-data).
* `webwalk` — WebWalker-like navigation of a generated website, levels easy/medium/hard.
* `webshop` — WebShop-like shopping (search[query], click[...], WebShop's reward), MASA's seven
  categories.
* `searchqa` — search-based QA over a generated corpus (search[query] by BM25, answer[...] by EM; F1
  kept).
  `searchqa:PATH.jsonl` (or a .jsonl with golden_answers) — Search-R1's question files, searched
  through a retriever (--retriever-url; tasks.search_r1).
* `web:PATH.jsonl` (or a WebWalkerQA-format .jsonl) — a tool-using agent over HTTP: search[...],
  visit[...], read_file[...], answer[...] on GAIA's or WebWalkerQA's tasks (tasks.webagent; its
  tools: minskill.web).

Generated suites depend only on (split, seed, n); train and held-out are disjoint (see base.py).
`make_env(task)` is a fresh environment of a multi-turn task (ENVIRONMENTS: its class by
env_spec["kind"]). `oracle_actions(task)` returns a scripted solution of a multi-turn task (used by
tests to prove that every generated task is solvable); it is never shown to a model.
`suite_types(name)` are a suite's task types; `skill_key_type(key, types)` the type a skill
library's task-specific key holds skills for (the key itself, or a type it is another name of:
household.TYPE_NAMES, searchqa.TYPE_NAMES).
"""
from __future__ import annotations

import warnings
from pathlib import Path

from .alfworld import TASK_TYPES as ALFWORLD_TYPES
from .alfworld import TYPE_NAMES as ALFWORLD_TYPE_NAMES
from .alfworld import AlfworldEnv, generate_alfworld
from .alfworld import oracle_actions as alfworld_oracle
from .base import (NOTHING_HAPPENS, SPLITS, Environment, Task, TaskWarning, check_split,
                   normalize_action, split_of)
from .household import TASK_TYPES as HOUSEHOLD_TYPES
from .household import TYPE_NAMES, HouseholdEnv, generate_household
from .household import oracle_actions as household_oracle
from .qa import (GAIA_PROMPT, GAIA_SUBMISSION, GAIA_TYPES, gaia_submission, generate_qa,
                 is_hidden_answer, load_jsonl, withhold_hidden)
from .qa import TASK_TYPES as QA_TYPES
from .searchqa import TASK_TYPES as SEARCHQA_TYPES
from .searchqa import TYPE_NAMES as SEARCHQA_TYPE_NAMES
from .searchqa import SearchQAEnv, generate_searchqa, is_question_file, load_question_file
from .searchqa import oracle_actions as searchqa_oracle
from .verifiers import (exact_match, extract_final_number, final_answer_match, gaia_final_answer,
                        gaia_match,
                        gaia_score, numeric_match, token_f1, verify)
from .webshop import TASK_TYPES as WEBSHOP_TYPES
from .webshop import WebShopEnv, generate_webshop
from .webshop import oracle_actions as webshop_oracle
from .webagent import WebAgentEnv, is_web_suite, load_web_suite
from .webagent import oracle_actions as webagent_oracle
from .webwalk import LEVELS, WebWalkEnv, generate_webwalk
from .webwalk import oracle_actions as webwalk_oracle

__all__ = ["Task", "Environment", "HouseholdEnv", "WebWalkEnv", "WebShopEnv", "SearchQAEnv",
           "NOTHING_HAPPENS",
           "SPLITS", "SUITES", "BASE_SKILLS_DIR", "ENVIRONMENTS", "ORACLES", "load_suite",
           "make_env", "oracle_actions",
           "task_types", "gaia_match", "gaia_final_answer", "gaia_score", "GAIA_PROMPT",
           "GAIA_SUBMISSION", "gaia_submission", "is_hidden_answer", "withhold_hidden",
           "exact_match", "numeric_match", "final_answer_match", "extract_final_number", "verify",
           "normalize_action", "split_of", "TaskWarning",
           "SUITE_TYPES", "suite_types", "skill_key_type", "is_task_file", "token_f1"]

# The hand-written base skills of each built-in suite: BASE_SKILLS_DIR/<suite>/ (Agent Skills skill
# sets).
BASE_SKILLS_DIR = Path(__file__).parent / "base_skills"
SUITES = {"qa": generate_qa, "household": generate_household, "webwalk": generate_webwalk,
          "webshop": generate_webshop, "searchqa": generate_searchqa, "alfworld": generate_alfworld}
# The task types of each built-in suite and of GAIA's files ("level1".."level3"):
# BASE_SKILLS_DIR/<name>/
# holds base skills for them.
SUITE_TYPES = {"qa": QA_TYPES, "household": HOUSEHOLD_TYPES, "webwalk": LEVELS,
               "webshop": WEBSHOP_TYPES,
               "searchqa": SEARCHQA_TYPES, "gaia": GAIA_TYPES, "alfworld": ALFWORLD_TYPES}
# each name of a type, with its other names (a skill library may key a type by any of them)
# (alfworld's names are ALFWorld's; its look type's tuple, a superset of household's, replaces that
# one)
_SAME_TYPE = [(t,) + names
              for t, names in {**TYPE_NAMES, **SEARCHQA_TYPE_NAMES, **ALFWORLD_TYPE_NAMES}.items()]
# The environment class of each kind of multi-turn task (Task.env_spec["kind"]).
ENVIRONMENTS = {"household": HouseholdEnv, "webwalk": WebWalkEnv, "webshop": WebShopEnv,
                "searchqa": SearchQAEnv,
                "webagent": WebAgentEnv, "alfworld": AlfworldEnv}
# The scripted solution of each kind of multi-turn task.
ORACLES = {"household": household_oracle, "webwalk": webwalk_oracle, "webshop": webshop_oracle,
           "searchqa": searchqa_oracle, "webagent": webagent_oracle, "alfworld": alfworld_oracle}


def load_suite(name: str, split: str = "train", seed: int = 0, n: int | None = None,
               path: str | Path | None = None, hidden_answers: bool = False) -> list[Task]:
    """Tasks of a built-in suite or of a JSONL file (`name` ending in .jsonl, or `path`).

    split: "train", "heldout" or "all". n: number of tasks (default per suite: qa 50 per type,
    household, webwalk, webshop and searchqa 10 per type); JSONL files give all their tasks of the
    split unless n is set. hidden_answers: a JSONL file's GAIA tasks whose answers are hidden load
    (answer None) instead of being an error (tasks.qa).
    """
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if path is None and is_web_suite(name):   # a tool-using agent's tasks (tasks.webagent)
        return load_web_suite(name, split=split, seed=seed, n=n)
    if path is None and is_question_file(name):   # Search-R1's questions (tasks.searchqa)
        return load_question_file(name, split=split, seed=seed, n=n)
    if path is not None or is_task_file(name):
        file = Path(path if path is not None else name)
        if path is not None and name not in ("qa", str(path)):
            raise ValueError(f"a JSONL file holds qa tasks; got suite {name!r} with path={path}")
        return load_jsonl(file, split=split, seed=seed, n=n, hidden_answers=hidden_answers)
    if name not in SUITES:
        raise ValueError(
            f"unknown suite {name!r}; built in: {', '.join(SUITES)} (or a .jsonl file)")
    if name == "alfworld":   # (its own splits: ALFWorld's valid_seen and valid_unseen too; "all"
                             # too)
        return generate_alfworld(split=split, seed=seed, n=n)
    if check_split(split) == "all":
        return SUITES[name](split="train", seed=seed, n=n) + SUITES[name](split="heldout",
                                                                          seed=seed, n=n)
    return SUITES[name](split=split, seed=seed, n=n)


def make_env(task: Task) -> Environment:
    """A fresh environment for a multi-turn task (call reset() on it first)."""
    if not task.multi_turn:
        raise ValueError(f"task {task.id} is single-turn: it has no environment")
    kind = task.env_spec.get("kind")
    if kind not in ENVIRONMENTS:
        raise ValueError(f"task {task.id}: unknown environment kind {kind!r}")
    return ENVIRONMENTS[kind](task.env_spec, max_steps=task.max_steps)


def oracle_actions(task: Task) -> list[str]:
    """A scripted solution of a multi-turn task."""
    kind = task.env_spec.get("kind")
    if kind in ORACLES:
        return ORACLES[kind](task)
    raise ValueError(f"task {task.id} has no oracle (kind {kind!r})")


def task_types(tasks: list[Task]) -> list[str]:
    """The task types of a list of tasks, in order of first appearance."""
    return list(dict.fromkeys(t.type for t in tasks))


def is_task_file(suite: str) -> bool:
    """Whether `suite` names a JSONL task file (else a built-in suite)."""
    return str(suite).endswith(".jsonl")


def suite_types(name: str) -> list[str]:
    """The task types of a suite: a built-in suite's, or those of every task of a JSONL file (both
    splits)."""
    if not is_task_file(name) and name in SUITES:
        return list(SUITE_TYPES[name])
    with warnings.catch_warnings():   # (a missing task file was named when the suite's tasks were
                                      # loaded)
        warnings.simplefilter("ignore", TaskWarning)
        return task_types(load_suite(name, split="all", hidden_answers=True))   # (GAIA's test too)


def skill_key_type(key: str, types) -> str | None:
    """The task type among `types` whose skills a library's task-specific `key` holds: the key
    itself, else the type of `types` it is another name of (household.TYPE_NAMES); None when it
    holds none of them."""
    if key in types:
        return key
    for names in _SAME_TYPE:
        if key in names:
            return next((t for t in names if t in types), None)
    return None
