"""Skill-R1: train a skill editor with bi-level GRPO while the task model stays frozen behind HTTP.

    python train_grpo.py                                    # offline default: SmolLM2-135M as editor and as
                                                            # (embedded) task model, built-in qa suite
    python train_grpo.py --lam 0 --out runs/grpo            # vanilla GRPO (the paper's baseline)
    python train_grpo.py --task-url http://localhost:8000/v1 --task-model Qwen/Qwen3-8B --editor /path/Qwen3-4B
    python train_grpo.py --eval --grpo-editor runs/grpo/checkpoint --skillr1-editor runs/skill-r1/checkpoint

What the defaults train: with --ppo-epochs 1 the ratio is exactly 1, so the PPO clip (--eps-low/--eps-high)
never acts and the update is REINFORCE with group-relative advantages A = A_intra + λ·A_inter, unless
--ppo-epochs > 1; the KL to the reference is off (no reference model) unless --beta > 0; A_intra is divided
by the group's std as in standard GRPO (--no-scale-by-std: not); and G = --generations 2 (each generation
costs ~0.7x the run again), while the paper analyses generations 1-5: use -G 3 to 5 for a real run.

One training step (docs/skill-r1.md, the loop in `train`):
  1. pick --instances-per-step task instances (tasks of one type each);
  2. evolve: on each, the G-generation loop of minskill.skill_r1 (K candidate skills per generation sampled
     from one shared prompt, each scored by n task-model rollouts per task);
  3. advantages: every candidate gets A = A_intra + λ·A_inter (minskill.skill_r1.grpo.bilevel_advantages);
  4. policy update: per --ppo-epochs one optimizer step on the clipped policy loss of
     minskill.skill_r1.grpo.policy_loss over all candidates' tokens, with gradient accumulation over micro-batches;
  5. record (`StepRecorder`, after `train_step` did 1-4; minskill.skill_r1.records): a line on stdout, a row
     of metrics.jsonl and of lineage.jsonl, reward_curve.svg redrawn, the held-out probe every --probe-every steps;
  6. checkpoint every --save-every steps and at the end (the same recorder).
Set-up and resume (`setup`), the end-of-run summary (`summarize`) and the --eval table
(minskill.skill_r1.evaluate) are off that path.

LoRA (--lora-rank R; minskill.nn.lora, set up in `build_editor`): only rank-R adapters on the attention and MLP
projections train, in float32 with their AdamW state, on a frozen base (bf16 on CUDA: --lora-base-dtype); with
β > 0 the reference policy is the same model with its adapters switched off. checkpoint/ then holds the merged
editor in HF layout (what --eval and any HF tool load) and checkpoint/adapter/ in PEFT's layout; --resume
rebuilds the base from the editor the run started from and restores the adapter and its optimizer state.

Old log-probs. logp_old is the editor's log-prob of the sampled tokens under the weights that sampled them.
Those weights are still unchanged when the update starts, so logp_old is taken from the update's own first
forward pass (detached) instead of from the sampler: the value is the same policy, but computed by the very
code path that computes logp_θ, so the ratio is exactly 1 on the first pass (the sampler's incremental
KV-cache path, especially under bf16, differs by rounding and would make the clip fire on noise). The
sampler's log-probs are kept as a check: `logp_mismatch` in metrics.jsonl is their mean absolute difference.
With --ppo-epochs 1 the update is therefore exactly REINFORCE with group-relative advantages; later epochs
reuse the first pass's values, so the ratio and the clip act as in PPO.

Aggregation across micro-batches equals aggregating the whole batch at once: token_mean weights each
micro-batch's loss by its share of all completion tokens, seq_mean and dr_grpo by its share of sequences.
Candidates with A = 0 (and β = 0) have no gradient and are skipped, but still count in those totals.
Past one GPU (`torchrun --nproc_per_node N train_grpo.py ...`, minskill.distributed) each rank evolves its share
of the step's instances; the totals are the whole step's (summed over the ranks) and the gradients are summed
after the backward passes, so every rank takes the one-process step; rank 0 alone writes the run folder.

Shared prefix (a speed trick, on by default: on the reading path). The K candidates of a generation share one editor
prompt; micro-batches never mix two prompts (which bounds the update's memory to one prompt's activations),
and with --shared-prefix (the default) each computes its prompt once for all its rows
(minskill.nn.shared_prefix.shared_prefix_logprobs), with the same log-probs and gradient as
sampling.completion_logprobs, which the loop reads as. --no-shared-prefix uses the latter.

The loss value sits near zero by construction (advantages are centred); watch the reward instead:
metrics.jsonl (one JSON line per step) and reward_curve.svg in the output folder.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import random
import sys
import time
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minskill import distributed
from minskill.cli import (add_device_args, add_task_model_args, check_resumed_device, client_args, precision_label,
                          resolve_bf16, set_up_device)
from minskill.files import check_shape, read_jsonl, write_jsonl_atomic
from minskill.gates import GATES
from minskill.nn.lora import (ADAPTER_DIR, BASE_DTYPES, AdaptersOff, add_lora_arguments, apply_lora,
                              load_peft_adapter, lora_settings, trainable_parameters)
from minskill.nn.optim import lr_factor, release_freed_memory
from minskill.nn.sampling import completion_logprobs
from minskill.nn.shared_prefix import shared_prefix_logprobs
from minskill.nn.weights import load_model, resolve_model
from minskill.rollout import SkillsNotFound, load_skills, skill_text
from minskill.runs import (TRAINER_STATE, check_run_folder, given_flags, load_trainer_state, open_run_folder,
                           older_checkpoints, recover_checkpoint, resume_flags, save_checkpoint,
                           restart_flags, set_rng_state, started_flags)
from minskill.serve.embedded import embedded_client
from minskill.skill_r1.evaluate import (TaskModelFailed, check_heldout, evaluate, probe, probe_instances,
                                        with_heldout_seed)
from minskill.skill_r1.grpo import check_loss_config, policy_loss
from minskill.skill_r1.loop import (EvolveConfig, Instance, all_zero_note, assign_advantages, autocast, check_config,
                                    SuiteError, evolve_batch, load_tasks, make_instances, step_seed)
from minskill.skill_r1.records import (errors_note, log_step, metrics_row, no_reward_yet,
                                       step_over_ranks)

# --resume (minskill.runs.resume_flags): flags that, given, must equal the checkpoint's, or the continued run would
# not be the same run; every other flag may change (where and how fast it runs, how far, what it writes)
RESUME_MUST_MATCH = ("suite", "seed_skills", "generations", "candidates", "rollouts", "lam", "scale_by_std",
                     "eps_low", "eps_high", "beta", "agg", "ppo_epochs", "tasks_per_instance", "n_tasks",
                     "editor_temperature", "editor_top_p", "max_skill_tokens", "context_tokens",
                     "task_max_tokens", "task_temperature", "instances_per_step", "micro_batch", "lr",
                     "weight_decay", "warmup_ratio", "grad_clip", "bf16", "seed", "heldout_seed", "lora_rank", "lora_alpha",
                     "lora_dropout", "lora_targets", "lora_base_dtype", "carry_gate", "carry_gate_alpha")
# what `setup` reads from trainer_state.pt
TRAINER_STATE_KEYS = ("args", "editor_spec", "optimizer", "scheduler", "rng", "metrics", "step")


@dataclass
class TrainConfig(EvolveConfig):
    """Every default of this script's flags, written once (argparse reads them; the loop's own knobs are
    EvolveConfig's fields, inherited with their defaults; the --lora-* flags' defaults are minskill.nn.lora's)."""
    editor: str = "smollm2-135m"
    task_concurrency: int | None = None   # None: one generation's requests (K × tasks per instance × instances)
    task_quantize: str = "none"
    suite: str = "qa"
    seed_skills: str = "none"
    lam: float = 0.5                  # λ, weight of A_inter; 0 = vanilla GRPO
    scale_by_std: bool = True
    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.0                 # 0: no KL, no reference model
    agg: str = "token_mean"
    ppo_epochs: int = 1               # 1: the ratio is 1, the update is REINFORCE
    tasks_per_instance: int = 4
    steps: int = 3
    instances_per_step: int = 1
    micro_batch: int = 4
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.1
    grad_clip: float = 1.0
    shared_prefix: bool = True
    probe_every: int = 0
    probe_instances: int = 4
    probe_candidates: int = 4
    save_every: int = 2
    keep_checkpoints: int = 1         # 1: each save replaces the last
    seed: int = 0
    heldout_seed: int = 0             # the held-out draw (--eval, the probe), apart from the training seed
    frozen_row: bool = True
    eval_instances: int = 12
    eval_tasks: int = 20
    eval_scoring: str = "own"


