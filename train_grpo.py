"""Skill-R1: train a skill editor with bi-level GRPO while the task model stays frozen behind HTTP.

    python train_grpo.py                              # offline default: SmolLM2-135M, qa suite
    python train_grpo.py --lam 0 --out runs/grpo      # vanilla GRPO (the paper's baseline)
    python train_grpo.py --task-url http://HOST:8000/v1 --task-model Qwen/Qwen3-8B --editor /path/E
    python train_grpo.py --eval --grpo-editor runs/grpo/checkpoint --skillr1-editor runs/r1/ckpt

What the defaults train: with --ppo-epochs 1 the ratio is exactly 1, so the PPO clip (--eps-low/
--eps-high) never acts and the update is REINFORCE with group-relative advantages A = A_intra +
λ·A_inter, unless --ppo-epochs > 1; the KL to the reference is off (no reference model) unless
--beta > 0; A_intra is divided by the group's std as in standard GRPO (--no-scale-by-std: not); and
G = --generations 2 (each generation costs ~0.7x the run again), while the paper analyses
generations 1-5: use -G 3 to 5 for a real run.

Decisions (in full: docs/skill-r1.md, "train_grpo.py's decisions in full"):
1. One step (`train_step`): pick instances, evolve each, A = A_intra + λ·A_inter, one update.
2. logp_old is the update's own first forward pass, detached: the ratio is 1 on the first pass.
3. Micro-batches hold one prompt each, weighted so that they add up to the whole batch's loss.
4. --shared-prefix (default) computes a micro-batch's prompt once for all its rows.
5. LoRA's reference (β > 0) is the editor with its adapters off; torchrun sums ranks' gradients."""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minskill import distributed
from minskill.cli import add_task_model_args, client_args
from minskill.device import add_device_args, check_resumed_device, resolve_bf16
from minskill.gates import GATES
from minskill.nn.compiled_decode import CompiledDecodeError
from minskill.nn.lora import ADAPTER_DIR, add_lora_arguments, lora_settings
from minskill.nn.optim import release_freed_memory
from minskill.nn.sampling import completion_logprobs
from minskill.nn.shared_prefix import shared_prefix_logprobs
from minskill.rollout import SkillsNotFound, skill_text
from minskill.runs import (check_run_folder, given_flags, resume_flags, restart_flags,
                           save_checkpoint)
from minskill.serve.embedded import embedded_client
from minskill.skill_r1.evaluate import (TaskModelFailed, check_heldout, evaluate, probe,
                                        probe_instances, restore_eval_flags, with_heldout_seed)
from minskill.skill_r1.grpo import INTER_SCALES, check_loss_config, policy_loss
from minskill.skill_r1.loop import (EvolveConfig, SuiteError, assign_advantages, autocast,
                                    evolve_batch, step_seed)
from minskill.skill_r1.records import (end_note, errors_note, log_step, metrics_row,
                                       step_over_ranks)
from minskill.skill_r1.run_setup import Run, resume_state, setup

# --resume (minskill.runs.resume_flags): flags that, given, must equal the checkpoint's, or the
# continued run would not be the same run; every other flag may change (where and how fast it runs,
# how far, what it writes)
RESUME_MUST_MATCH = ("suite", "seed_skills", "generations", "candidates", "rollouts", "lam",
                     "scale_by_std", "eps_low", "eps_high", "beta", "agg", "ppo_epochs",
                     "tasks_per_instance", "n_tasks", "editor_temperature", "editor_top_p",
                     "max_skill_tokens", "context_tokens", "task_max_tokens", "task_temperature",
                     "instances_per_step", "micro_batch", "lr", "weight_decay", "warmup_ratio",
                     "grad_clip", "bf16", "seed", "heldout_seed", "lora_rank", "lora_alpha",
                     "lora_dropout", "lora_targets", "lora_base_dtype", "carry_gate",
                     "carry_gate_alpha", "inter_scale")


