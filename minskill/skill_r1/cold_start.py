"""Skill-R1's cold start: supervised fine-tuning that teaches the editor to write a usable skill
before GRPO.

    python -m minskill.skill_r1.cold_start --suite qa --out runs/editor-sft --max-skill-tokens 192
    python train_grpo.py --editor runs/editor-sft/final ...      # GRPO starts from the SFT editor

A 135M editor cannot write a skill the task model can use before RL (docs/results-skill-r1.md), so
every GRPO advantage is computed among incoherent candidates; this stage trains it on its own prompt
format first. How the data are built, in full: docs/skill-r1.md, "Cold start".

Decisions:
1. Data from the suite's training split only; two prompts per instance (generations 1 and 2),
   built exactly as a train_grpo step shows them (`loop.editor_messages`).
2. Several targets per prompt (base, base-reordered, base-short, procedure, worked): a spread of
   good skills, all of a form the task model is known to use, each within --max-skill-tokens.
3. A target that does not fit, does not parse as a skill or repeats another is left out, counted.
4. The loss is minskill.sft's, a prompt's targets trained together (--share-prompts).
5. A run writes OUT only; --resume continues on the saved chats with the saved flags."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

from minskill import sft
from minskill.cli import add_task_model_args, client_args
from minskill.device import add_device_args, resolve_bf16, set_up_device
from minskill.files import check_shape, read_json, read_jsonl, write_jsonl_atomic, write_text_atomic
from minskill.nn.weights import load_model
from minskill.rollout import SkillsNotFound, base_skills, load_skills, skill_text
from minskill.runs import (RUN_MARKER, RunFolderError, check_run_folder, given_flags,
                           open_run_folder, restart_note, resume_flags, started_flags)
from minskill.serve.client import lone_surrogate_at
from minskill.serve.embedded import embedded_client
from minskill.skill_r1.loop import (OUTCOMES_SHOWN, EvolveConfig, HistoryEntry, Instance,
                                    SuiteError, outcome_line,
                                    check_config, editor_messages, load_split, make_instances,
                                    parse_candidate,
                                    score_skills, step_seed)
from minskill.skills import slugify

DATA_FILE = "sft_data.jsonl"
RUN_CONFIG = "run_config.json"   # the flags, for --resume (the resume policy: minskill/runs.py)
# --resume: flags that may differ from the saved run's (where and how fast it runs: the task model
# is not called again, and sft.RUN_SETTINGS); any other flag given must equal the saved one
RESUME_MAY_CHANGE = ("task_url", "task_model", "task_api_key", "task_concurrency",
                     "task_extra_body", "device",
                     "max_steps", "eval_every", "save_every", "keep_checkpoints", "micro_batch",
                     "grad_checkpointing")
TARGET_KINDS = ("base", "base-reordered", "base-short", "procedure", "worked")
# the cold start's SFT: a prompt's several targets in one micro-batch, the prompt computed once
# (sft.share_prompts)
SFT_DEFAULTS = sft.SFTConfig(micro_batch_size=4, share_prompts=True)
MAX_WORKED_REPLY_CHARS = 240   # the longest task-model reply a worked example shows
# train_grpo.py's defaults of the flags both scripts have and EvolveConfig does not hold
# (tests/test_cold_start.py checks they equal train_grpo.TrainConfig's; a package module does not
# import the script)
DEFAULTS = {"editor": "smollm2-135m", "suite": "qa", "seed_skills": "none", "tasks_per_instance": 4,
            "task_quantize": "none", "seed": 0}

# Hand-written steps per qa type (the facts they need are the base skills'); other types get
# GENERIC_PROCEDURE.
PROCEDURES = {
    "arithmetic": ["Find the two numbers and the operation: plus/add/sum or minus/subtract.",
                   "Write the sum as a + b = c or a - b = c and compute it.",
                   'End with "The answer is c."'],
    "conversion": ["Find the big unit, the small unit and the number of big units.",
                   "Look up how many small units one big unit has (the table below).",
                   "Multiply the number by that factor.",
                   'End with "The answer is N."'],
    "counting": ["Find the item that is asked about.",
                 "Go through the list one word at a time and number each match: (1), (2), ...",
                 'The last number is the count. End with "The answer is N."'],
    "lookup": ["Find the name the question asks about.",
               "Find the sentence that starts with that name and read its number.",
               'End with "The answer is N."'],
}
GENERIC_PROCEDURE = ["Read the task and find what it asks for.", "Work it out step by step.",
                     "Give the final answer on its own line."]
# facts a procedure needs, one a line (the shortening drops them from the end): the conversion base
# skill's table
PROCEDURE_FACTS = {"conversion": ["1 hour = 60 minutes.", "1 minute = 60 seconds.",
                                  "1 day = 24 hours.",
                                  "1 week = 7 days.", "1 year = 12 months.",
                                  "1 meter = 100 centimeters.",
                                  "1 kilometer = 1000 meters.", "1 kilogram = 1000 grams.",
                                  "1 dozen = 12."]}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(parse_args(argv), argv)
    except (SuiteError, SkillsNotFound, RunFolderError, ValueError) as e:
        print(f"cold_start: {e}", file=sys.stderr)
        return 2


def run(args, argv: list[str]) -> int:
    out, script = Path(args.out), "cold_start"
    check_run_folder(out, args.resume, args.overwrite, script)   # before any model loads
    restart = args.resume and not (out / DATA_FILE).is_file()   # stopped before writing its chats
    if restart and started_flags(out, script) is None:
        raise RunFolderError(f"{script}: --resume: no {out / DATA_FILE} (nothing to resume; drop "
                             "--resume)")
    reads_data = args.data is not None and (restart or not args.resume)
    if reads_data and not Path(args.data).is_file():
        raise ValueError(f"--data {args.data}: no such file")
    resume = args.resume and bool(sft.checkpoints(out))   # killed before its first checkpoint: from
                                                          # step 0
    cfg, scfg = evolve_config(args), sft_config(args)
    set_up_device(args.device)
    torch.manual_seed(args.seed)
    editor, tokenizer = load_model(args.editor, dtype=torch.float32, device=args.device)
    check_config(editor, cfg)
    if restart:
        print(restart_note(out), flush=True)   # (it stopped before writing its chats)
    if args.resume and not restart:
        rows = read_data(out / DATA_FILE)
        print(f"resume: {len(rows)} chats from {out / DATA_FILE}"
              + ("" if resume else "; no checkpoint yet: "
              "training from step 0"), flush=True)
    elif args.data is not None:   # an earlier run's chats, read (and checked) before OUT is touched
        rows = read_data(Path(args.data))
        write_run(out, args, argv, rows, script)
        print(f"wrote {out / DATA_FILE}: the {len(rows)} chats of {args.data} (not rebuilt: no "
              "task-model call)",
              flush=True)
    else:
        instances = make_instances(load_split(args, "train"), args.tasks_per_instance,
                                   prefix="train")
        if not instances:
            raise SuiteError(f"--suite {args.suite}: no task type has {args.tasks_per_instance} "
                             "training tasks")
        instances = instances[:args.max_instances]
        seed_skills = load_skills(args.seed_skills, args.suite)
        try:
            targets_from = base_skills(args.suite)
        except SkillsNotFound:
            targets_from = None   # procedures and worked examples only
        with embedded_client(**client_args(args, "task"), quantize=args.task_quantize,
                             max_workers=args.task_concurrency) as client:
            rows, counts = build_data(tokenizer, client, instances, seed_skills, targets_from, cfg,
                                      args.seed)
        if not rows:
            raise ValueError(f"no chat was built ({counts['left_out']} targets did not fit "
                             f"--max-skill-tokens {args.max_skill_tokens}: raise it)")
        write_run(out, args, argv, rows, script)
        kinds = {k: sum(r["target_kind"] == k for r in rows) for k in TARGET_KINDS}
        print(f"wrote {out / DATA_FILE}: {len(rows)} chats from {len(instances)} training "
              f"instances ({', '.join(f'{k} {n}' for k, n in kinds.items())}; {counts['left_out']} "
              f"targets left out: did not fit --max-skill-tokens {args.max_skill_tokens} or had no "
              "material)", flush=True)
    train_rows, val_rows = split_by_instance(rows, scfg.val_fraction, scfg.seed)
    max_length = args.context_tokens + args.max_skill_tokens
    train, val = encode_rows(tokenizer, train_rows, max_length), encode_rows(tokenizer, val_rows,
                                                                             max_length)
    summary = sft.train_sft(editor, tokenizer, train, out, scfg, val_examples=val, resume=resume,
                            log=lambda line: print(line, flush=True),
                            title="Editor cold start (SFT)")
    if summary["finished"]:
        print(f"the editor for train_grpo.py --editor: {out / 'final'}", flush=True)
    return 0 if summary["step"] > 0 or summary["finished"] or args.max_steps == 0 else 1


# ----------------------------------------------------------------------------------------- targets


def skill_md(name: str, description: str, body: str) -> str:
    """A SKILL.md reply in the form EDITOR_SYSTEM asks for."""
    return f"---\nname: {name}\ndescription: {' '.join(description.split())}\n---\n{body.strip()}"


def fit_skill(name: str, description: str, body: str, count_tokens, max_tokens: int) -> str | None:
    """skill_md(...) within max_tokens by count_tokens(text) (which counts the end-of-turn token
    too): the body cut from its end, a line at a time (a one-line paragraph a sentence at a time, a
    worked example "Q: ... A: ..." whole, as half of one would mislead); None when not even one
    sentence fits."""
    paragraphs = [p.strip() for p in body.strip().split("\n\n") if p.strip()]
    while paragraphs:
        text = skill_md(name, description, "\n\n".join(paragraphs))
        if count_tokens(text) <= max_tokens:
            return text
        lines = paragraphs[-1].split("\n")
        if paragraphs[-1].startswith("Q:"):
            shorter = ""
        elif len(lines) == 1:
            lines = re.split(r"(?<=[.!?])\s+", lines[0])
            shorter = " ".join(lines[:-1])
        else:
            shorter = "\n".join(lines[:-1])
        paragraphs = paragraphs[:-1] + ([shorter] if shorter.strip() else [])
    return None


def _base_parts(skills, task_type: str) -> tuple[list, str]:
    """(the type's hand-written skills, the general skills' rules as one paragraph) of a SkillSet
    (or ([], ""))."""
    if skills is None:
        return [], ""
    general = "\n".join(s.body.strip() for s in skills.general if s.body.strip())
    mistakes = "\n".join(f"Avoid: {m}" for m in skills.common_mistakes)
    return list(skills.task_specific.get(task_type, [])), "\n".join(p for p in (general, mistakes)
                                                                    if p)


def worked_answer(reply: str, task=None) -> str | None:
    """The answer line a worked example shows for `reply`, a reply that scored 1 on `task`: the
    first of its first line, the whole reply, and the reply up to its last full sentence (each on
    one line) that ends a sentence, is at most MAX_WORKED_REPLY_CHARS long and still scores 1 by the
    task's verifier (a reply cut off at --task-max-tokens, or a long one, would teach rambling);
    None when none is."""
    lines = [" ".join(line.split()) for line in reply.splitlines() if line.strip()]
    whole = " ".join(reply.split())
    sentences = re.match(r"^(.*[.!?])(?:\s|$)", whole)
    for text in dict.fromkeys(lines[:1] + [whole] + ([sentences.group(1)] if sentences else [])):
        if text.endswith((".", "!", "?")) and len(text) <= MAX_WORKED_REPLY_CHARS and \
                (task is None or task.score(text) >= 1.0):
            return text
    return None


def worked_examples(prompt_text: str, history: list[HistoryEntry],
                    tasks=()) -> list[tuple[str, str]]:
    """(question, answer line) of the outcomes with reward 1 that the prompt's history shows (the
    first OUTCOMES_SHOWN lines of each entry the prompt kept, recognised by their outcome line),
    each question once, newest entry first; the answer line is `worked_answer`'s (`tasks`: the
    instance's, to re-check a shortened reply)."""
    by_question = {" ".join(t.question.split()): t for t in tasks}
    seen, pairs = set(), []
    for entry in reversed(history):
        for o in entry.outcomes[:OUTCOMES_SHOWN]:
            question = " ".join(o.question.split())
            if o.reward < 1.0 or question in seen or o.reply.startswith(
                "error:") or outcome_line(o) not in prompt_text:
                continue
            answer = worked_answer(o.reply, by_question.get(question))
            if answer is not None:
                seen.add(question)
                pairs.append((question, answer))
    return pairs