@dataclass
class Run:
    """What `setup` builds, or restores from OUT/checkpoint, before the first step of this session."""
    out: Path
    editor: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | None        # the editor before any training (LoRA: adapters off); only when β > 0
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    tasks: list                              # the suite's training split, cut into `instances`
    instances: list[Instance]
    seed_skills: object                      # --seed-skills: a SkillSet, a text, or None (no skill)
    editor_spec: str                         # the editor the run started from
    probe_instances: list[Instance] = field(default_factory=list)   # held-out, fixed; --probe-every
    rows: list[dict] = field(default_factory=list)   # metrics.jsonl: one row per step done so far
    start_step: int = 0


# ---------------------------------------------------------------------------------------------- training


def train(args) -> int:
    """The Skill-R1 training loop (module docstring): each step `train_step` computes, then the recorder records."""
    run, cfg = setup(args), EvolveConfig.from_args(args)
    with distributed.shared_client(embedded_client, **client_args(args, "task"), quantize=args.task_quantize,
                                   max_workers=args.task_concurrency) as client:   # torchrun: one for all ranks
        recorder = StepRecorder(run, args, client)
        for step in range(run.start_step, args.steps):
            recorder.begin()
            recorder.end(step, *train_step(run, args, cfg, client, step))
        calls = client.stats["calls"]
    summarize(run, args, calls)
    return 0