def main(argv=None) -> int:
    distributed.init()   # torchrun's ranks; nothing in one process
    # rank 0 first: --resume may finish a checkpoint save that a kill interrupted
    with distributed.main_first():
        args = parse_args(argv)
    if distributed.world() > 1 and args.eval:
        sys.exit("train_grpo.py: --eval runs in one process (python, not torchrun)")
    if args.instances_per_step < distributed.world():
        sys.exit(f"train_grpo.py: --instances-per-step {args.instances_per_step} < "
                 f"{distributed.world()} ranks: each rank evolves at least one instance a step")
    release_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
        # inherited by the embedded task-model server
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    code = evaluate(args) if args.eval else train(args)
    distributed.close()
    return code


# ---------------------------------------------------------------------------------------- training


def train(args) -> int:
    """The Skill-R1 training loop (module docstring): each step `train_step` computes, then the
    recorder records."""
    run, cfg = setup(args), EvolveConfig.from_args(args)
    # torchrun: one client for all ranks
    with distributed.shared_client(embedded_client, **client_args(args, "task"),
                                   quantize=args.task_quantize,
                                   max_workers=args.task_concurrency) as client:
        recorder = StepRecorder(run, args, client)
        for step in range(run.start_step, args.steps):
            recorder.begin()
            recorder.end(step, *train_step(run, args, cfg, client, step))
        calls = client.stats["calls"]
    print_summary(run, args, calls)
    return 0


def train_step(run: Run, args, cfg: EvolveConfig, client,
               step: int) -> tuple[list, list, dict, float]:
    """One step: evolve a batch, advantages, one GRPO update; (evolutions, candidates, stats,
    sampling end time)."""
    # 1. pick this step's instances (torchrun: this rank's share; j, an instance's place in the
    #    step, seeds it)
    batch = [run.instances[i]
             for i in instance_order(len(run.instances), step, args.instances_per_step, args.seed)]
    batch, places = distributed.share(batch)
    # 2. evolve: G generations of K candidate skills on each, scored by the frozen task model
    run.editor.eval()
    with autocast(args.bf16, run.editor.device):
        evolutions = evolve_batch(run.editor, run.tokenizer, client, batch, cfg,
                                  seeds=[step_seed(args.seed, step, j) for j in places],
                                  seed_skills=[skill_text(run.seed_skills, x.type) for x in batch])
    t_sampled = time.time()
    # 3. advantages: A = A_intra + λ·A_inter on every candidate
    candidates = assign_advantages(evolutions, args.lam, args.scale_by_std, args.inter_scale)
    # 4. policy update: the clipped GRPO loss over all candidates' tokens
    run.editor.train()
    stats = policy_update(run.editor, run.ref_model, run.optimizer, candidates, args)
    run.scheduler.step()
    return evolutions, candidates, stats, t_sampled


def instance_order(n_instances: int, step: int, per_step: int, seed: int) -> list[int]:
    """`step`'s instances: passes over a seeded permutation, a pure function of (step, seed) that a
    resume repeats."""
    picks = []
    for j in range(per_step):
        epoch, pos = divmod(step * per_step + j, n_instances)
        perm = list(range(n_instances))
        random.Random(seed * 7919 + epoch).shuffle(perm)
        picks.append(perm[pos])
    return picks


