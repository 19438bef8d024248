"""A Skill-R1 training run's set-up and resume (train_grpo.py's `setup`): refuse a bad --out, build
the editor (and the reference model when β > 0), its optimizer and schedule, or restore them from
OUT/checkpoint with --resume; cut the suite into instances; open the run folder and print the plan.
Off the reading path: it runs once, before the first step."""
from __future__ import annotations

import copy
import random
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from minskill import distributed
from minskill.device import precision_label, set_up_device
from minskill.files import check_shape, read_jsonl, write_jsonl_atomic
from minskill.nn.lora import (ADAPTER_DIR, BASE_DTYPES, AdaptersOff, apply_lora, load_peft_adapter,
                              lora_settings, trainable_parameters)
from minskill.nn.optim import lr_factor
from minskill.nn.weights import load_model, resolve_model
from minskill.rollout import load_skills
from minskill.runs import (TRAINER_STATE, check_run_folder, load_trainer_state, older_checkpoints,
                           open_run_folder, recover_checkpoint, set_rng_state, started_flags)
from minskill.skill_r1.loop import EvolveConfig, Instance, check_config, load_split, make_instances

# what `setup` reads from trainer_state.pt
TRAINER_STATE_KEYS = ("args", "editor_spec", "optimizer", "scheduler", "rng", "metrics", "step")


@dataclass
class Run:
    """What `setup` builds, or restores from OUT/checkpoint, before the first step of this
    session."""
    out: Path
    editor: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | None        # the editor before any training (LoRA: adapters off);
                                             # only when β > 0
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    tasks: list                              # the suite's training split, cut into `instances`
    instances: list[Instance]
    seed_skills: object                      # --seed-skills: a SkillSet, a text, or None (no skill)
    editor_spec: str                         # the editor the run started from
    rows: list[dict] = field(default_factory=list)   # metrics.jsonl: one row per step done so far
    start_step: int = 0