def train_step(run: Run, args, cfg: EvolveConfig, client, step: int) -> tuple[list, list, dict, float]:
    """One step: evolve a batch, advantages, one GRPO update; (evolutions, candidates, stats, sampling end time)."""
    # 1. pick this step's instances (torchrun: this rank's share; j, an instance's place in the step, seeds it)
    batch = [run.instances[i] for i in instance_order(len(run.instances), step, args.instances_per_step, args.seed)]
    batch, places = distributed.share(batch)
    # 2. evolve: G generations of K candidate skills on each, scored by the frozen task model
    run.editor.eval()
    with autocast(args.bf16, run.editor.device):
        evolutions = evolve_batch(run.editor, run.tokenizer, client, batch, cfg,
                                  seeds=[step_seed(args.seed, step, j) for j in places],
                                  seed_skills=[skill_text(run.seed_skills, x.type) for x in batch])
    t_sampled = time.time()
    # 3. advantages: A = A_intra + λ·A_inter on every candidate
    candidates = assign_advantages(evolutions, args.lam, args.scale_by_std)
    # 4. policy update: the clipped GRPO loss over all candidates' tokens
    run.editor.train()
    stats = policy_update(run.editor, run.ref_model, run.optimizer, candidates, args)
    run.scheduler.step()
    return evolutions, candidates, stats, t_sampled


def instance_order(n_instances: int, step: int, per_step: int, seed: int) -> list[int]:
    """`step`'s instances: passes over a seeded permutation, a pure function of (step, seed) that a resume repeats."""
    picks = []
    for j in range(per_step):
        epoch, pos = divmod(step * per_step + j, n_instances)
        perm = list(range(n_instances))
        random.Random(seed * 7919 + epoch).shuffle(perm)
        picks.append(perm[pos])
    return picks


def unshared_logprobs(model, mb: list, args):
    """--no-shared-prefix: the same log-probs with the prompt run once per row (sampling.completion_logprobs)."""
    return completion_logprobs(model, [c.prompt_ids for c in mb], [c.token_ids for c in mb],
                               temperature=args.editor_temperature)


@torch.no_grad()
def reference_logprobs(ref_model, mb: list, args) -> torch.Tensor:
    """β > 0: the frozen reference's log-probs of the micro-batch, for the KL term (by the update's own route)."""
    if args.shared_prefix:
        return shared_prefix_logprobs(ref_model, mb[0].prompt_ids, [c.token_ids for c in mb],
                                      temperature=args.editor_temperature)[0]
    return unshared_logprobs(ref_model, mb, args)[0]


def micro_batches(rows: list, size: int) -> list[list]:
    """Micro-batches of at most `size` rows of one prompt each (the update's memory: one prompt's activations)."""
    groups: dict[tuple[int, ...], list] = {}
    for row in rows:
        groups.setdefault(tuple(row.prompt_ids), []).append(row)
    return [group[i:i + size] for group in groups.values() for i in range(0, len(group), size)]