def make_targets(task_type: str, skills, prompt_text: str, history: list[HistoryEntry],
                 count_tokens,
                 max_tokens: int, tasks=()) -> list[tuple[str, str]]:
    """(kind, SKILL.md text) targets for a prompt (module docstring), each within max_tokens and
    parsed by loop.parse_candidate, no two alike; kinds whose text does not fit or parse are left
    out."""
    own, rules = _base_parts(skills, task_type)
    slug = slugify(task_type, fallback="task")
    drafts = []
    if own:
        top = own[0]
        body = "\n\n".join(s.body.strip() for s in own)
        drafts.append(("base", top.name, top.description,
                       "\n\n".join(p for p in (rules, body) if p)))
        drafts.append(("base-reordered", top.name, top.description,
                       "\n\n".join(p for p in (body, rules) if p)))
        paragraphs = [p for p in top.body.strip().split("\n\n") if p.strip()]
        examples = [p for p in paragraphs if p.lstrip().startswith("Q:")]
        facts = [p for p in paragraphs if not p.lstrip().startswith("Q:")]
        short = facts + examples[:1] + ([rules] if rules else [])
        drafts.append(("base-short", top.name, top.description, "\n\n".join(short)))
    steps = PROCEDURES.get(task_type, GENERIC_PROCEDURE)
    procedure = "\n".join(f"{i}. {step}" for i, step in enumerate(steps, start=1))
    facts = "\n".join(PROCEDURE_FACTS.get(task_type, []))
    drafts.append(("procedure", f"{slug}-steps", f"Steps to follow for {task_type} tasks.",
                   "\n\n".join(p for p in (procedure, facts, rules) if p)))
    pairs = worked_examples(prompt_text, history, tasks)
    if pairs:
        shots = "\n\n".join(f"Q: {q}\nA: {a}" for q, a in pairs)
        drafts.append(("worked", f"{slug}-worked-examples",
                       f"Worked examples of {task_type} tasks solved right.",
                       "\n\n".join(p for p in (rules, shots) if p)))
    targets = []
    for kind, name, description, body in drafts:
        text = fit_skill(name, description, body, count_tokens, max_tokens)
        if text is not None and parse_candidate(text, task_type)[0] is not None and \
                text not in (t for _, t in targets):   # shortening can make two kinds one text:
                                                       # kept once
            targets.append((kind, text))
    return targets