def setup(args) -> Run:
    """Refuse a bad --out, build the editor (and the reference model when β > 0), the optimizer and
    its schedule, or restore them with --resume; cut the suite into instances; open the run folder
    and print what will run."""
    out = Path(args.out)
    set_up_device(args.device)   # TF32 on CUDA for what stays float32 (docs/gpu.md)
    if distributed.is_main():   # torchrun: rank 0 alone checks and writes the run folder (the
                                # others would see
        # its writes); before any model loads
        check_run_folder(out, args.resume, args.overwrite, "train_grpo.py")
    ckpt, state = resume_state(out) if args.resume else (None, None)
    editor_spec = state["editor_spec"] if state else args.editor
    try:
        editor, tokenizer, ref_model = build_editor(args, ckpt, editor_spec)
        optimizer = torch.optim.AdamW(trainable_parameters(editor), lr=args.lr,
                                      weight_decay=args.weight_decay, betas=(0.9, 0.99))
        schedule = partial(lr_factor, total=args.steps, warmup_ratio=args.warmup_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        if state is not None:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
    except (FileNotFoundError, ValueError) as e:   # a damaged checkpoint: its files say what is
                                                   # wrong
        if ckpt is None:
            raise
        sys.exit(f"--resume: {e}\n{damaged_checkpoint_hint(ckpt)}")
    check_config(editor, EvolveConfig.from_args(args))   # G, K, n and the editor's context, before
                                                         # any step
    rows, start_step = [], 0
    if state is not None:
        set_rng_state(state["rng"])
        rows, start_step = list(state["metrics"]), state["step"]
        print(f"resuming {ckpt} at step {start_step}", flush=True)
    else:   # (a run --resume starts again, too: restore_flags said so)
        torch.manual_seed(args.seed)
        random.seed(args.seed)
    tasks = load_split(args, "train")
    instances = make_instances(tasks, args.tasks_per_instance, prefix="train")
    if not instances:
        sys.exit(f"suite {args.suite!r} has no task type with {args.tasks_per_instance} training "
                 "tasks")
    run = Run(out, editor, tokenizer, ref_model, optimizer, scheduler, tasks, instances,
              load_skills(args.seed_skills, args.suite), editor_spec, rows, start_step)
    kept_lineage = lineage_before(out / "lineage.jsonl", start_step) if args.resume else []
    if distributed.is_main():
        open_run_folder(out, args.resume, args.overwrite, "train_grpo.py", settings=vars(args))
        write_jsonl_atomic(out / "metrics.jsonl", rows)  # exactly the steps the checkpoint holds
        write_jsonl_atomic(out / "lineage.jsonl", kept_lineage)
    print_plan(run, args)
    if distributed.world() > 1:
        print(f"data-parallel over {distributed.world()} ranks (torchrun): each evolves its share "
              f"of a step's {args.instances_per_step} instances; the gradients are summed over the "
              "ranks", flush=True)
    return run


def resume_state(out: Path, mmap: bool = False) -> tuple[Path | None, dict | None]:
    """(OUT/checkpoint, its trainer state, RNG states not restored) for --resume; (None, None): a
    run started again (runs.started_flags); else an exit. mmap: the tensors are mapped, not read."""
    ckpt = find_checkpoint(out)
    if ckpt is None and started_flags(out, "train_grpo.py") is not None:
        return None, None
    if ckpt is None:
        sys.exit(f"--resume: no checkpoint in {out} (nothing to resume; drop --resume to start a "
                 "run)")
    try:
        state = load_trainer_state(ckpt, restore_rng=False, required=TRAINER_STATE_KEYS, mmap=mmap)
        if not isinstance(state["args"], dict):
            raise ValueError(f"{ckpt / TRAINER_STATE}: 'args' is a {type(state['args']).__name__}, "
                             "not a dict")
    except ValueError as e:
        sys.exit(f"--resume: {e}\n{damaged_checkpoint_hint(ckpt)}")
    return ckpt, state


def find_checkpoint(out: Path) -> Path | None:
    """OUT/checkpoint (after undoing what a kill during its save left), or None."""
    folder = out / "checkpoint"
    recover_checkpoint(folder)
    return folder if (folder / TRAINER_STATE).is_file() else None


def damaged_checkpoint_hint(ckpt: Path) -> str:
    """What to do about a checkpoint that cannot be loaded: fall back to an older one
    (--keep-checkpoints), if any."""
    if older_checkpoints(ckpt):
        return (f"{ckpt} is damaged; the run kept older checkpoints "
                f"({', '.join(p.name for p in older_checkpoints(ckpt))}): move {ckpt.name} aside "
                f"and rename the newest of them {ckpt.name} to resume from its step")
    return (f"{ckpt} is damaged and the run keeps no earlier checkpoint to fall back to: restore "
            f"it from a copy, or start the run again with --overwrite")


def build_editor(args, ckpt: Path | None, editor_spec: str):
    """(editor, tokenizer, reference model or None). Full fine-tune: the editor (the checkpoint's on
    --resume) in float32, and with β > 0 a frozen copy of the editor before any training. LoRA
    (--lora-rank R): the base editor, frozen (in --lora-base-dtype), with float32 adapters (the
    checkpoint's adapter/ on --resume); with β > 0 the reference is the same model with its adapters
    off (minskill.nn.lora.AdaptersOff): no second copy."""
    lora = lora_settings(args)
    if lora is not None:
        base = resolve_model(editor_spec)
        editor, tokenizer = load_model(str(base), dtype=BASE_DTYPES[args.lora_base_dtype],
                                       device=args.device)
        apply_lora(editor, lora.rank, lora.alpha, lora.dropout, lora.targets, seed=args.seed,
                   base_model_name_or_path=str(Path(base).resolve()))
        if ckpt is not None:
            load_peft_adapter(editor, ckpt / ADAPTER_DIR)
        ref_model = AdaptersOff(editor) if args.beta > 0 else None
    else:
        editor, tokenizer = load_model(str(ckpt) if ckpt else args.editor, dtype=torch.float32,
                                       device=args.device)
        ref_model = None
        if args.beta > 0:  # the reference is the editor before any training (not the resumed
                           # checkpoint)
            ref_model = load_model(editor_spec, dtype=torch.float32,
                                   device=args.device)[0] if ckpt \
                else copy.deepcopy(editor)
            ref_model.eval().requires_grad_(False)
    editor.gradient_checkpointing = args.grad_checkpointing
    editor.compile_decode = args.compile_decode   # generate()'s default (nn/compiled_decode.py)
    return editor, tokenizer, ref_model


def lineage_before(path: Path, step: int) -> list[dict]:
    """--resume: lineage.jsonl's records of the steps before `step` (those the checkpoint holds); a
    line that is not JSON, or a record without an integer "step", is an exit naming FILE:LINE."""
    if not path.is_file():
        return []
    try:
        records = [check_shape(r, {"step": int}, f"{path}:{n}") for n, r in read_jsonl(path)]
    except ValueError as e:
        sys.exit(f"--resume: {e}")
    return [r for r in records if r["step"] < step]


def print_plan(run: Run, args) -> None:
    n_params = sum(p.numel() for p in run.editor.parameters())
    trained = (f"LoRA r={args.lora_rank} α={args.lora_alpha:g} on {','.join(args.lora_targets)}: "
               f"{sum(p.numel() for p in trainable_parameters(run.editor)) / 1e6:.2f}M trained, "
               f"base {args.lora_base_dtype}" if args.lora_rank else "full fine-tune")
    reference = ("none (β = 0)" if run.ref_model is None
                 else "the editor with its LoRA adapters off"
                 if args.lora_rank else "frozen copy of the editor")
    task_model = args.task_url or (f"embedded default (smollm2-135m, --task-quantize "
                                   f"{args.task_quantize}, greedy)")
    print(f"Skill-R1 (bi-level GRPO): editor {run.editor_spec} ({n_params / 1e6:.1f}M parameters, "
          f"{trained}), task model {task_model}; suite {args.suite}: "
          f"{len(run.instances)} training instances of {args.tasks_per_instance} tasks; "
          f"{args.steps} steps x {args.instances_per_step} instances x G={args.generations} x "
          f"K={args.candidates} candidates, n={args.rollouts}; λ={args.lam} β={args.beta} "
          f"agg={args.agg} lr={args.lr}; {precision_label(args.device, args.bf16)}; reference "
          f"model: {reference} -> {run.out}", flush=True)