def policy_update(editor, ref_model, optimizer, candidates, args) -> dict:
    """--ppo-epochs optimizer steps of the clipped GRPO loss (module docstring: old log-probs, micro-batch weights)."""
    beta = args.beta if ref_model is not None else 0.0
    seqs = [c for c in candidates if c.token_ids]
    total_tokens, total_seqs = distributed.sum_over_ranks(sum(len(c.token_ids) for c in seqs), len(seqs))
    # a candidate with A = 0 has zero policy gradient; without a KL term it would only cost compute
    train = [c for c in seqs if c.advantage != 0.0 or beta > 0]
    n_tok = sum(len(c.token_ids) for c in train)
    keys = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")
    sums, old_logps, loss, mismatch, grad_norm = dict.fromkeys(keys, 0.0), [], 0.0, 0.0, 0.0
    # with no batch (e.g. every reward 0) the optimizer still steps, a no-op, so the schedule stays in sync
    for epoch in range(args.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for k, mb in enumerate(micro_batches(train, args.micro_batch)):
            with autocast(args.bf16, editor.device):   # --shared-prefix: the micro-batch's one prompt computed once
                logp, mask = (shared_prefix_logprobs(editor, mb[0].prompt_ids, [c.token_ids for c in mb],
                                                     temperature=args.editor_temperature)
                              if args.shared_prefix else unshared_logprobs(editor, mb, args))
                ref_logp = reference_logprobs(ref_model, mb, args) if beta > 0 else None
            if epoch == 0:  # the weights that sampled are unchanged so far: logp_old = this pass, detached
                old_logps.append(logp.detach())
                sampled = torch.tensor([list(c.logprobs) + [0.0] * (logp.shape[1] - len(c.logprobs)) for c in mb],
                                       dtype=torch.float32, device=logp.device)
                mismatch += float(((sampled - logp.detach()).abs() * mask).sum())
            mb_loss, st = policy_loss(logp, old_logps[k], [c.advantage for c in mb], mask, ref_logp=ref_logp,
                                      eps_low=args.eps_low, eps_high=args.eps_high, beta=beta, agg=args.agg,
                                      max_new_tokens=args.max_skill_tokens)
            mb_tokens = sum(len(c.token_ids) for c in mb)
            weight = mb_tokens / total_tokens if args.agg == "token_mean" else len(mb) / total_seqs
            (mb_loss * weight).backward()
            loss += float(mb_loss.detach()) * weight
            for key in keys:
                sums[key] += st[key] * mb_tokens
        distributed.all_reduce_grads(editor)   # torchrun: summed over the ranks, so every rank steps alike
        params = [p for p in editor.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, args.grad_clip if args.grad_clip > 0 else math.inf)
        grad_norm += float(norm) / args.ppo_epochs
        optimizer.step()
    return {"loss": loss / args.ppo_epochs, **{key: sums[key] / max(n_tok * args.ppo_epochs, 1) for key in keys},
            "logp_mismatch": mismatch / max(1, n_tok), "grad_norm": grad_norm,
            "train_tokens": n_tok * args.ppo_epochs, "trained_sequences": len(train)}


# ------------------------------------------------------ recording each step (bookkeeping: off the reading path)


class StepRecorder:
    """`train`'s bookkeeping around each step (minskill.skill_r1.records writes the rows): `begin` notes the clock,
    the task model's usage and the lr before train_step; `end` puts the ranks' step together, probes the held-out
    instances every --probe-every steps, logs the step, and saves the checkpoint every --save-every steps (both
    also after the last)."""

    def __init__(self, run: Run, args, client):
        self.run, self.args, self.client, self.t_run = run, args, client, time.time()
        fresh = run.start_step == 0 and args.probe_every   # a fresh run probes the editor before any training too
        self.probes = [held_out_probe(run, client, args, after_steps=0)] if fresh else []

    def begin(self) -> None:
        self.t0, self.usage0 = time.time(), self.client.usage
        self.lr = self.run.optimizer.param_groups[0]["lr"]   # the lr the step's update uses

    def end(self, step: int, evolutions, candidates, stats: dict, t_sampled: float) -> None:
        run, args = self.run, self.args
        evolutions, candidates, stats, usage = step_over_ranks(evolutions, candidates, stats, self.client.usage,
                                                               self.usage0)
        row = metrics_row(step, evolutions, candidates, stats, usage, self.t0, t_sampled, self.lr)
        if args.probe_every and ((step + 1) % args.probe_every == 0 or step + 1 == args.steps):
            self.probes.append(held_out_probe(run, self.client, args, after_steps=step + 1))
        log_step(run, args, {**row, "probes": self.probes}, self.t0, self.t_run, evolutions)
        self.probes = []
        if distributed.is_main() and ((step + 1) % args.save_every == 0 or step + 1 == args.steps):
            save_checkpoint(run.out / "checkpoint", run.editor, run.tokenizer, keep=args.keep_checkpoints, state={
                "step": step + 1, "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
                "args": vars(args), "editor_spec": run.editor_spec, "metrics": run.rows})


def held_out_probe(run: Run, client, args, after_steps: int) -> dict:
    """The current editor scored on the fixed held-out probe instances (skill_r1.evaluate.probe); printed.
    torchrun: rank 0 alone probes (its editor equals every rank's) and records it; the others get {}."""
    if not distributed.is_main():
        return {}
    run.editor.eval()
    result = {"after_steps": after_steps, **probe(run.editor, run.tokenizer, client, run.probe_instances,
                                                  [skill_text(run.seed_skills, x.type) for x in run.probe_instances],
                                                  args)}
    print(f"held-out probe after {after_steps} steps: seed skill → mean candidate reward " +
          " → ".join(f"{r:.2f}" for r in result["reward_per_generation"]) +
          f" | carried {result['carried_reward']:.2f} | {result['beat_seed_share']:.0%} of candidates beat the "
          f"seed skill{errors_note(result)} | {result['seconds']:.0f} s", flush=True)
    return result


# ------------------------------------------------------------------------------------ set-up, resume, summary


def setup(args) -> Run:
    """Refuse a bad --out, build the editor (and the reference model when β > 0), the optimizer and its schedule,
    or restore them with --resume; cut the suite into instances; open the run folder and print what will run."""
    out = Path(args.out)
    set_up_device(args.device)   # TF32 on CUDA for what stays float32 (docs/gpu.md)
    if distributed.is_main():   # torchrun: rank 0 alone checks and writes the run folder (the others would see
        check_run_folder(out, args.resume, args.overwrite, "train_grpo.py")   # its writes); before any model loads
    ckpt, state = resume_state(out) if args.resume else (None, None)
    editor_spec = state["editor_spec"] if state else args.editor
    try:
        editor, tokenizer, ref_model = build_editor(args, ckpt, editor_spec)
        optimizer = torch.optim.AdamW(trainable_parameters(editor), lr=args.lr, weight_decay=args.weight_decay,
                                      betas=(0.9, 0.99))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, total=args.steps,
                                                                         warmup_ratio=args.warmup_ratio))
        if state is not None:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
    except (FileNotFoundError, ValueError) as e:   # a damaged checkpoint: its files say what is wrong
        if ckpt is None:
            raise
        sys.exit(f"--resume: {e}\n{damaged_checkpoint_hint(ckpt)}")
    check_config(editor, EvolveConfig.from_args(args))   # G, K, n and the editor's context, before any step
    rows, start_step = [], 0
    if state is not None:
        set_rng_state(state["rng"])
        rows, start_step = list(state["metrics"]), state["step"]
        print(f"resuming {ckpt} at step {start_step}", flush=True)
    else:   # (a run --resume starts again, too: restore_flags said so)
        torch.manual_seed(args.seed)
        random.seed(args.seed)
    tasks = load_tasks(args, "train")
    instances = make_instances(tasks, args.tasks_per_instance, prefix="train")
    if not instances:
        sys.exit(f"suite {args.suite!r} has no task type with {args.tasks_per_instance} training tasks")
    run = Run(out, editor, tokenizer, ref_model, optimizer, scheduler, tasks, instances,
              load_skills(args.seed_skills, args.suite), editor_spec,
              probe_instances(args) if args.probe_every else [], rows, start_step)
    kept_lineage = lineage_before(out / "lineage.jsonl", start_step) if args.resume else []
    if distributed.is_main():
        open_run_folder(out, args.resume, args.overwrite, "train_grpo.py", settings=vars(args))
        write_jsonl_atomic(out / "metrics.jsonl", rows)  # exactly the steps the checkpoint holds
        write_jsonl_atomic(out / "lineage.jsonl", kept_lineage)
    print_plan(run, args)
    if distributed.world() > 1:
        print(f"data-parallel over {distributed.world()} ranks (torchrun): each evolves its share of a step's "
              f"{args.instances_per_step} instances; the gradients are summed over the ranks", flush=True)
    return run