# ----------------------------------------------------------------------------------------- the data


def build_data(tokenizer, client, instances: list[Instance], seed_skills, targets_from,
               cfg: EvolveConfig,
               seed: int = 0, log=print) -> tuple[list[dict], dict]:
    """The SFT chats of every instance (module docstring) and counts {"chats", "left_out"}.
    seed_skills: what --seed-skills loaded (rollout.load_skills); targets_from: the SkillSet the
    base targets come from (or None)."""
    def count_prompt(messages):   # as loop.evolve_batch counts the editor's prompt
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def count_reply(text):        # the reply and the token that ends it: what the sampler must emit
        return len(tokenizer.encode(text.strip())) + 1

    seeds = [step_seed(seed, 0, j) for j in range(len(instances))]
    seed_texts = [skill_text(seed_skills, x.type) for x in instances]
    scored = score_skills(client, list(zip(instances, seed_texts, seeds)), cfg)
    rows, left_out = [], 0

    def add(x, generation, messages, history):
        nonlocal left_out
        # an episode's last reply is no worked example
        shown = [] if any(t.multi_turn for t in x.tasks) else history
        found = make_targets(x.type, targets_from, messages[-1]["content"], shown, count_reply,
                             cfg.max_skill_tokens,
                             x.tasks)
        left_out += len(TARGET_KINDS) - len(found)
        for kind, text in found:
            rows.append({"instance": x.id, "type": x.type, "generation": generation,
                         "target_kind": kind,
                         "messages": messages, "target": text})
        return found

    for x, s0, seed_j, (r0, outcomes0) in zip(instances, seed_texts, seeds, scored):
        history = [HistoryEntry(0, s0, r0, outcomes0)]
        messages = editor_messages(x, s0, r0, history, count_prompt, cfg.context_tokens)
        found = add(x, 1, messages, history)
        # generation 2: the generation-1 targets scored as candidates would be, the best carried if
        # it beats s_0
        skills = [parse_candidate(text, x.type)[0] for _, text in found]
        results = score_skills(client, [(x, s, seed_j) for s in skills], cfg)
        history += [HistoryEntry(1, s, r, outcomes) for s, (r, outcomes) in zip(skills, results)]
        current, current_r = s0, r0
        if results:
            best = max(range(len(results)), key=lambda i: (results[i][0], -i))
            if results[best][0] > r0:
                current, current_r = skills[best], results[best][0]
        messages = editor_messages(x, current, current_r, history, count_prompt, cfg.context_tokens)
        add(x, 2, messages, history)
        log(f"cold start: {x.id}: seed reward {r0:.2f}, generation-1 targets "
            f"{' '.join(f'{k}={r:.2f}' for (k, _), (r, _) in zip(found, results))}")
    return rows, {"chats": len(rows), "left_out": left_out}