def policy_update(editor, ref_model, optimizer, candidates, args) -> dict:
    """--ppo-epochs optimizer steps of the clipped GRPO loss (module docstring: old log-probs,
    micro-batch weights)."""
    beta = args.beta if ref_model is not None else 0.0
    seqs = [c for c in candidates if c.token_ids]
    total_tokens, total_seqs = distributed.sum_over_ranks(sum(len(c.token_ids) for c in seqs),
                                                          len(seqs))
    # a candidate with A = 0 has zero policy gradient; without a KL term it would only cost compute
    train = [c for c in seqs if c.advantage != 0.0 or beta > 0]
    n_tok = sum(len(c.token_ids) for c in train)
    keys = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")
    sums, old_logps, loss, mismatch, grad_norm = dict.fromkeys(keys, 0.0), [], 0.0, 0.0, 0.0
    # with no batch (e.g. every reward 0) the optimizer still steps, a no-op, so the schedule stays
    # in sync
    for epoch in range(args.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for k, mb in enumerate(micro_batches(train, args.micro_batch)):
            # --shared-prefix: the micro-batch's one prompt computed once
            with autocast(args.bf16, editor.device):
                logp, mask = (shared_prefix_logprobs(editor, mb[0].prompt_ids,
                                                     [c.token_ids for c in mb],
                                                     temperature=args.editor_temperature)
                              if args.shared_prefix else unshared_logprobs(editor, mb, args))
                ref_logp = reference_logprobs(ref_model, mb, args) if beta > 0 else None
            # the weights that sampled are unchanged so far: logp_old = this pass, detached
            if epoch == 0:
                old_logps.append(logp.detach())
                sampled = torch.tensor([list(c.logprobs) + [0.0] * (logp.shape[1] - len(c.logprobs))
                                        for c in mb],
                                       dtype=torch.float32, device=logp.device)
                mismatch += float(((sampled - logp.detach()).abs() * mask).sum())
            mb_loss, st = policy_loss(logp, old_logps[k], [c.advantage for c in mb], mask,
                                      ref_logp=ref_logp, eps_low=args.eps_low,
                                      eps_high=args.eps_high, beta=beta, agg=args.agg,
                                      max_new_tokens=args.max_skill_tokens)
            mb_tokens = sum(len(c.token_ids) for c in mb)
            weight = mb_tokens / total_tokens if args.agg == "token_mean" else len(mb) / total_seqs
            (mb_loss * weight).backward()
            loss += float(mb_loss.detach()) * weight
            for key in keys:
                sums[key] += st[key] * mb_tokens
        # torchrun: summed over the ranks, so every rank steps alike
        distributed.all_reduce_grads(editor)
        params = [p for p in editor.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, args.grad_clip if args.grad_clip > 0
                                              else math.inf)
        grad_norm += float(norm) / args.ppo_epochs
        optimizer.step()
    return {"loss": loss / args.ppo_epochs,
            **{key: sums[key] / max(n_tok * args.ppo_epochs, 1) for key in keys},
            "logp_mismatch": mismatch / max(1, n_tok), "grad_norm": grad_norm,
            "train_tokens": n_tok * args.ppo_epochs, "trained_sequences": len(train)}


def micro_batches(rows: list, size: int) -> list[list]:
    """Micro-batches of at most `size` rows of one prompt each (the update's memory: one prompt's
    activations)."""
    groups: dict[tuple[int, ...], list] = {}
    for row in rows:
        groups.setdefault(tuple(row.prompt_ids), []).append(row)
    return [group[i:i + size] for group in groups.values() for i in range(0, len(group), size)]


def unshared_logprobs(model, mb: list, args):
    """--no-shared-prefix: the same log-probs with the prompt run once per row
    (sampling.completion_logprobs)."""
    return completion_logprobs(model, [c.prompt_ids for c in mb], [c.token_ids for c in mb],
                               temperature=args.editor_temperature)


@torch.no_grad()
def reference_logprobs(ref_model, mb: list, args) -> torch.Tensor:
    """β > 0: the frozen reference's log-probs of the micro-batch, for the KL term (by the update's
    own route)."""
    if args.shared_prefix:
        return shared_prefix_logprobs(ref_model, mb[0].prompt_ids, [c.token_ids for c in mb],
                                      temperature=args.editor_temperature)[0]
    return unshared_logprobs(ref_model, mb, args)[0]


# ----------------------------------------- recording each step (bookkeeping: off the reading path)


class StepRecorder:
    """`train`'s bookkeeping around each step (minskill.skill_r1.records writes the rows): `begin`
    notes the clock, the task model's usage and the lr before train_step; `end` puts the ranks' step
    together, probes the held-out instances every --probe-every steps, logs the step, and saves the
    checkpoint every --save-every steps (both also after the last)."""

    def __init__(self, run: Run, args, client):
        self.run, self.args, self.client, self.t_run = run, args, client, time.time()
        # --probe-every: held-out instances, fixed for the run and never among --eval's
        self.probe_set = probe_instances(args) if args.probe_every else []
        # a fresh run probes the editor before any training too
        fresh = run.start_step == 0 and args.probe_every
        self.probes = [held_out_probe(run, self.probe_set, client, args, 0)] if fresh else []

    def begin(self) -> None:
        self.t0, self.usage0 = time.time(), self.client.usage
        self.lr = self.run.optimizer.param_groups[0]["lr"]   # the lr the step's update uses

    def end(self, step: int, evolutions, candidates, stats: dict, t_sampled: float) -> None:
        run, args = self.run, self.args
        evolutions, candidates, stats, usage = step_over_ranks(evolutions, candidates, stats,
                                                               self.client.usage, self.usage0)
        row = metrics_row(step, evolutions, candidates, stats, usage, self.t0, t_sampled, self.lr)
        if args.probe_every and ((step + 1) % args.probe_every == 0 or step + 1 == args.steps):
            self.probes.append(held_out_probe(run, self.probe_set, self.client, args, step + 1))
        log_step(run, args, {**row, "probes": self.probes}, self.t0, self.t_run, evolutions)
        self.probes = []
        if distributed.is_main() and ((step + 1) % args.save_every == 0 or step + 1 == args.steps):
            state = {"step": step + 1, "optimizer": run.optimizer.state_dict(),
                     "scheduler": run.scheduler.state_dict(), "args": vars(args),
                     "editor_spec": run.editor_spec, "metrics": run.rows}
            save_checkpoint(run.out / "checkpoint", run.editor, run.tokenizer,
                            keep=args.keep_checkpoints, state=state)


def held_out_probe(run: Run, instances: list, client, args, after_steps: int) -> dict:
    """The current editor scored on the fixed held-out probe instances (skill_r1.evaluate.probe);
    printed. torchrun: rank 0 alone probes (its editor equals every rank's) and records it; the
    others get {}."""
    if not distributed.is_main():
        return {}
    run.editor.eval()
    seed_skills = [skill_text(run.seed_skills, x.type) for x in instances]
    result = {"after_steps": after_steps,
              **probe(run.editor, run.tokenizer, client, instances, seed_skills, args)}
    print(f"held-out probe after {after_steps} steps: seed skill → mean candidate reward " +
          " → ".join(f"{r:.2f}" for r in result["reward_per_generation"]) +
          f" | carried {result['carried_reward']:.2f} | {result['beat_seed_share']:.0%} of "
          f"candidates beat the seed skill{errors_note(result)} | {result['seconds']:.0f} s",
          flush=True)
    return result


def print_summary(run: Run, args, calls: int) -> None:
    """The end of the run: first and last step's rewards, the best edited skill, what was
    written."""
    # torchrun: every rank's calls; rank 0 prints
    rows, calls = run.rows, distributed.sum_over_ranks(calls)
    if rows:
        first, last = rows[0], rows[-1]
        print(f"\ndone: {len(rows)} steps. Mean candidate reward per generation (g=0 is the seed "
              f"skill): first step {[round(r, 2) for r in first['reward_per_generation']]}, last "
              f"step {[round(r, 2) for r in last['reward_per_generation']]}; task-model calls this "
              f"session: {calls}.")
        if note := end_note(run.tasks, rows):   # all rewards 0, or replies cut while thinking
            print(note)
        best = max(rows, key=lambda r: (r["best_skill_gain"], r["best_skill_reward"]))
        if best["best_skill_gain"] > 0:
            print(f"best edited skill: reward {best['best_skill_reward']:.2f} on "
                  f"{best['best_skill_instance']} (+{best['best_skill_gain']:.2f} over its seed "
                  f"skill), step {best['step'] + 1}:\n{best['best_skill'].strip()[:600]}")
        else:
            print("no edited skill beat its instance's seed skill in this run.")
    adapter = f", its LoRA adapter alone in {ADAPTER_DIR}/ (PEFT layout)" if args.lora_rank else ""
    print(f"wrote {run.out / 'checkpoint'} (editor in HF "
          f"layout{' (merged)' if args.lora_rank else ''}{adapter} + trainer_state.pt), "
          f"{run.out / 'metrics.jsonl'}, {run.out / 'lineage.jsonl'}, "
          f"{run.out / 'reward_curve.svg'}; python -m minskill.report {run.out} draws the run as "
          "one HTML page")


# ------------------------------------------------------------------------------------ command line


@dataclass
class TrainConfig(EvolveConfig):
    """Every default of this script's flags, written once (argparse reads them; the loop's own knobs
    are EvolveConfig's fields, inherited with their defaults; the --lora-* flags' defaults are
    minskill.nn.lora's)."""
    editor: str = "smollm2-135m"
    # None: one generation's requests (K × tasks per instance × instances)
    task_concurrency: int | None = None
    task_quantize: str = "none"
    suite: str = "qa"
    seed_skills: str = "none"
    lam: float = 0.5                  # λ, weight of A_inter; 0 = vanilla GRPO
    scale_by_std: bool = True
    inter_scale: str = "pooled-std"   # A_inter's divisor (grpo.inter_divisor): chosen by the λ
                                      # sweep (docs/results-skill-r1.md); raw: the paper's
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
    heldout_seed: int = 0             # the held-out draw (--eval, the probe), not --seed's
    frozen_row: bool = True
    eval_instances: int = 12
    eval_tasks: int = 20
    eval_scoring: str = "own"
    eval_chunk: int = 0               # 0: all --eval instances at once


def parse_args(argv=None) -> argparse.Namespace:
    d = TrainConfig()
    title, examples, defaults = __doc__.split("\n\n")[:3]
    p = argparse.ArgumentParser(usage="%(prog)s [main options] [other options, grouped below]",
                                description=f"{title}\n\n{defaults}",
                                epilog=f"examples:\n{examples}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("main options")
    c = p.add_argument_group("components")
    m.add_argument("--editor", default=d.editor,
                   help="the skill editor to train: an HF model folder or "
                   "smollm2-135m (the offline default; default)")
    add_task_model_args(c, concurrency=d.task_concurrency, max_tokens=d.task_max_tokens,
                        quantize=d.task_quantize, main=m)
    m.add_argument("--suite", default=d.suite,
                   help="task suite: qa | household | webwalk | webshop | searchqa | PATH.jsonl "
                   "(default %(default)s)")
    c.add_argument("--n-tasks", type=int, default=None,
                   help="tasks drawn from the suite per split (default: "
                   "the suite's own, e.g. 50 per type for qa)")
    m.add_argument("--seed-skills", default=d.seed_skills,
                   help="the seed skill s_0 of each instance: none (default), "
                   "base (the suite's hand-written skills), a skill-set folder, a MASA .json, or a "
                   "text file")
    a = p.add_argument_group("algorithm (docs/skill-r1.md)")
    m.add_argument("-G", "--generations", type=int, default=d.generations,
                   help="generations G per instance (default %(default)s)")
    m.add_argument("-K", "--candidates", type=int, default=d.candidates,
                   help="candidate skills K per generation (default %(default)s)")
    a.add_argument("-n", "--rollouts", type=int, default=d.rollouts,
                   help="task-model rollouts per skill and task "
                   "(default %(default)s: enough with the greedy task model)")
    m.add_argument("--lam", type=float, default=d.lam,
                   help="λ, weight of A_inter (0 = vanilla GRPO; default %(default)s)")
    a.add_argument("--inter-scale", choices=INTER_SCALES, default=d.inter_scale,
                   help="A_inter's scale: pooled-std (default: A_inter / the std of the "
                        "instance's rewards over its generations, so λ = 1 weighs the two levels "
                        "alike; chosen by a λ sweep on the held-out probe, "
                        "docs/results-skill-r1.md) or raw (the paper's A_intra + λ·A_inter); "
                        "skill_r1/grpo.py")
    a.add_argument("--scale-by-std", action=argparse.BooleanOptionalAction, default=d.scale_by_std,
                   help="divide A_intra by the group's std + 1e-4, as standard GRPO does (on by "
                        "default: measured on the learning test, docs/skill-r1.md; "
                   "--no-scale-by-std: Dr. GRPO's unscaled A_intra)")
    a.add_argument("--eps-low", type=float, default=d.eps_low,
                   help="clip range below 1 (default %(default)s)")
    a.add_argument("--eps-high", type=float, default=d.eps_high,
                   help="clip range above 1 (default %(default)s)")
    a.add_argument("--beta", type=float, default=d.beta,
                   help="weight of the k3 KL to a frozen reference copy of "
                   "the editor; 0 (default) keeps no reference model")
    a.add_argument("--agg", default=d.agg, choices=["token_mean", "seq_mean", "dr_grpo"],
                   help="loss aggregation (default %(default)s)")
    a.add_argument("--ppo-epochs", type=int, default=d.ppo_epochs,
                   help="optimizer passes over each step's samples "
                   "(default %(default)s)")
    a.add_argument("--tasks-per-instance", type=int, default=d.tasks_per_instance,
                   help="tasks of one type forming one instance x (default %(default)s)")
    a.add_argument("--editor-temperature", type=float, default=d.editor_temperature,
                   help="editor sampling temperature (default 1)")
    a.add_argument("--editor-top-p", type=float, default=d.editor_top_p,
                   help="editor nucleus sampling (default 1)")
    a.add_argument("--max-skill-tokens", type=int, default=d.max_skill_tokens,
                   help="longest skill the editor may write, in "
                   "tokens (default %(default)s)")
    a.add_argument("--context-tokens", type=int, default=d.context_tokens,
                   help="token budget of the editor's prompt; the "
                   "history is trimmed to fit (default %(default)s)")
    a.add_argument("--task-temperature", type=float, default=d.task_temperature,
                   help="task-model sampling temperature "
                   "(default 0 = greedy)")
    a.add_argument("--carry-gate", choices=GATES, default=d.carry_gate,
                   help="when a generation's best candidate "
                   "replaces the current skill: strict = its reward is higher (the paper); paired "
                   "= also a one-sided sign test on the instance's tasks at --carry-gate-alpha "
                   "(minskill/gates.py; default %(default)s)")
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
    t.add_argument("--lr", type=float, default=d.lr,
                   help="AdamW peak learning rate (default %(default)s)")
    t.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help="AdamW weight decay (default 0)")
    t.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio,
                   help="share of steps with linear warmup, then "
                   "cosine decay to 0 (default %(default)s)")
    t.add_argument("--grad-clip", type=float, default=d.grad_clip,
                   help="clip the gradient norm to this (0 = off)")
    # --device, --bf16/--no-bf16 (docs/gpu.md)
    add_device_args(t, what="the editor and the embedded task model run")
    add_lora_arguments(t)
    t.add_argument("--compile-decode", action="store_true",
                   help="the editor decodes with a static KV cache and a torch.compile'd step "
                        "(CUDA graphs on a GPU): fewer kernel launches a token, a compile first; "
                        "not with --lora-rank (docs/gpu.md, 'Compiled decoding')")
    t.add_argument("--grad-checkpointing", action="store_true",
                   help="recompute each layer in the backward "
                   "pass (less memory, more time)")
    t.add_argument("--shared-prefix", action=argparse.BooleanOptionalAction,
                   default=d.shared_prefix,
                   help="compute the editor prompt a group's candidates share once per "
                        "micro-batch, forward and backward (same gradient; default on)")
    t.add_argument("--probe-every", type=int, default=d.probe_every,
                   help="every M steps (and before the first and after "
                   "the last) score the editor on fixed held-out probe instances: metrics.jsonl's "
                   "probes, the held-out curve of reward_curve.svg (default 0 = no probe)")
    t.add_argument("--probe-instances", type=int, default=d.probe_instances,
                   help="held-out probe instances, task types in turn, "
                   "never among --eval's (default %(default)s)")
    t.add_argument("--probe-candidates", type=int, default=d.probe_candidates,
                   help="skills the editor writes per probe instance, "
                   "in one generation from the seed skill's feedback (default %(default)s)")
    t.add_argument("--save-every", type=int, default=d.save_every,
                   help="write the checkpoint every N steps and at the end")
    t.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                   help="checkpoints kept: OUT/checkpoint "
                   "is the newest, older ones OUT/checkpoint-step-S (default %(default)s: each "
                   "save replaces the last)")
    m.add_argument("--out", default=None,
                   help="output folder: training: checkpoint/, metrics.jsonl, lineage.jsonl, "
                   "reward_curve.svg (default runs/skill-r1); --eval: eval.json (default "
                   "runs/skill-r1-eval-TIME)")
    m.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint; the next steps equal "
                   "those of an uninterrupted run (the resume policy: minskill/runs.py); --eval: "
                   "continue OUT/eval.json after its last whole row or --eval-chunk")
    m.add_argument("--overwrite", action="store_true",
                   help="replace the run that a non-empty --out holds "
                   "(without --resume or --overwrite such an --out is refused)")
    m.add_argument("--seed", type=int, default=d.seed,
                   help="seeds the training tasks, the instance order, every sample")
    m.add_argument("--heldout-seed", type=int, default=d.heldout_seed,
                   help="seeds the held-out draw (--eval's "
                   "instances, the probe's), so runs of two --seed share their probe and "
                   "evaluation (default %(default)s)")
    t.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads of this process and of the "
                   "embedded task-model server (default: torch's choice; 1 is much faster on a CPU "
                   "that other busy processes share)")
    e = p.add_argument_group("evaluation (--eval): the paper's rows on held-out instances")
    m.add_argument("--eval", action="store_true",
                   help="evaluate instead of training: no skill, seed skill, "
                   "inference-only (--editor, frozen), vanilla GRPO (--grpo-editor), Skill-R1 "
                   "(--skillr1-editor)")
    e.add_argument("--grpo-editor", default=None,
                   help="editor trained with λ = 0 (vanilla GRPO row)")
    e.add_argument("--skillr1-editor", nargs="+", default=None,
                   help="editor(s) trained with λ > 0: one Skill-R1 "
                   "row each (e.g. two training seeds)")
    e.add_argument("--frozen-row", action=argparse.BooleanOptionalAction, default=d.frozen_row,
                   help="evaluate the "
                   "inference-only row (--editor, frozen); --no-frozen-row skips it, e.g. to add a "
                   "Skill-R1 row to a table already measured with the same flags (every row uses "
                   "the same tasks and seeds; python -m minskill.measure.combine joins the runs' "
                   "rows into one table)")
    e.add_argument("--eval-instances", type=int, default=d.eval_instances,
                   help="held-out instances (default %(default)s), task types "
                   "in turn; each has --tasks-per-instance tasks to evolve on and --eval-tasks "
                   "others to score on")
    e.add_argument("--eval-scoring", choices=("own", "shared"), default=d.eval_scoring,
                   help="own (default): each instance is scored on --eval-tasks tasks of its own; "
                   "shared: the instances of a type evolve on tasks of their own and are all "
                   "scored on the same --eval-tasks tasks of that type, for a split too small for "
                   "many disjoint instances (docs/skill-r1.md)")
    e.add_argument("--eval-tasks", type=int, default=d.eval_tasks,
                   help="held-out tasks that score an instance's carried "
                   "skill (default %(default)s: 240 scoring tasks per row)")
    e.add_argument("--eval-chunk", type=int, default=d.eval_chunk,
                   help="evaluate the instances this many at a time (default %(default)s: all at "
                   "once); eval.json is rewritten after each chunk of each row, so --resume "
                   "continues a killed evaluation after its last whole chunk. An editor evolves a "
                   "chunk's instances in one batch, each with its own seeds: two chunk sizes "
                   "differ at most by the rounding of batched arithmetic, two runs of one size "
                   "not at all")
    args = p.parse_args(argv)
    if args.out is None and not args.eval:
        args.out = "runs/skill-r1"   # --eval names its folder by the time
                                     # (skill_r1.evaluate.evaluate)
    if args.resume and args.eval:   # the saved flags, before they are checked (the resume policy)
        restore_eval_flags(args, given_flags(p, argv), p)
    elif args.resume:
        restore_flags(args, given_flags(p, argv))
    resolve_run_device(p, args)
    for name in ("generations", "candidates", "rollouts", "steps", "instances_per_step",
                 "micro_batch",
                 "tasks_per_instance", "ppo_epochs", "max_skill_tokens", "context_tokens",
                 "task_max_tokens",
                 "save_every", "keep_checkpoints", "eval_instances", "eval_tasks",
                 "probe_instances", "probe_candidates",
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
    if args.compile_decode and args.lora_rank:
        p.error("--compile-decode does not cover LoRA adapters (--lora-rank): run without it")
    if args.eval_chunk < 0:
        p.error("--eval-chunk must be >= 0 (0: all instances at once)")
    try:
        # once, not per micro-batch
        check_loss_config(args.lam, args.eps_low, args.eps_high, args.beta, args.agg)
        lora_settings(args)   # checks the --lora-* flags; fills in --lora-alpha (2·R) and the
                              # target list
    except ValueError as e:
        p.error(str(e))
    try:
        check_heldout(args)   # exactly the instances asked for; the probe's tasks never among
                              # --eval's
    except ValueError as e:   # skill_r1.evaluate.HeldoutSplitError, or a trainer_state.pt that
                              # cannot be read
        p.error(str(e))
    return args


def resolve_run_device(p, args) -> None:
    """--device (a --resume restores the saved one unless given: checked again here), --bf16
    following it when not set (on for CUDA), and --task-concurrency's default: the task-model
    requests of one generation."""
    check_resumed_device(p, args)
    resolve_bf16(args)
    if args.task_concurrency is None:
        args.task_concurrency = args.candidates * args.tasks_per_instance * args.instances_per_step


def restore_flags(args, given: set[str]) -> None:
    """--resume: the checkpoint's flags where none is given (the resume policy,
    minskill.runs.resume_flags): a given flag of RESUME_MUST_MATCH that differs is refused, naming
    it with both values."""
    # before the checkpoint is read
    check_run_folder(args.out, args.resume, args.overwrite, "train_grpo.py")
    state = resume_state(Path(args.out), mmap=True)[1]   # None: a run started again (said so)
    saved = with_heldout_seed(state["args"] if state else restart_flags(args.out, "train_grpo.py"))
    saved = {"inter_scale": "raw", **saved}   # runs saved before --inter-scale had the raw form
    changed = resume_flags(args, saved, given, set(vars(args)) - set(RESUME_MUST_MATCH),
                           "train_grpo.py")
    if any(note.startswith("--steps ") for note in changed):
        print(f"note: --steps {saved['steps']} -> {args.steps} changes the cosine schedule")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SuiteError, SkillsNotFound) as e:   # a bad --suite file, --seed-skills naming none:
                                                # usage errors
        sys.exit(f"train_grpo.py: {e}")
    except TaskModelFailed as e:   # every rollout of a step, a probe or an --eval row failed
        sys.exit(f"train_grpo.py: {e}")
    except CompiledDecodeError as e:   # --compile-decode: torch.compile failed here (no compiler)
        sys.exit(f"train_grpo.py: {e}")