def lineage_before(path: Path, step: int) -> list[dict]:
    """--resume: lineage.jsonl's records of the steps before `step` (those the checkpoint holds); a line that is
    not JSON, or a record without an integer "step", is an exit naming FILE:LINE."""
    if not path.is_file():
        return []
    try:
        records = [check_shape(r, {"step": int}, f"{path}:{n}") for n, r in read_jsonl(path)]
    except ValueError as e:
        sys.exit(f"--resume: {e}")
    return [r for r in records if r["step"] < step]


def build_editor(args, ckpt: Path | None, editor_spec: str):
    """(editor, tokenizer, reference model or None). Full fine-tune: the editor (the checkpoint's on --resume) in
    float32, and with β > 0 a frozen copy of the editor before any training. LoRA (--lora-rank R): the base
    editor, frozen (in --lora-base-dtype), with float32 adapters (the checkpoint's adapter/ on --resume); with
    β > 0 the reference is the same model with its adapters off (minskill.nn.lora.AdaptersOff): no second copy."""
    lora = lora_settings(args)
    if lora is not None:
        base = resolve_model(editor_spec)
        editor, tokenizer = load_model(str(base), dtype=BASE_DTYPES[args.lora_base_dtype], device=args.device)
        apply_lora(editor, lora.rank, lora.alpha, lora.dropout, lora.targets, seed=args.seed,
                   base_model_name_or_path=str(Path(base).resolve()))
        if ckpt is not None:
            load_peft_adapter(editor, ckpt / ADAPTER_DIR)
        ref_model = AdaptersOff(editor) if args.beta > 0 else None
    else:
        editor, tokenizer = load_model(str(ckpt) if ckpt else args.editor, dtype=torch.float32, device=args.device)
        ref_model = None
        if args.beta > 0:  # the reference is the editor before any training (not the resumed checkpoint)
            ref_model = load_model(editor_spec, dtype=torch.float32, device=args.device)[0] if ckpt \
                else copy.deepcopy(editor)
            ref_model.eval().requires_grad_(False)
    editor.gradient_checkpointing = args.grad_checkpointing
    return editor, tokenizer, ref_model


def resume_state(out: Path, mmap: bool = False) -> tuple[Path | None, dict | None]:
    """(OUT/checkpoint, its trainer state, RNG states not restored) for --resume; (None, None): a
    run started again (runs.started_flags); else an exit. mmap: the tensors are mapped, not read."""
    ckpt = find_checkpoint(out)
    if ckpt is None and started_flags(out, "train_grpo.py") is not None:
        return None, None
    if ckpt is None:
        sys.exit(f"--resume: no checkpoint in {out} (nothing to resume; drop --resume to start a run)")
    try:
        state = load_trainer_state(ckpt, restore_rng=False, required=TRAINER_STATE_KEYS, mmap=mmap)
        if not isinstance(state["args"], dict):
            raise ValueError(f"{ckpt / TRAINER_STATE}: 'args' is a {type(state['args']).__name__}, not a dict")
    except ValueError as e:
        sys.exit(f"--resume: {e}\n{damaged_checkpoint_hint(ckpt)}")
    return ckpt, state


def restore_flags(args, given: set[str]) -> None:
    """--resume: the checkpoint's flags where none is given (the resume policy, minskill.runs.resume_flags):
    a given flag of RESUME_MUST_MATCH that differs is refused, naming it with both values."""
    check_run_folder(args.out, args.resume, args.overwrite, "train_grpo.py")   # before the checkpoint is read
    state = resume_state(Path(args.out), mmap=True)[1]   # None: a run started again (said so)
    saved = with_heldout_seed(state["args"] if state else restart_flags(args.out, "train_grpo.py"))
    changed = resume_flags(args, saved, given, set(vars(args)) - set(RESUME_MUST_MATCH), "train_grpo.py")
    if any(note.startswith("--steps ") for note in changed):
        print(f"note: --steps {saved['steps']} -> {args.steps} changes the cosine schedule")


def damaged_checkpoint_hint(ckpt: Path) -> str:
    """What to do about a checkpoint that cannot be loaded: fall back to an older one (--keep-checkpoints), if any."""
    if older_checkpoints(ckpt):
        return (f"{ckpt} is damaged; the run kept older checkpoints ({', '.join(p.name for p in older_checkpoints(ckpt))}):"
                f" move {ckpt.name} aside and rename the newest of them {ckpt.name} to resume from its step")
    return (f"{ckpt} is damaged and the run keeps no earlier checkpoint to fall back to: restore it from a copy, "
            f"or start the run again with --overwrite")


def find_checkpoint(out: Path) -> Path | None:
    """OUT/checkpoint (after undoing what a kill during its save left), or None."""
    folder = out / "checkpoint"
    recover_checkpoint(folder)
    return folder if (folder / TRAINER_STATE).is_file() else None