def split_by_instance(rows: list[dict], val_fraction: float, seed: int) -> tuple[list[dict],
                                                                                 list[dict]]:
    """(train, validation) chats: whole instances go to validation (sft.split_records over the
    instance ids)."""
    ids = list(dict.fromkeys(r["instance"] for r in rows))
    _, val_ids = sft.split_records(ids, val_fraction, seed)
    return [r for r in rows if r["instance"] not in val_ids], [r for r in rows
                                                               if r["instance"] in val_ids]


def encode_rows(tokenizer, rows: list[dict], max_length: int) -> list[sft.Example]:
    eot = sft.end_of_turn_id(tokenizer)
    examples = [sft.encode_chat(tokenizer, r["messages"], r["target"], max_length, "skip", eot)
                for r in rows]
    return [e for e in examples if e is not None]


def read_data(path: Path) -> list[dict]:
    """OUT/sft_data.jsonl of an earlier run (--resume, --data); a line that is not such a chat, or
    that holds a string no tokenizer takes (a lone surrogate), is a ValueError naming FILE:LINE."""
    rows = []
    for n, row in read_jsonl(path):
        if not (isinstance(row, dict) and isinstance(row.get("messages"), list)
                and isinstance(row.get("target"), str)
                and isinstance(row.get("instance"), str)):
            raise ValueError(
                f"{path}:{n}: not a cold-start chat (needs instance, messages, target)")
        if (where := lone_surrogate_at(row)) is not None:
            raise ValueError(f"{path}:{n}: {where} is not Unicode text (a lone surrogate: a "
                             f"\\ud800-\\udfff escape without its pair)")
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------- command line


