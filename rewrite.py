#!/usr/bin/env python
"""MASA stage 2: train the skill *rewriter* by SFT, then adapt a skill set to a target model
in one pass.

    python rewrite.py train runs/masa/sft_records.jsonl --out runs/rewriter
    python rewrite.py apply --rewriter runs/rewriter --model-card smollm2-135m --skills base \\
        --suite qa --task qa --out runs/adapted-skills
    python rewrite.py apply ... --compare --suite qa --n-tasks 100   # input, rewritten, one-shot

The rewriter, a small minskill LM, reads (the target's model card, input skills S_in, task
description d) and writes S*_F, what the stage-1 search (evolve_masa.py) found by many rollouts,
with none: train minimises L(θ) = −(1/|T|) Σ_{t∈T} log p_θ(y_t | y_<t, x) over the tokens of S*_F
(minskill/sft.py). The commands' flags and outputs: docs/rewriter.md. Decisions:

1. train's defaults are the MASA paper's recipe (SFTConfig); --lora-rank R trains LoRA adapters.
2. apply writes the skills only once they parse and validate (else OUT.raw.txt, nothing else).
3. apply --model-card RUN --task SUITE gives the card and task description the SFT records hold.
4. --compare scores input, rewritten and the teacher's one-shot rewrite (DS-Adapter) with λ_nh the
   search's, on the task model, and prints one table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minskill import distributed, sft
from minskill.cli import add_task_model_args, add_teacher_args, client_args, with_extra_body
from minskill.device import (add_device_args, check_resumed_device, is_cuda, resolve_bf16,
                             set_up_device)
from minskill.files import check_shape, read_json, write_text_atomic
from minskill.masa.data import task_description
from minskill.masa.rewriter import (load_model_card, parse_rewriter_output, resolve_rewriter,
                                    rewrite_with_model, save_skills_validated)
from minskill.masa.search import MasaConfig
from minskill.masa.rewriter_sft import encode_records, read_records
from minskill.masa.teacher import one_shot_rewrite
from minskill.nn.lora import BASE_DTYPES, add_lora_arguments, apply_lora, lora_settings
from minskill.nn.weights import load_model, resolve_model
from minskill.retrieval import (add_retrieval_args, check_retrieval_args, retriever_from_args,
                                with_retrieval)
from minskill.rollout import all_failed, load_skills, run_rollouts, summarize
from minskill.runs import (RUN_MARKER, check_run_folder, given_flags, open_run_folder, restart_note,
                           resume_flags, started_flags)
from minskill.serve.client import ChatClient, ChatError, usage_delta
from minskill.serve.embedded import embedded_client
from minskill.skillsets import SkillSet, check_replaceable
from minskill.tasks import load_suite


@dataclass(frozen=True)
class ApplyConfig:
    """`rewrite.py apply`'s defaults, the only place they are written (argparse reads them;
    `train`'s are minskill.sft.SFTConfig's). λ_nh is the search's (MasaConfig), so --compare scores
    the R it optimised."""
    max_new_tokens: int = 1536       # the rewriter's reply budget
    temperature: float = 0.0         # greedy
    seed: int = 0
    dtype: str | None = None         # the rewriter's weights: None = bfloat16 on CUDA, else float32
    compile_decode: bool = False     # decode with nn/compiled_decode.py (opt-in)
    json_schema: str = "on"          # the reply under the skill-set schema (masa/rewriter.py)
    split: str = "heldout"
    task_seed: int = 0
    task_concurrency: int = 8
    task_max_tokens: int = 256
    teacher_retries: int = 2
    timeout: float = 600.0           # seconds a task-model or teacher reply may take (--compare)
    model_spec: str = "smollm2-135m"
    lam_nh: float = MasaConfig.lam_nh


# --resume (minskill.runs.resume_flags): the flags that may change, the SFTConfig fields of
# sft.RUN_SETTINGS (how fast or how often, not what is learned; --micro-batch and
# --grad-checkpointing name two of them), the device, and the data files' paths (the records are
# checked apart: sft.train_sft refuses other training data)
RESUME_MAY_CHANGE = (*({"micro_batch_size": "micro_batch",
                        "gradient_checkpointing": "grad_checkpointing"}.get(k, k)
                       for k in sft.RUN_SETTINGS), "device", "data", "val_file")
NOT_FLAGS = ("func", "argv", "command")   # what main adds to the parsed flags


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    if args.command != "train" and distributed.requested() > 1:
        print(f"rewrite.py {args.command}: runs in one process (python, not torchrun; only train "
              f"is data-parallel)", file=sys.stderr)
        return 1
    try:
        if args.command == "train":
            distributed.init()   # torchrun: data-parallel SFT (minskill.distributed)
        if args.command == "train" and args.resume:
            restore_train_flags(parser, args, argv)
        set_up_device(args.device)   # TF32 on CUDA (docs/gpu.md)
        return args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"rewrite.py {args.command}: {e}", file=sys.stderr)
        return 1


# --------------------------------------------------------------------------------------------------
# train

def cmd_train(args) -> int:
    if not args.data:
        raise ValueError("the data (JSONL files of SFT records) are required, except with --resume")
    resolve_bf16(args)      # --bf16's default: on for CUDA, off for the CPU
    cfg = sft.config_from_args(args, max_length=args.max_length, too_long=args.too_long,
                               chunk_tokens=args.chunk_tokens, log_every=args.log_every)
    lora = lora_settings(args)      # before anything is read: a bad --lora-* flag is a ValueError
    if distributed.is_main():   # torchrun: rank 0 alone checks and writes the run folder (the
        check_run_folder(args.out, bool(args.resume), args.overwrite,   # others would see its
                         "rewrite.py train")                            # writes)
    resume = False if not args.resume else (True if args.resume == "latest" else args.resume)
    if resume:
        with distributed.main_first():   # rank 0 first puts back a checkpoint a kill left aside
            restart = resume is True and not sft.checkpoints(args.out) and \
                started_flags(args.out, "rewrite.py train") is not None   # killed before one
            if not restart:   # nothing to resume: refused before anything loads or is written
                sft.resume_candidates(args.out, resume)
        if restart:
            print(restart_note(args.out), flush=True)
            resume = False

    def warn(message):
        if distributed.is_main():
            print(message, file=sys.stderr, flush=True)
    records, problems = read_records(args.data, warn=warn)
    if args.val_file:
        val_records, val_problems = read_records([args.val_file], warn=warn)   # one file
        problems += val_problems
        train_records = records
    else:
        train_records, val_records = sft.split_records(records, cfg.val_fraction, cfg.seed)
    if not train_records:
        print(f"rewrite.py train: no usable records in {', '.join(args.data)} "
              f"({len(problems)} malformed lines)", file=sys.stderr)
        return 1

    base = resolve_model(args.base_model)
    model, tokenizer = load_model(str(base), dtype=BASE_DTYPES[args.lora_base_dtype],
                                  device=args.device)
    if lora is not None:   # the base frozen, float32 adapters trained; every checkpoint: merged +
        apply_lora(model, lora.rank, lora.alpha, lora.dropout, lora.targets,   # adapter/
                   seed=args.seed, base_model_name_or_path=str(Path(base).resolve()))
    train, train_counts = encode_records(tokenizer, train_records, cfg.max_length, cfg.too_long)
    val, val_counts = encode_records(tokenizer, val_records, cfg.max_length, cfg.too_long)
    too_long = train_counts["skipped_too_long"] + val_counts["skipped_too_long"]
    truncated = train_counts["truncated"] + val_counts["truncated"]
    print(f"data: {len(records) + (len(val_records) if args.val_file else 0)} records read, "
          f"{len(problems)} malformed lines skipped, {too_long} longer than {cfg.max_length} "
          f"tokens skipped, {truncated} truncated -> {len(train)} train / {len(val)} validation "
          f"examples", flush=True)
    out = Path(args.out)
    if distributed.is_main():
        folder = open_run_folder(out, bool(args.resume), args.overwrite, "rewrite.py train",
                                 settings=run_flags(args))
        write_run_config(args, cfg, folder, records, problems, train, val, too_long, truncated)
    summary = sft.train_sft(model, tokenizer, train, out, cfg, val_examples=val, resume=resume,
                            log=lambda line: print(line, flush=True), title="Rewriter SFT")
    distributed.close()
    return 0 if summary["step"] > 0 or summary["finished"] else 1


def restore_train_flags(parser: argparse.ArgumentParser, args, argv: list[str]) -> None:
    """`train --resume`: the flags saved in run_config.json of the checkpoint's run folder, where
    `argv` gives none (the resume policy, minskill.runs.resume_flags; a given flag outside
    RESUME_MAY_CHANGE that differs is refused, and so is a saved value its flag could not take). A
    run killed before it wrote run_config.json has its flags in its marker
    (minskill.runs.started_flags); a folder without either holds nothing to resume: cmd_train says
    so."""
    folder = Path(args.out) if args.resume == "latest" else Path(args.resume).parent
    path = folder / "run_config.json"
    if path.is_file():
        config = read_json(path, f"--resume: {path}")
        saved = check_shape(config, {"args": dict}, f"--resume: {path}")["args"]
    elif args.resume == "latest" and started_flags(folder, "rewrite.py train") is not None:
        saved, path = started_flags(folder, "rewrite.py train"), folder / RUN_MARKER
    else:
        return
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    resume_flags(args, saved, given_flags(parser, argv), RESUME_MAY_CHANGE, "rewrite.py train",
                 parser=commands.choices["train"], source=str(path))
    check_resumed_device(parser, args)


def run_flags(args) -> dict:
    """The flags a run saves (run_config.json, its marker) for --resume to restore."""
    return {k: v for k, v in vars(args).items() if k not in NOT_FLAGS}


def write_run_config(args, cfg, out: Path, records, problems, train, val, too_long: int,
                     truncated: int) -> None:
    """OUT/run_config.json: the command, the data and their counts, the flags (what --resume
    restores)."""
    lora = {
        k: getattr(args, k)
        for k in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_base_dtype")
    }
    counts = {"records": len(records), "malformed_lines": len(problems),
              "too_long_skipped": too_long, "truncated": truncated, "train": len(train),
              "validation": len(val)}
    write_text_atomic(out / "run_config.json", json.dumps(
        {"command": "python rewrite.py " + " ".join(args.argv), "data": args.data,
         "val_file": args.val_file, "args": run_flags(args),   # what --resume restores
         "base_model": args.base_model,
         "config": vars(cfg) | {"adam_betas": list(cfg.adam_betas)},
         "lora": lora, "data_counts": counts}, indent=2) + "\n")


# --------------------------------------------------------------------------------------------------
# apply

def cmd_apply(args) -> int:
    check_retrieval_args(args)   # bad --retrieve flags: refused before the rewriter runs
    if args.compare:             # an earlier comparison is not replaced without --overwrite
        check_run_folder(compare_folder(args), False, args.overwrite,
                         "rewrite.py apply --compare", resumable=False)
    out = Path(args.out)
    if not args.timeout > 0:   # (refused before the rewriter's pass, not after it)
        print(f"rewrite.py apply: --timeout must be > 0 seconds, got {args.timeout}",
              file=sys.stderr)
        return 1
    if args.compile_decode and args.json_schema == "on":
        print("rewrite.py apply: --compile-decode decodes free text: add --json-schema off",
              file=sys.stderr)
        return 1
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        print(f"rewrite.py apply: --out {out} exists and is not empty (pass --overwrite)",
              file=sys.stderr)
        return 1
    # --overwrite replaces only a skill set (SkillSet.save's rule), checked before the model runs
    check_replaceable(out)
    card = load_model_card(args.model_card)
    given_card = Path(args.model_card).is_file() or \
        (Path(args.model_card) / "model_card.json").is_file()
    if not given_card and not card["strengths"] and not card["weaknesses"]:   # from a model spec
        print(f"rewrite.py apply: note: the card of {args.model_card} has no strengths or "
              f"weaknesses; the SFT records of evolve_masa.py hold the teacher's (give its run "
              f"folder or model_card.json as --model-card for the card the rewriter was trained "
              f"with)", file=sys.stderr)
    args.task = task_description(args.task, args.task_seed)   # a suite's name: its records' text
    skills = load_input_skills(args.skills, args.suite)
    args.dtype = args.dtype or ("bfloat16" if is_cuda(args.device) else "float32")   # ApplyConfig
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    rewriter_path = resolve_rewriter(args.rewriter)
    model, tokenizer = load_model(rewriter_path, dtype=dtype, device=args.device)
    model.eval()
    started = time.perf_counter()
    text, finish_reason = rewrite_with_model(model, tokenizer, card, skills, args.task,
                                             args.max_new_tokens, args.temperature, args.seed,
                                             args.compile_decode, args.json_schema == "on")
    rewriter_cost = {"calls": 1, "completion_tokens": len(tokenizer.encode(text)),
                     "wall_seconds": time.perf_counter() - started, "finish_reason": finish_reason}
    print(f"rewriter {rewriter_path} ({args.device}, {args.dtype}): "
          f"{rewriter_cost['completion_tokens']} tokens in {rewriter_cost['wall_seconds']:.1f}s "
          f"(finish: {finish_reason})", file=sys.stderr)
    del model
    raw_path = out.parent / f"{out.name}.raw.txt"
    rewritten = None
    try:
        rewritten = save_skills_validated(
            parse_rewriter_output(text, finish_reason).carry_resources(skills), out)
    except ValueError as e:
        write_text_atomic(raw_path, text)
        print(f"rewrite.py apply: the rewriter's output does not parse as a skill set: {e}\n"
              f"  raw output saved to {raw_path}; nothing was written to {out}", file=sys.stderr)
        if not args.compare:
            return 2
    else:
        n_task = sum(len(v) for v in rewritten.task_specific.values())
        print(f"wrote {len(rewritten.general)} general + {n_task} task-specific skills and "
              f"{len(rewritten.common_mistakes)} common mistakes to {out}")
    if args.compare:
        return compare(args, card, skills, rewritten, rewriter_cost)
    return 0


def compare(args, card: dict, skills, rewritten, rewriter_cost: dict | None = None) -> int:
    """Evaluate input, rewritten and teacher one-shot skills on the suite; print one table.
    compare.json records the cost per role: the task model's and the teacher's calls, tokens and
    seconds (client.Usage, measured apart also when one endpoint serves both: the two phases run one
    after the other) and the rewriter's generated tokens and seconds (`rewriter_cost`, from
    cmd_apply; a local model: no call over HTTP)."""
    if not args.suite:
        print("rewrite.py apply --compare needs --suite", file=sys.stderr)
        return 1
    tasks = load_suite(args.suite, split=args.split, seed=args.task_seed,
                       n=args.n_tasks)   # a name or a .jsonl
    report_dir = open_run_folder(compare_folder(args), False, args.overwrite,
                                 "rewrite.py apply --compare")

    def log(message):
        print(message, file=sys.stderr, flush=True)
    with embedded_client(**client_args(args, "task"), model_spec=args.model_spec,
                         quantize=args.task_quantize, timeout=args.timeout,
                         max_workers=args.task_concurrency) as task_client:
        if args.teacher_url:
            teacher_client = ChatClient(args.teacher_url, model=args.teacher_model,
                                        api_key=args.teacher_api_key, timeout=args.timeout,
                                        extra_body=args.teacher_extra_body)
        else:   # one embedded server (or the --task-url one) serves both
            teacher_client = with_extra_body(task_client, args.teacher_extra_body)
        costs, (u0, t0) = {"rewriter": rewriter_cost}, (teacher_client.usage, time.perf_counter())
        notes = {"rewritten": "did not parse (raw text saved)",
                 "teacher one-shot": "did not parse (raw text saved)"}
        try:
            teacher, teacher_raw = teacher_oneshot_rewrite(teacher_client, card, skills, args.task,
                                                           retries=args.teacher_retries,
                                                           max_tokens=args.max_new_tokens,
                                                           seed=args.seed,
                                                           json_schema=args.teacher_json_schema)
        except ChatError as error:   # the baseline's row says so; the other rows are still scored
            teacher, teacher_raw = None, None
            notes["teacher one-shot"] = "no reply from the teacher (stderr says why)"
            log(f"teacher one-shot rewrite: no reply: {error} (a slow teacher: raise --timeout)")
        costs["teacher (one-shot)"] = {**usage_delta(teacher_client.usage, u0),
                                       "wall_seconds": time.perf_counter() - t0}
        if teacher is not None:
            save_skills_validated(teacher, report_dir / "teacher_oneshot")
        elif teacher_raw is not None:
            write_text_atomic(report_dir / "teacher_oneshot.raw.txt", teacher_raw)
            log(f"teacher one-shot rewrite: no parseable reply in {args.teacher_retries + 1} "
                f"attempts (last reply saved to {report_dir / 'teacher_oneshot.raw.txt'})")
        rows, results = [], {}
        u0, t0 = task_client.usage, time.perf_counter()
        retriever = retriever_from_args(args, task_client, args.task_api_key)   # None: none
        for name, variant in (("input", skills), ("rewritten", rewritten),
                              ("teacher one-shot", teacher)):
            if variant is None:
                rows.append((name, None, notes[name]))
                continue
            log(f"evaluating '{name}' skills on {len(tasks)} {args.suite}/{args.split} tasks")
            out_path = report_dir / f"trajectories-{name.replace(' ', '_')}.jsonl"
            trajectories = run_rollouts(task_client, tasks, with_retrieval(variant, retriever),
                                        n=1, temperature=0.0, max_tokens=args.task_max_tokens,
                                        seed=args.seed, out_path=out_path)
            failed = all_failed(trajectories)
            if failed:   # a table of 0s would hide it: stop, the trajectories kept in the folder
                log(f"error: the '{name}' skills were not scored: {failed}\n(their trajectories "
                    f"are in {report_dir}; once the task model answers, rerun with --overwrite)")
                return 1
            summary = summarize(trajectories, lam_nh=args.lam_nh)
            rows.append((name, summary, ""))
            results[name] = summary
        costs["task model"] = {**usage_delta(task_client.usage, u0),
                               "wall_seconds": time.perf_counter() - t0}
    table = _table(rows)
    write_text_atomic(report_dir / "compare.json", json.dumps(
        {"suite": args.suite, "split": args.split, "n_tasks": len(tasks),
         "task_url": args.task_url,
         "task_model": args.task_model or (None if args.task_url else args.model_spec),
         "rewriter": args.rewriter, "task": args.task, "results": results, "table": table,
         "costs": costs}, indent=2) + "\n")
    print(table)
    print(f"\n(details in {report_dir})")
    return 0


def teacher_oneshot_rewrite(client, card: dict, skills, task: str, retries: int = 2,
                            max_tokens: int = 1536, seed: int = 0, json_schema: str = "auto"):
    """The DS-Adapter baseline: the teacher adapts S_in to the target once, from the same card,
    skills and task, without search (minskill.masa.teacher.one_shot_rewrite). Returns (SkillSet or
    None, last raw reply)."""
    skipped = {}
    result = one_shot_rewrite(client, card, skills, task, retries=retries, max_tokens=max_tokens,
                              seed=seed, on_skip=skipped.update, json_schema=json_schema)
    return result, skipped.get("last_reply", "")


def load_input_skills(spec: str, suite: str | None):
    """--skills: an Agent Skills folder, a MASA .json, or 'base' (the suite's hand-written base
    skills)."""
    if spec.lower() == "base":
        if not suite:
            raise ValueError("--skills base needs --suite (whose base skills to use)")
        skills = load_skills("base", suite)
    else:
        path = Path(spec)
        if not path.exists():
            raise FileNotFoundError(f"--skills {spec}: no such folder or file")
        skills = SkillSet.load(path)
    if not isinstance(skills, SkillSet):
        raise ValueError(f"--skills {spec}: expected a skill set, got {type(skills).__name__}")
    return skills


def compare_folder(args) -> Path:
    """Where --compare writes (a run folder: refused when it holds anything, unless --overwrite)."""
    return Path(args.compare_out or f"{args.out}-compare")


def _table(rows: list[tuple[str, dict | None, str]]) -> str:
    """One Markdown table: a row per skill variant, with per-task-type success columns; errors: the
    rollouts that ended with an error (no reply from the task model), counted as failed in
    success."""
    types = sorted({t for _, s, _ in rows if s for t in s["per_type"]})
    head = ("| skills | n | success | 95% CI | NHR | adjusted R | mean steps | errors | "
            + "".join(f"{t} | " for t in types))
    lines = [head.rstrip(), "|" + "---|" * (8 + len(types))]
    for name, s, note in rows:
        if s is None:
            lines.append(f"| {name} | – | {note} |" + " |" * (5 + len(types)))   # 8 + types columns
            continue
        lo, hi = s["success_ci95"]
        per_type = "".join(f" {s['per_type'][t]['success_rate']:.2f} |" if t in s["per_type"]
                           else " – |" for t in types)
        lines.append(f"| {name} | {s['n']} | {s['success_rate']:.2f} | {lo:.2f}–{hi:.2f} | "
                     f"{s['nhr']:.2f} | {s['adjusted_reward']:.2f} | {s['mean_steps']:.1f} | "
                     f"{s['errors']} |{per_type}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The command line

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rewrite.py", description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `python rewrite.py train --help` or `python rewrite.py apply --help` for the "
               "options.")
    commands = parser.add_subparsers(dest="command", required=True)
    d = sft.SFTConfig()     # the paper's recipe = the defaults

    t = commands.add_parser(
        "train", help="SFT the rewriter on JSONL records from evolve_masa.py",
        description="Train the rewriter by SFT: loss on the target skill set's tokens only. The "
                    "defaults are the MASA paper's recipe (AdamW lr 1e-5, cosine, warmup 0.1, "
                    "effective batch 4, 5 epochs, max length 4096). Writes OUT/checkpoint-STEP/ "
                    "(resumable), OUT/final/ (HF folder), OUT/metrics.jsonl and OUT/loss.svg. "
                    "Malformed lines are reported as FILE:LINE and skipped.",
        epilog="record format (one JSON object per line): {\"model_card\": {...}, \"skills_in\": "
               "<MASA JSON>, \"task_description\": \"...\", \"skills_out\": <MASA JSON>, ...other "
               "fields ignored}")
    tm = t.add_argument_group("main options")
    to = t.add_argument_group("training")
    tm.add_argument("data", nargs="*", help="JSONL file(s) of SFT records (several runs/targets "
                    "may be given; --resume: the saved run's)")
    tm.add_argument("--out", required=True, help="output folder")
    tm.add_argument("--base-model", default="smollm2-135m",
                    help="model to fine-tune: HF folder or smollm2-135m (default)")
    to.add_argument("--val-file", default=None,
                    help="held-out records (default: --val-fraction of the data)")
    sft.add_sft_arguments(to, d, unit="records", held_out="records", main=tm,
                          max_steps_help="stop after N optimizer steps (resume later)")
    to.add_argument("--max-length", type=int, default=d.max_length,
                    help=f"max tokens per record (default {d.max_length})")
    to.add_argument("--too-long", choices=("skip", "truncate"), default=d.too_long,
                    help="what to do with longer records (default skip; both are counted)")
    to.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (weights and optimizer stay float32; default: on for "
                         "CUDA, off for the CPU)")
    add_lora_arguments(to)
    to.add_argument("--chunk-tokens", type=int, default=d.chunk_tokens,
                    help="logit rows per loss chunk")
    to.add_argument("--log-every", type=int, default=d.log_every,
                    help="progress line every N steps")
    to.add_argument("--seed", type=int, default=d.seed, help="data order and validation split")
    add_device_args(tm, bf16=False, what="the rewriter trains")
    tm.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
                    help="continue from the latest checkpoint in --out (or the given checkpoint "
                         "folder); a damaged one is reported and the one before it used; refused "
                         "when --out holds none (the resume policy: minskill/runs.py)")
    tm.add_argument("--overwrite", action="store_true", help="replace the run that a non-empty "
                    "--out holds (without --resume or --overwrite such an --out is refused)")
    t.set_defaults(func=cmd_train)

    a = commands.add_parser(
        "apply", help="rewrite a skill set for a target model in one pass (optionally --compare on "
                      "a suite)",
        description="Rewrite --skills for the model of --model-card with the trained rewriter, in "
                    "one greedy pass, and write the result to --out as a validated Agent Skills "
                    "folder. A reply that does not parse is saved as OUT.raw.txt and nothing is "
                    "written. With --compare, also evaluate the input, the rewritten and a "
                    "one-shot teacher rewrite (DS-Adapter) on --suite and print one table.")
    am = a.add_argument_group("main options")
    ao = a.add_argument_group("rewriting")
    am.add_argument("--rewriter", required=True,
                    help="rewriter: a `rewrite.py train` --out folder or an HF folder")
    am.add_argument("--model-card", required=True,
                    help="target model card: JSON or YAML file, an evolve_masa.py run folder (its "
                         "model_card.json, the card its SFT records hold), or a checkpoint folder "
                         "/ model spec to build one from as evolve_masa.py does (without the "
                         "teacher's strengths and weaknesses)")
    am.add_argument("--skills", required=True, help="input skills: Agent Skills folder, MASA "
                    ".json, or 'base' (with --suite)")
    am.add_argument("--task", required=True, help="task description given to the rewriter, or a "
                    "suite's name (qa, household, webwalk, webshop, searchqa, PATH.jsonl) for the "
                    "description evolve_masa.py's SFT records hold for it (with --task-seed; as "
                    "its defaults --n-prelim 4 --n-train 24 draw the search tasks)")
    am.add_argument("--out", required=True, help="folder for the rewritten skills")
    am.add_argument("--overwrite", action="store_true", help="replace a non-empty --out (and with "
                    "--compare, the earlier comparison in OUT-compare)")
    c = ApplyConfig()
    ao.add_argument("--max-new-tokens", type=int, default=c.max_new_tokens,
                    help=f"reply budget of the rewriter (default {c.max_new_tokens})")
    ao.add_argument("--temperature", type=float, default=c.temperature,
                    help="rewriter temperature (default 0 = greedy)")
    ao.add_argument("--seed", type=int, default=c.seed)
    ao.add_argument("--dtype", choices=("float32", "bfloat16"), default=c.dtype,
                    help="the rewriter's weights (default: bfloat16 on CUDA, float32 on the CPU)")
    ao.add_argument("--json-schema", choices=("on", "off"), default=c.json_schema,
                    help="on (default): the rewriter's reply is decoded under the skill-set JSON "
                         "schema its parser reads (the server's constrained decoding, in this "
                         "process), so it parses or says it was cut; off: free decoding")
    ao.add_argument("--compile-decode", action="store_true", default=c.compile_decode,
                    help="decode with a static KV cache and a torch.compile'd step (CUDA graphs "
                         "on a GPU; with --json-schema off): fewer launches a token")
    add_device_args(ao, bf16=False,
                    what="the rewriter runs (and the embedded task model with --compare)")
    g = a.add_argument_group("--compare: evaluate input vs rewritten vs teacher one-shot skills")
    am.add_argument("--compare", action="store_true",
                    help="evaluate the three skill sets and print one table")
    am.add_argument("--suite", default=None, help="qa | household | webwalk | webshop | searchqa | "
                    "PATH.jsonl (also names 'base' skills)")
    g.add_argument("--split", default=c.split, help=f"task split (default {c.split})")
    g.add_argument("--n-tasks", type=int, default=None,
                   help="number of tasks (default: the whole split)")
    g.add_argument("--task-seed", type=int, default=c.task_seed, help="seed of the generated suite")
    add_task_model_args(g, concurrency=c.task_concurrency, max_tokens=c.task_max_tokens, main=am)
    add_teacher_args(g, url_help="the task endpoint", main=am)
    g.add_argument("--teacher-retries", type=int, default=c.teacher_retries,
                   help="teacher replies tried after the first until one parses (default "
                        f"{c.teacher_retries})")
    g.add_argument("--timeout", type=float, default=c.timeout,
                   help="seconds to wait for one reply of the task model or the teacher (default "
                        f"{c.timeout:g}: a 135M teacher on a busy CPU writes slowly)")
    g.add_argument("--model-spec", default=c.model_spec, help="model of the embedded server")
    g.add_argument("--lam-nh", type=float, default=c.lam_nh,
                   help="λ of the adjusted reward SR − λ·NHR (default "
                        f"{c.lam_nh}: the search's, evolve_masa.py --lam-nh)")
    g.add_argument("--compare-out", default=None,
                   help="folder for trajectories and compare.json (default OUT-compare)")
    add_retrieval_args(g)
    a.set_defaults(func=cmd_apply)
    return parser


if __name__ == "__main__":
    sys.exit(main())