def print_plan(run: Run, args) -> None:
    n_params = sum(p.numel() for p in run.editor.parameters())
    trained = (f"LoRA r={args.lora_rank} α={args.lora_alpha:g} on {','.join(args.lora_targets)}: "
               f"{sum(p.numel() for p in trainable_parameters(run.editor)) / 1e6:.2f}M trained, base "
               f"{args.lora_base_dtype}" if args.lora_rank else "full fine-tune")
    reference = ("none (β = 0)" if run.ref_model is None else "the editor with its LoRA adapters off"
                 if args.lora_rank else "frozen copy of the editor")
    print(f"Skill-R1 (bi-level GRPO): editor {run.editor_spec} ({n_params / 1e6:.1f}M parameters, {trained}), "
          f"task model "
          f"{args.task_url or f'embedded default (smollm2-135m, --task-quantize {args.task_quantize}, greedy)'}; suite {args.suite}: "
          f"{len(run.instances)} training instances of {args.tasks_per_instance} tasks; "
          f"{args.steps} steps x {args.instances_per_step} instances x G={args.generations} x K={args.candidates} "
          f"candidates, n={args.rollouts}; λ={args.lam} β={args.beta} agg={args.agg} lr={args.lr}; "
          f"{precision_label(args.device, args.bf16)}; reference model: {reference} -> {run.out}", flush=True)


def summarize(run: Run, args, calls: int) -> None:
    """The end of the run: first and last step's rewards, the best edited skill, what was written."""
    rows, calls = run.rows, distributed.sum_over_ranks(calls)   # torchrun: every rank's calls; rank 0 prints
    if rows:
        first, last = rows[0], rows[-1]
        print(f"\ndone: {len(rows)} steps. Mean candidate reward per generation (g=0 is the seed skill): first "
              f"step {[round(r, 2) for r in first['reward_per_generation']]}, last step "
              f"{[round(r, 2) for r in last['reward_per_generation']]}; task-model calls this session: {calls}.")
        if no_reward_yet(rows):
            print("note: " + all_zero_note(run.tasks))
        best = max(rows, key=lambda r: (r["best_skill_gain"], r["best_skill_reward"]))
        if best["best_skill_gain"] > 0:
            print(f"best edited skill: reward {best['best_skill_reward']:.2f} on {best['best_skill_instance']} "
                  f"(+{best['best_skill_gain']:.2f} over its seed skill), step {best['step'] + 1}:\n"
                  f"{best['best_skill'].strip()[:600]}")
        else:
            print("no edited skill beat its instance's seed skill in this run.")
    adapter = f", its LoRA adapter alone in {ADAPTER_DIR}/ (PEFT layout)" if args.lora_rank else ""
    print(f"wrote {run.out / 'checkpoint'} (editor in HF layout{' (merged)' if args.lora_rank else ''}{adapter} + "
          f"trainer_state.pt), {run.out / 'metrics.jsonl'}, {run.out / 'lineage.jsonl'}, "
          f"{run.out / 'reward_curve.svg'}; python -m minskill.report {run.out} draws the run as one HTML page")


# ------------------------------------------------------------------------------------------ command line