def parse_args(argv=None) -> argparse.Namespace:
    # train_grpo.py's defaults
    d, s = argparse.Namespace(**DEFAULTS, **vars(EvolveConfig())), SFT_DEFAULTS
    p = argparse.ArgumentParser(prog="python -m minskill.skill_r1.cold_start",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="How the data are built: docs/skill-r1.md (Cold start). "
                                       "Writes OUT/sft_data.jsonl, OUT/checkpoint-STEP/, "
                                "OUT/final/ (the editor for train_grpo.py --editor), "
                                "OUT/metrics.jsonl, OUT/loss.svg.")
    m = p.add_argument_group("main options")
    c = p.add_argument_group("the prompts and the task model (train_grpo.py's flags of the same "
                             "names)")
    t = p.add_argument_group("training (minskill.sft; defaults: SFTConfig's, but --micro-batch 4 "
                             "and --share-prompts)")
    m.add_argument("--editor", default=d.editor,
                   help="the editor to fine-tune: an HF model folder or smollm2-135m "
                   "(default)")
    m.add_argument("--suite", default=d.suite,
                   help="task suite: qa | household | webwalk | webshop | searchqa | "
                   "PATH.jsonl (default %(default)s); only its training split is read")
    m.add_argument("--out", required=True, help="output folder")
    add_task_model_args(c, concurrency=16, max_tokens=d.task_max_tokens, quantize=d.task_quantize,
                        main=m)
    c.add_argument("--n-tasks", type=int, default=None,
                   help="training tasks drawn from the suite (default: the "
                   "suite's own)")
    c.add_argument("--seed-skills", default=d.seed_skills,
                   help="the seed skill s_0 of the prompts: none (default), "
                   "base, a skill-set folder, a MASA .json, or a text file")
    c.add_argument("--tasks-per-instance", type=int, default=d.tasks_per_instance,
                   help="tasks of one type forming one instance (default %(default)s)")
    c.add_argument("--max-instances", type=int, default=None,
                   help="use only the first N training instances "
                   "(default: all)")
    c.add_argument("--max-skill-tokens", type=int, default=d.max_skill_tokens,
                   help="longest target reply, in the "
                   "editor's tokens with its end-of-turn token (default %(default)s; use the value "
                   "GRPO will run with)")
    c.add_argument("--context-tokens", type=int, default=d.context_tokens,
                   help="the editor's prompt budget "
                   "(default %(default)s)")
    c.add_argument("-n", "--rollouts", type=int, default=d.rollouts,
                   help="task-model rollouts per skill and task")
    c.add_argument("--task-temperature", type=float, default=d.task_temperature,
                   help="(default 0 = greedy)")
    sft.add_sft_arguments(t, s, unit="chats", held_out="instances",
                          max_steps_help="stop after N optimizer steps (continue with --resume; "
                                         "0: build the data only)")
    t.add_argument("--share-prompts", action=argparse.BooleanOptionalAction,
                   default=s.share_prompts,
                   help="train a prompt's targets together, the prompt computed once per "
                   "micro-batch (the same loss and gradient, ~2.3x fewer tokens on qa; the epoch "
                   "order then shuffles prompts; default on)")
    add_device_args(t, what="the editor and the embedded task model run")
    m.add_argument("--seed", type=int, default=d.seed,
                   help="seeds the suite, the rollouts, the data order")
    m.add_argument("--resume", action="store_true",
                   help="continue the run in OUT on its saved OUT/sft_data.jsonl, from "
                   "its latest checkpoint (none yet: from step 0), with its saved flags (a "
                   "differing one is refused, except where and how fast it runs)")
    m.add_argument("--overwrite", action="store_true",
                   help="replace the run a non-empty --out holds")
    m.add_argument("--data", default=None,
                   help="train on the chats of this sft_data.jsonl (an earlier run's, "
                   "e.g. to try another --lr on the same data) instead of building them: no "
                   "task-model call; give the --context-tokens and --max-skill-tokens it was built "
                   "with")
    args = p.parse_args(argv)
    if args.resume:
        restore_flags(p, args, given_flags(p, argv))
    for name in ("tasks_per_instance", "max_skill_tokens", "context_tokens", "rollouts",
                 "task_max_tokens",
                 "batch_size", "micro_batch", "save_every", "keep_checkpoints"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_instances is not None and args.max_instances < 1:
        p.error("--max-instances must be at least 1")
    if args.max_steps is not None and args.max_steps < 0:
        p.error("--max-steps must be at least 0")
    if args.data is not None and not args.resume and not Path(args.data).is_file():
        p.error(f"--data {args.data}: no such file")
    if args.batch_size % args.micro_batch:
        p.error(f"--batch-size {args.batch_size} must be a multiple of --micro-batch "
                f"{args.micro_batch}")
    if args.lr <= 0 or args.epochs <= 0 or not 0 <= args.warmup_ratio < 1 or \
            not 0 <= args.val_fraction < 1:
        p.error("need --lr > 0, --epochs > 0, 0 <= --warmup-ratio < 1 and 0 <= --val-fraction < 1")
    resolve_bf16(args)
    return args


def restore_flags(parser: argparse.ArgumentParser, args, given: set[str]) -> None:
    """--resume: the flags of OUT/run_config.json (of the run's marker, when it stopped before
    writing that: minskill.runs.started_flags) where none is given (minskill.runs.resume_flags); a
    given flag outside RESUME_MAY_CHANGE that differs is refused, and so is a saved value its flag
    could not take. A folder without either holds nothing to resume: `run` says so."""
    path = Path(args.out) / RUN_CONFIG
    if path.is_file():
        saved = check_shape(read_json(path, f"--resume: {path}"), {"args": dict},
                            f"--resume: {path}")["args"]
    elif started_flags(args.out, "cold_start") is not None:
        saved, path = started_flags(args.out, "cold_start"), Path(args.out) / RUN_MARKER
    else:
        return
    resume_flags(args, saved, given, RESUME_MAY_CHANGE, "cold_start", parser=parser,
                 source=str(path))


def sft_config(args) -> sft.SFTConfig:
    return sft.config_from_args(args, max_length=args.context_tokens + args.max_skill_tokens,
                                share_prompts=args.share_prompts)


def evolve_config(args) -> EvolveConfig:
    return EvolveConfig(rollouts=args.rollouts, max_skill_tokens=args.max_skill_tokens,
                        context_tokens=args.context_tokens, task_max_tokens=args.task_max_tokens,
                        task_temperature=args.task_temperature)


def write_run(out: Path, args, argv: list[str], rows: list[dict], script: str) -> None:
    """Open OUT (minskill.runs) and write the flags (OUT/run_config.json and its marker, for
    --resume) and the chats, atomically. A run started again by --resume opens OUT as it stands
    (nothing in it is deleted)."""
    open_run_folder(out, args.resume, args.overwrite, script, settings=vars(args))
    write_text_atomic(out / RUN_CONFIG,
                      json.dumps({"command": "python -m minskill.skill_r1.cold_start " +
                                                     " ".join(argv), "args": vars(args)}, indent=2)
                      + "\n")
    write_jsonl_atomic(out / DATA_FILE, rows)


if __name__ == "__main__":
    sys.exit(main())
