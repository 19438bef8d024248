"""The rewriter's SFT data from MASA stage 1 (docs/rewriter.md): records, their augmentations,
merged runs.

A record teaches the rewriter (rewrite.py, minskill/masa/rewriter_sft.py) one adaptation:

    input  (model card of the target F, input skill set S_in, task description d)
    target S*_F, a top-scoring skill set of F's search (the evolved library)

with rewriter_sft's schema (`rewriter_sft.RECORD_FIELDS`: model_card, skills_in, task_description,
skills_out) plus where the record comes from (`source`, `target_model`, `reward_out`). The sources
of S_in (`SFT_SOURCES`):

    early / middle / late   an evaluated intermediate of the search, one from each third of it
    teacher_oneshot         the teacher's one-shot rewrite of the base skills ("DS-Adapter")
    noise                   S*_F with each sentence perturbed, dropped or swapped with p = 0.3
    partial                 S*_F with round(0.6 · n) of its n skills kept
    verbose                 S*_F padded with filler sentences that carry no information
    other_backbone          another target's best set (`merge_sft_runs`, runs on other targets)

The task description d is `suite_description` of the search tasks; `sft_task_description(suite)`
gives the one a run with evolve_masa.py's defaults writes, and `task_description(text)` reads
rewrite.py apply's and transfer's --task: a suite's name stands for that description, other text
is kept.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Callable

from minskill.files import read_json, read_jsonl
from minskill.masa.model_card import ModelCard
from minskill.masa.teacher import clip_text
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from minskill.tasks import SUITES, load_suite


# --------------------------------------------------------------------------------------------------
# Rewriter SFT records

SFT_SOURCES = ("early", "middle", "late", "teacher_oneshot", "noise", "partial", "verbose",
               "other_backbone")


def sft_records(state: dict, card: ModelCard, task_description: str, best: SkillSet,
                reward_out: float, target_model: str, oneshot: SkillSet | None = None,
                seed: int = 0, copies: int = 1) -> list[dict]:
    """Records (model card, S_in, task description) -> S_out = `best` (the top-scoring set of the
    search).

    S_in: one evaluated search intermediate from each third of the search's history (early,
    middle, late; sets equal to the best are left out), the one-shot teacher rewrite when given, and
    `copies` augmentations each of the best set (noise 0.3, partial keep 0.6, verbose)."""
    rng = random.Random(seed)
    best_json = json.dumps(best.to_json(), sort_keys=True)
    intermediates = [x for x in state.get("candidates", []) if x["reward"] is not None
                     and json.dumps(x["skills"], sort_keys=True) != best_json]
    records = []

    def add(skills_in: SkillSet, source: str) -> None:
        records.append(sft_record(card, skills_in, task_description, best, source, target_model,
                                  reward_out))
    if intermediates:
        n = len(intermediates)
        thirds = [intermediates[i * n // 3:(i + 1) * n // 3] for i in range(3)]
        for source, part in zip(("early", "middle", "late"), thirds):
            if part:
                add(SkillSet.from_json(rng.choice(part)["skills"]), source)
    if oneshot is not None:
        add(oneshot, "teacher_oneshot")
    for _ in range(copies):
        add(augment_noise(best, rng, 0.3), "noise")
        add(augment_partial(best, rng, 0.6), "partial")
        add(augment_verbose(best, rng), "verbose")
    return records


def merge_sft_runs(run_dirs: list) -> list[dict]:
    """The SFT records of several evolve_masa.py runs (each folder holds sft.jsonl and run.json),
    plus, for every ordered pair of runs on different target models A != B, a record that adapts
    B's best set to A (source "other_backbone": model card, task description and S_out of A; S_in =
    B's best)."""
    runs = []
    for folder in map(Path, run_dirs):
        for name in ("sft.jsonl", "run.json"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"merge: {folder} has no {name} (is it an evolve_masa.py "
                                        f"output folder?)")
        info = read_json(folder / "run.json", f"merge: {folder / 'run.json'}")
        runs.append((folder, info, [record for _, record in read_jsonl(folder / "sft.jsonl")]))
    records = [r for _, _, recs in runs for r in recs]
    for a_dir, a, _ in runs:
        for b_dir, b, _ in runs:
            if a["target_model"] == b["target_model"]:
                continue
            records.append(sft_record(ModelCard.from_json(a["model_card"],
                                                          where=f"{a_dir}/run.json"),
                                      SkillSet.from_json(b["best_skills"]), a["task_description"],
                                      SkillSet.from_json(a["best_skills"]), "other_backbone",
                                      a["target_model"], a["reward_out"]))
    return records


def sft_record(card: ModelCard, skills_in: SkillSet, task_description: str, skills_out: SkillSet,
               source: str, target_model: str, reward_out: float) -> dict:
    if source not in SFT_SOURCES:
        raise ValueError(f"sft_record: unknown source {source!r}; use one of {SFT_SOURCES}")
    return {"model_card": card.to_json(), "skills_in": skills_in.to_json(),
            "task_description": task_description, "skills_out": skills_out.to_json(),
            "source": source, "target_model": target_model, "reward_out": float(reward_out)}


# --------------------------------------------------------------------------------------------------
# Augmentations of a skill set (S_in sources of the rewriter's SFT data)