def parse_args(argv=None) -> argparse.Namespace:
    d = TrainConfig()
    title, examples, defaults = __doc__.split("\n\n")[:3]
    p = argparse.ArgumentParser(usage="%(prog)s [main options] [other options, grouped below]",
                                description=f"{title}\n\n{defaults}", epilog=f"examples:\n{examples}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("main options")
    c = p.add_argument_group("components")
    m.add_argument("--editor", default=d.editor, help="the skill editor to train: an HF model folder or "
                   "smollm2-135m (the offline default; default)")
    add_task_model_args(c, concurrency=d.task_concurrency, max_tokens=d.task_max_tokens, quantize=d.task_quantize,
                        main=m)
    m.add_argument("--suite", default=d.suite,
                   help="task suite: qa | household | webwalk | webshop | searchqa | PATH.jsonl (default %(default)s)")
    c.add_argument("--n-tasks", type=int, default=None, help="tasks drawn from the suite per split (default: "
                   "the suite's own, e.g. 50 per type for qa)")
    m.add_argument("--seed-skills", default=d.seed_skills, help="the seed skill s_0 of each instance: none (default), "
                   "base (the suite's hand-written skills), a skill-set folder, a MASA .json, or a text file")
    a = p.add_argument_group("algorithm (docs/skill-r1.md)")
    m.add_argument("-G", "--generations", type=int, default=d.generations,
                   help="generations G per instance (default %(default)s)")
    m.add_argument("-K", "--candidates", type=int, default=d.candidates,
                   help="candidate skills K per generation (default %(default)s)")
    a.add_argument("-n", "--rollouts", type=int, default=d.rollouts, help="task-model rollouts per skill and task "
                   "(default %(default)s: enough with the greedy task model)")
    m.add_argument("--lam", type=float, default=d.lam,
                   help="λ, weight of A_inter (0 = vanilla GRPO; default %(default)s)")
    a.add_argument("--scale-by-std", action=argparse.BooleanOptionalAction, default=d.scale_by_std,
                   help="divide A_intra by the group's std + 1e-4, as standard GRPO does (on by default: measured "
                        "on the learning test, docs/skill-r1.md; --no-scale-by-std: Dr. GRPO's unscaled A_intra)")
    a.add_argument("--eps-low", type=float, default=d.eps_low, help="clip range below 1 (default %(default)s)")
    a.add_argument("--eps-high", type=float, default=d.eps_high, help="clip range above 1 (default %(default)s)")
    a.add_argument("--beta", type=float, default=d.beta, help="weight of the k3 KL to a frozen reference copy of "
                   "the editor; 0 (default) keeps no reference model")
    a.add_argument("--agg", default=d.agg, choices=["token_mean", "seq_mean", "dr_grpo"],
                   help="loss aggregation (default %(default)s)")
    a.add_argument("--ppo-epochs", type=int, default=d.ppo_epochs, help="optimizer passes over each step's samples "
                   "(default %(default)s)")
    a.add_argument("--tasks-per-instance", type=int, default=d.tasks_per_instance,
                   help="tasks of one type forming one instance x (default %(default)s)")
    a.add_argument("--editor-temperature", type=float, default=d.editor_temperature,
                   help="editor sampling temperature (default 1)")
    a.add_argument("--editor-top-p", type=float, default=d.editor_top_p, help="editor nucleus sampling (default 1)")
    a.add_argument("--max-skill-tokens", type=int, default=d.max_skill_tokens,
                   help="longest skill the editor may write, in "
                   "tokens (default %(default)s)")
    a.add_argument("--context-tokens", type=int, default=d.context_tokens,
                   help="token budget of the editor's prompt; the "
                   "history is trimmed to fit (default %(default)s)")
    a.add_argument("--task-temperature", type=float, default=d.task_temperature, help="task-model sampling temperature "
                   "(default 0 = greedy)")
    a.add_argument("--carry-gate", choices=GATES, default=d.carry_gate, help="when a generation's best candidate "
                   "replaces the current skill: strict = its reward is higher (the paper); paired = also a one-sided "
                   "sign test on the instance's tasks at --carry-gate-alpha (minskill/gates.py; default %(default)s)")
    a.add_argument("--carry-gate-alpha", type=float, default=d.carry_gate_alpha,
                   help="α of --carry-gate paired (default %(default)s)")
    t = p.add_argument_group("training")
    m.add_argument("--steps", type=int, default=d.steps,
                   help="optimizer steps (default %(default)s: about 2 minutes on a busy 2-core "
                   "CPU)")
    t.add_argument("--instances-per-step", type=int, default=d.instances_per_step,
                   help="instances per step; their candidates "
                   "form one batch (default %(default)s)")
    t.add_argument("--micro-batch", type=int, default=d.micro_batch,
                   help="sequences of one prompt per forward/backward pass; gradients "
                   "accumulate over micro-batches (default %(default)s)")
    t.add_argument("--lr", type=float, default=d.lr, help="AdamW peak learning rate (default %(default)s)")
    t.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay (default 0)")
    t.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio, help="share of steps with linear warmup, then "
                   "cosine decay to 0 (default %(default)s)")
    t.add_argument("--grad-clip", type=float, default=d.grad_clip, help="clip the gradient norm to this (0 = off)")
    add_device_args(t, what="the editor and the embedded task model run")   # --device, --bf16/--no-bf16 (docs/gpu.md)
    add_lora_arguments(t)
    t.add_argument("--grad-checkpointing", action="store_true", help="recompute each layer in the backward "
                   "pass (less memory, more time)")
    t.add_argument("--shared-prefix", action=argparse.BooleanOptionalAction, default=d.shared_prefix,
                   help="compute the editor prompt a group's candidates share once per micro-batch, forward and "
                        "backward (same gradient; default on)")
    t.add_argument("--probe-every", type=int, default=d.probe_every,
                   help="every M steps (and before the first and after "
                   "the last) score the editor on fixed held-out probe instances: metrics.jsonl's probes, the "
                   "held-out curve of reward_curve.svg (default 0 = no probe)")
    t.add_argument("--probe-instances", type=int, default=d.probe_instances,
                   help="held-out probe instances, task types in turn, "
                   "never among --eval's (default %(default)s)")
    t.add_argument("--probe-candidates", type=int, default=d.probe_candidates,
                   help="skills the editor writes per probe instance, "
                   "in one generation from the seed skill's feedback (default %(default)s)")
    t.add_argument("--save-every", type=int, default=d.save_every,
                   help="write the checkpoint every N steps and at the end")
    t.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints, help="checkpoints kept: OUT/checkpoint "
                   "is the newest, older ones OUT/checkpoint-step-S (default %(default)s: each save replaces the last)")
    m.add_argument("--out", default=None, help="output folder: training: checkpoint/, metrics.jsonl, lineage.jsonl, "
                   "reward_curve.svg (default runs/skill-r1); --eval: eval.json (default runs/skill-r1-eval-TIME)")
    m.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint; the next steps equal "
                   "those of an uninterrupted run (the resume policy: minskill/runs.py)")
    m.add_argument("--overwrite", action="store_true", help="replace the run that a non-empty --out holds "
                   "(without --resume or --overwrite such an --out is refused)")
    m.add_argument("--seed", type=int, default=d.seed, help="seeds the training tasks, the instance order, every sample")
    m.add_argument("--heldout-seed", type=int, default=d.heldout_seed, help="seeds the held-out draw (--eval's "
                   "instances, the probe's), so runs of two --seed share their probe and evaluation (default %(default)s)")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads of this process and of the "
                   "embedded task-model server (default: torch's choice; 1 is much faster on a CPU that other busy "
                   "processes share)")
    e = p.add_argument_group("evaluation (--eval): the paper's rows on held-out instances")
    m.add_argument("--eval", action="store_true", help="evaluate instead of training: no skill, seed skill, "
                   "inference-only (--editor, frozen), vanilla GRPO (--grpo-editor), Skill-R1 (--skillr1-editor)")
    e.add_argument("--grpo-editor", default=None, help="editor trained with λ = 0 (vanilla GRPO row)")
    e.add_argument("--skillr1-editor", nargs="+", default=None, help="editor(s) trained with λ > 0: one Skill-R1 "
                   "row each (e.g. two training seeds)")
    e.add_argument("--frozen-row", action=argparse.BooleanOptionalAction, default=d.frozen_row, help="evaluate the "
                   "inference-only row (--editor, frozen); --no-frozen-row skips it, e.g. to add a Skill-R1 row to "
                   "a table already measured with the same flags (every row uses the same tasks and seeds; "
                   "python -m minskill.skill_r1.combine joins the runs' rows into one table)")
    e.add_argument("--eval-instances", type=int, default=d.eval_instances,
                   help="held-out instances (default %(default)s), task types "
                   "in turn; each has --tasks-per-instance tasks to evolve on and --eval-tasks others to score on")
    e.add_argument("--eval-scoring", choices=("own", "shared"), default=d.eval_scoring,
                   help="own (default): each instance is scored on --eval-tasks tasks of its own; shared: the "
                   "instances of a type evolve on tasks of their own and are all scored on the same --eval-tasks "
                   "tasks of that type, for a split too small for many disjoint instances (qa holds 81 held-out "
                   "arithmetic problems: own fits 12 instances of 4 + 20, shared 24 of 8 + 20; docs/skill-r1.md)")
    e.add_argument("--eval-tasks", type=int, default=d.eval_tasks,
                   help="held-out tasks that score an instance's carried "
                   "skill (default %(default)s: 240 scoring tasks per row)")
    args = p.parse_args(argv)
    if args.out is None and not args.eval:
        args.out = "runs/skill-r1"   # --eval names its folder by the time (skill_r1.evaluate.evaluate)
    if args.resume and not args.eval:   # the saved run's flags, before they are checked (the resume policy)
        restore_flags(args, given_flags(p, argv))
    resolve_run_device(p, args)
    for name in ("generations", "candidates", "rollouts", "steps", "instances_per_step", "micro_batch",
                 "tasks_per_instance", "ppo_epochs", "max_skill_tokens", "context_tokens", "task_max_tokens",
                 "save_every", "keep_checkpoints", "eval_instances", "eval_tasks", "probe_instances", "probe_candidates",
                 "task_concurrency"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.probe_every < 0:
        p.error("--probe-every must be >= 0 (0: no held-out probe)")
    if args.candidates < 2:
        p.error("--candidates must be at least 2: A_intra of a single candidate is always 0")
    if args.editor_temperature <= 0:
        p.error("--editor-temperature must be > 0: GRPO needs sampled candidates")
    if args.beta < 0 or args.lr <= 0 or not 0 <= args.warmup_ratio < 1:
        p.error("need --beta >= 0, --lr > 0 and 0 <= --warmup-ratio < 1")
    if not 0 < args.carry_gate_alpha <= 1:
        p.error("--carry-gate-alpha must be in (0, 1]")
    if args.eval and args.resume:
        p.error("--eval writes a new folder and has no --resume (--overwrite replaces one)")
    try:
        check_loss_config(args.lam, args.eps_low, args.eps_high, args.beta, args.agg)   # once, not per micro-batch
        lora_settings(args)   # checks the --lora-* flags; fills in --lora-alpha (2·R) and the target list
    except ValueError as e:
        p.error(str(e))
    try:
        check_heldout(args)   # exactly the instances asked for; the probe's tasks never among --eval's
    except ValueError as e:   # skill_r1.evaluate.HeldoutSplitError, or a trainer_state.pt that cannot be read
        p.error(str(e))
    return args


def resolve_run_device(p, args) -> None:
    """--device (a --resume restores the saved one unless given: checked again here), --bf16 following it when not
    set (on for CUDA), and --task-concurrency's default: the task-model requests of one generation."""
    check_resumed_device(p, args)
    resolve_bf16(args)
    if args.task_concurrency is None:
        args.task_concurrency = args.candidates * args.tasks_per_instance * args.instances_per_step


def main(argv=None) -> int:
    distributed.init()   # torchrun's ranks; nothing in one process
    with distributed.main_first():   # rank 0 first: --resume may finish a checkpoint save that a kill interrupted
        args = parse_args(argv)
    if distributed.world() > 1 and args.eval:
        sys.exit("train_grpo.py: --eval runs in one process (python, not torchrun)")
    if args.instances_per_step < distributed.world():
        sys.exit(f"train_grpo.py: --instances-per-step {args.instances_per_step} < {distributed.world()} ranks: "
                 f"each rank evolves at least one instance a step")
    release_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the embedded task-model server
    code = evaluate(args) if args.eval else train(args)
    distributed.close()
    return code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SuiteError, SkillsNotFound) as e:   # a bad --suite file, --seed-skills naming none: usage errors
        sys.exit(f"train_grpo.py: {e}")
    except TaskModelFailed as e:   # every rollout of a step, a probe or an --eval row failed
        sys.exit(f"train_grpo.py: {e}")