def augment_noise(skills: SkillSet, rng: random.Random, p: float = 0.3) -> SkillSet:
    """Each sentence of each skill body is, with probability p, perturbed (two adjacent words
    swapped), dropped, or swapped with another sentence of the body."""
    def noisy(body: str) -> str:
        pieces = _SENTENCE.split(body)               # sentence, separator, sentence, ...
        sentences, separators = pieces[0::2], pieces[1::2] + [""]
        out = list(sentences)
        for i in range(len(sentences)):
            if not sentences[i].strip() or rng.random() >= p:
                continue
            kind = rng.choice(("perturb", "drop", "shuffle"))
            if kind == "perturb":
                words = out[i].split()
                if len(words) > 1:
                    j = rng.randrange(len(words) - 1)
                    words[j], words[j + 1] = words[j + 1], words[j]
                out[i] = " ".join(words)
            elif kind == "drop":
                out[i] = ""
            else:
                j = rng.randrange(len(out))
                out[i], out[j] = out[j], out[i]
        text = "".join(s + sep for s, sep in zip(out, separators) if s.strip()).strip()
        return text or body                          # never an empty skill
    return _map_bodies(skills, noisy)


def augment_partial(skills: SkillSet, rng: random.Random, keep: float = 0.6) -> SkillSet:
    """Keep round(keep · n) of the n skills (at least one), chosen at random, in their order."""
    slots = [("general", None, i) for i in range(len(skills.general))]
    slots += [("type", t, i) for t, group in skills.task_specific.items()
              for i in range(len(group))]
    if not slots:
        return skills
    kept = set(rng.sample(range(len(slots)), max(1, round(keep * len(slots)))))
    chosen = [slots[i] for i in sorted(kept)]
    general = [skills.general[i] for kind, _, i in chosen if kind == "general"]
    task_specific: dict[str, list[Skill]] = {}
    for kind, t, i in chosen:
        if kind == "type":
            task_specific.setdefault(t, []).append(skills.task_specific[t][i])
    return SkillSet(general=general, task_specific=task_specific,
                    common_mistakes=list(skills.common_mistakes))


def augment_verbose(skills: SkillSet, rng: random.Random, sentences: int = 3) -> SkillSet:
    """Pad each skill body with generic filler sentences (they carry no information) at random
    places."""
    def verbose(body: str) -> str:
        lines = body.split("\n")
        for sentence in rng.sample(FILLER, min(sentences, len(FILLER))):
            lines.insert(rng.randrange(len(lines) + 1), sentence)
        return "\n".join(lines)
    return _map_bodies(skills, verbose)


def _map_bodies(skills: SkillSet, fn: Callable[[str], str]) -> SkillSet:
    return SkillSet(general=[replace(s, body=fn(s.body)) for s in skills.general],
                    task_specific={t: [replace(s, body=fn(s.body)) for s in group]
                                   for t, group in skills.task_specific.items()},
                    common_mistakes=list(skills.common_mistakes))


_SENTENCE = re.compile(r"((?<=[.!?])[ \t]+|\n+)")

FILLER = ["It is important to read every part of the task carefully before doing anything else.",
          "Always keep in mind the overall goal and make sure each step moves toward it.",
          "Take your time, think about the problem in a structured way, and double-check your "
          "work.",
          "Remember that clarity and correctness are more important than speed in all situations.",
          "Consider the context of the task and any information that has been provided to you.",
          "When in doubt, go back to the instructions and make sure you follow them closely."]


# --------------------------------------------------------------------------------------------------
# The task description d of a record

def task_description(text: str, task_seed: int = 0) -> str:
    """A rewriter's task description given as --task: a suite's name (qa, household, webwalk,
    webshop, searchqa, or a .jsonl file) stands for the description its SFT records hold
    (sft_task_description); any other text is used as is."""
    if text in SUITES or (text.endswith(".jsonl") and Path(text).is_file()):
        return sft_task_description(text, task_seed)
    return text


def sft_task_description(suite: str, task_seed: int = 0, n_prelim: int = 4,
                         n_train: int = 24) -> str:
    """The task description that evolve_masa.py writes into its SFT records for `suite` (a built-in
    name or a .jsonl path) run with these --task-seed, --n-prelim and --n-train (its defaults):
    suite_description of its search tasks, the train tasks after the preliminary ones. ValueError
    when the suite gives none there."""
    tasks = load_suite(suite, split="train", seed=task_seed, n=n_train + n_prelim)[n_prelim:]
    if not tasks:
        raise ValueError(f"suite {suite}: no train tasks after the first {n_prelim}, so no search "
                         f"tasks to describe")
    return suite_description(tasks, Path(suite).stem)


def suite_description(tasks: list, name: str) -> str:
    """A short description of a task suite for prompts and SFT records: its types with one example
    each."""
    types = sorted({t.type for t in tasks})
    kind = "multi-turn" if any(t.multi_turn for t in tasks) else "single-turn"
    lines = [f"Suite '{name}': {kind} tasks of {len(types)} type(s): {', '.join(types)}."]
    for task_type in types:
        example = next(t for t in tasks if t.type == task_type)
        lines.append(f"- {task_type}, e.g.: {clip_text(example.question, 200)}")
    return "\n".join(lines)
