"""Skill-R1: train a skill editor with bi-level GRPO while the task model stays frozen behind HTTP.

    python train_grpo.py                                    # offline default: SmolLM2-135M as editor and as
                                                            # (embedded) task model, built-in qa suite
    python train_grpo.py --lam 0 --out runs/grpo            # vanilla GRPO (the paper's baseline)
    python train_grpo.py --task-url http://localhost:8000/v1 --task-model Qwen/Qwen3-8B --editor /path/Qwen3-4B
    python train_grpo.py --eval --grpo-editor runs/grpo/checkpoint --skillr1-editor runs/skill-r1/checkpoint

One training step (DESIGN.md §3): for each of --instances-per-step task instances (tasks of one type) the
editor runs the G-generation loop of minskill.skill_r1 (K candidate skills per generation sampled from one
shared prompt, each scored by n task-model rollouts per task); every candidate gets
A = A_intra + λ·A_inter (minskill.grpo.bilevel_advantages); then one optimizer step (per --ppo-epochs)
minimises the clipped policy loss of minskill.grpo.policy_loss over all candidates' tokens, with gradient
accumulation over micro-batches.

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

The loss value sits near zero by construction (advantages are centred); watch the reward instead:
metrics.jsonl (one JSON line per step) and reward_curve.svg in the output folder.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

from minskill.runs import (TRAINER_STATE, check_run_folder, load_trainer_state, lr_factor, open_run_folder,
                           recover_checkpoint, save_checkpoint, set_rng_state, write_jsonl_atomic)

# flags that must equal the checkpoint's when resuming, or the continued run would not be the same run
RESUME_MUST_MATCH = ("suite", "seed_skills", "generations", "candidates", "rollouts", "lam", "scale_by_std",
                     "eps_low", "eps_high", "beta", "agg", "ppo_epochs", "tasks_per_instance", "n_tasks",
                     "editor_temperature", "editor_top_p", "max_skill_tokens", "context_tokens",
                     "task_max_tokens", "task_temperature", "instances_per_step", "micro_batch", "lr",
                     "weight_decay", "warmup_ratio", "grad_clip", "bf16", "seed")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c = p.add_argument_group("components")
    c.add_argument("--editor", default="smollm2-135m", help="the skill editor to train: an HF model folder or "
                   "smollm2-135m (the offline default; default)")
    c.add_argument("--task-url", default=None, help="OpenAI-compatible base URL of the frozen task model, e.g. "
                   "http://127.0.0.1:8000/v1 (default: start the embedded server with the offline default "
                   "model on a free loopback port)")
    c.add_argument("--task-model", default=None, help="model name sent to --task-url (default: the first one "
                   "the server lists)")
    c.add_argument("--task-api-key", default=None, help="API key for --task-url (default: $OPENAI_API_KEY)")
    c.add_argument("--suite", default="qa", help="task suite: qa | household | webwalk | PATH.jsonl (default qa)")
    c.add_argument("--n-tasks", type=int, default=None, help="tasks drawn from the suite per split (default: "
                   "the suite's own, e.g. 50 per type for qa)")
    c.add_argument("--seed-skills", default="none", help="the seed skill s_0 of each instance: none (default), "
                   "base (the suite's hand-written skills), a skill-set folder, a MASA .json, or a text file")
    a = p.add_argument_group("algorithm (DESIGN.md §3)")
    a.add_argument("-G", "--generations", type=int, default=2, help="generations G per instance (default 2)")
    a.add_argument("-K", "--candidates", type=int, default=4, help="candidate skills K per generation (default 4)")
    a.add_argument("-n", "--rollouts", type=int, default=1, help="task-model rollouts per skill and task "
                   "(default 1: enough with the greedy task model)")
    a.add_argument("--lam", type=float, default=0.5, help="λ, weight of A_inter (0 = vanilla GRPO; default 0.5)")
    a.add_argument("--scale-by-std", action="store_true", help="divide A_intra by the group's std + 1e-4")
    a.add_argument("--eps-low", type=float, default=0.2, help="clip range below 1 (default 0.2)")
    a.add_argument("--eps-high", type=float, default=0.2, help="clip range above 1 (default 0.2)")
    a.add_argument("--beta", type=float, default=0.0, help="weight of the k3 KL to a frozen reference copy of "
                   "the editor; 0 (default) keeps no reference model")
    a.add_argument("--agg", default="token_mean", choices=["token_mean", "seq_mean", "dr_grpo"],
                   help="loss aggregation (default token_mean)")
    a.add_argument("--ppo-epochs", type=int, default=1, help="optimizer passes over each step's samples "
                   "(default 1)")
    a.add_argument("--tasks-per-instance", type=int, default=4, help="tasks of one type forming one instance "
                   "x (default 4)")
    a.add_argument("--editor-temperature", type=float, default=1.0, help="editor sampling temperature (default 1)")
    a.add_argument("--editor-top-p", type=float, default=1.0, help="editor nucleus sampling (default 1)")
    a.add_argument("--max-skill-tokens", type=int, default=64, help="longest skill the editor may write, in "
                   "tokens (default 64)")
    a.add_argument("--context-tokens", type=int, default=512, help="token budget of the editor's prompt; the "
                   "history is trimmed to fit (default 512)")
    a.add_argument("--task-max-tokens", type=int, default=32, help="longest task-model reply (default 32)")
    a.add_argument("--task-temperature", type=float, default=0.0, help="task-model sampling temperature "
                   "(default 0 = greedy)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3: about 10 minutes on a busy 2-core "
                   "CPU)")
    t.add_argument("--instances-per-step", type=int, default=1, help="instances per step; their candidates "
                   "form one batch (default 1)")
    t.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward pass; gradients "
                   "accumulate over micro-batches (default 4)")
    t.add_argument("--lr", type=float, default=1e-5, help="AdamW peak learning rate (default 1e-5)")
    t.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    t.add_argument("--warmup-ratio", type=float, default=0.1, help="share of steps with linear warmup, then "
                   "cosine decay to 0 (default 0.1)")
    t.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm to this (0 = off)")
    t.add_argument("--bf16", action="store_true", help="bfloat16 autocast for sampling and training "
                   "(weights and optimizer stay float32)")
    t.add_argument("--grad-checkpointing", action="store_true", help="recompute each layer in the backward "
                   "pass (less memory, more time)")
    t.add_argument("--save-every", type=int, default=2, help="write the checkpoint every N steps and at the end")
    t.add_argument("--out", default="runs/skill-r1", help="output folder: checkpoint/, metrics.jsonl, "
                   "reward_curve.svg (default runs/skill-r1)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint; the next steps equal "
                   "those of an uninterrupted run")
    t.add_argument("--overwrite", action="store_true", help="replace the run that a non-empty --out holds "
                   "(without --resume or --overwrite such an --out is refused)")
    t.add_argument("--seed", type=int, default=0, help="seeds the suite, the instance order, every sample")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads of this process and of the "
                   "embedded task-model server (default: torch's choice; 1 is much faster on a CPU that other busy "
                   "processes share)")
    e = p.add_argument_group("evaluation (--eval): the paper's rows on held-out instances")
    e.add_argument("--eval", action="store_true", help="evaluate instead of training: no skill, seed skill, "
                   "inference-only (--editor, frozen), vanilla GRPO (--grpo-editor), Skill-R1 (--skillr1-editor)")
    e.add_argument("--grpo-editor", default=None, help="editor trained with λ = 0 (vanilla GRPO row)")
    e.add_argument("--skillr1-editor", default=None, help="editor trained with λ > 0 (Skill-R1 row)")
    e.add_argument("--eval-instances", type=int, default=8, help="held-out instances (default 8); each has "
                   "tasks-per-instance tasks to evolve on and as many other tasks to score the skill on")
    args = p.parse_args(argv)
    for name in ("generations", "candidates", "rollouts", "steps", "instances_per_step", "micro_batch",
                 "tasks_per_instance", "ppo_epochs", "max_skill_tokens", "context_tokens", "task_max_tokens",
                 "save_every", "eval_instances"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.candidates < 2:
        p.error("--candidates must be at least 2: A_intra of a single candidate is always 0")
    if args.editor_temperature <= 0:
        p.error("--editor-temperature must be > 0: GRPO needs sampled candidates")
    if args.beta < 0 or args.lr <= 0 or not 0 <= args.warmup_ratio < 1:
        p.error("need --beta >= 0, --lr > 0 and 0 <= --warmup-ratio < 1")
    return args


def autocast(args):
    """bf16 autocast when asked: matmuls in bfloat16, weights and AdamW state in float32 (pure bf16 weights
    would round away updates of lr·1 relative size below 2^-8)."""
    return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16) \
        if args.bf16 else contextlib.nullcontext()


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# ---------------------------------------------------------------------------------------------- training


def _padded(rows: list[list[float]], width: int, device) -> torch.Tensor:
    return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32, device=device)


def policy_update(editor, ref_model, optimizer, candidates, args) -> dict:
    """--ppo-epochs optimizer steps of the clipped GRPO loss over the candidates (see the module docstring
    for old log-probs and micro-batch weighting). Returns token-weighted means of policy_loss's stats."""
    from minskill.grpo import policy_loss
    from minskill.sampling import completion_logprobs

    beta = args.beta if ref_model is not None else 0.0
    seqs = [c for c in candidates if c.token_ids]
    total_tokens, total_seqs = sum(len(c.token_ids) for c in seqs), len(seqs)
    # a candidate with A = 0 has zero policy gradient; without a KL term it would only cost compute
    train = [c for c in seqs if c.advantage != 0.0 or beta > 0]
    batches = [train[i:i + args.micro_batch] for i in range(0, len(train), args.micro_batch)]
    keys = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean")
    stats = {"loss": 0.0, **{k: 0.0 for k in keys}, "logp_mismatch": 0.0, "grad_norm": 0.0,
             "train_tokens": 0, "trained_sequences": len(train)}
    if not batches:  # nothing to learn from (e.g. every reward 0); step anyway so the schedule stays in sync
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()  # a no-op: AdamW skips parameters without a gradient
        return stats
    old_logps: list[torch.Tensor] = []
    sums, n_tok, mismatch = {k: 0.0 for k in ("loss", *keys)}, 0, 0.0
    for epoch in range(args.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for k, mb in enumerate(batches):
            prompts, completions = [c.prompt_ids for c in mb], [c.token_ids for c in mb]
            with autocast(args):
                logp, mask = completion_logprobs(editor, prompts, completions, temperature=args.editor_temperature)
            if epoch == 0:
                old_logps.append(logp.detach())
                sampled = _padded([c.logprobs for c in mb], logp.shape[1], logp.device)
                mismatch += float(((sampled - logp.detach()).abs() * mask).sum())
            ref_logp = None
            if beta > 0:
                with torch.no_grad(), autocast(args):
                    ref_logp, _ = completion_logprobs(ref_model, prompts, completions,
                                                      temperature=args.editor_temperature)
            adv = torch.tensor([c.advantage for c in mb], dtype=torch.float32, device=logp.device)
            loss, st = policy_loss(logp, old_logps[k], adv, mask, ref_logp=ref_logp, eps_low=args.eps_low,
                                   eps_high=args.eps_high, beta=beta, agg=args.agg,
                                   max_new_tokens=args.max_skill_tokens)
            mb_tokens = sum(len(c) for c in completions)
            weight = mb_tokens / total_tokens if args.agg == "token_mean" else len(mb) / total_seqs
            (loss * weight).backward()
            sums["loss"] += float(loss.detach()) * weight
            for key in keys:
                sums[key] += st[key] * mb_tokens
            n_tok += mb_tokens
        params = [p for p in editor.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, args.grad_clip if args.grad_clip > 0 else float("inf"))
        stats["grad_norm"] += float(norm) / args.ppo_epochs
        optimizer.step()
    stats["loss"] = sums["loss"] / args.ppo_epochs
    stats.update({key: sums[key] / n_tok for key in keys})
    stats["logp_mismatch"] = mismatch / max(1, sum(len(c.token_ids) for c in train))
    stats["train_tokens"] = n_tok
    return stats


def find_checkpoint(out: Path) -> Path | None:
    """OUT/checkpoint (after undoing what a kill during its save left), or None."""
    folder = out / "checkpoint"
    recover_checkpoint(folder)
    return folder if (folder / TRAINER_STATE).is_file() else None


def instance_order(n_instances: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices of the instances of `step`: passes over a seeded permutation (a fresh one per pass), a pure
    function of (step, seed), so a resumed run picks the same instances with no RNG state."""
    picks = []
    for j in range(per_step):
        k = step * per_step + j
        epoch, pos = divmod(k, n_instances)
        perm = list(range(n_instances))
        random.Random(seed * 7919 + epoch).shuffle(perm)
        picks.append(perm[pos])
    return picks


def step_seed(seed: int, step: int, j: int) -> int:
    """The sampling seed of the j-th instance of a training step (editor samples and rollouts)."""
    return seed * 1_000_003 + step * 1009 + j


def seed_skill_for(skillset, task_type: str) -> str:
    if skillset is None:
        return ""
    from minskill.rollout import skill_text
    return skill_text(skillset, task_type)


def load_tasks(args, split: str):
    from minskill.tasks import load_suite
    try:
        return load_suite(args.suite, split=split, seed=args.seed, n=args.n_tasks)
    except (ValueError, FileNotFoundError) as e:   # a bad suite file: refused before any model call
        sys.exit(f"train_grpo.py: --suite {args.suite}: {e}")


def all_zero_note(tasks, training: bool = True) -> str:
    """What to say when every reward of a run was 0 (it happens on multi-turn suites with a weak model)."""
    multi = any(t.multi_turn for t in tasks)
    consequence = ("so every advantage is 0 and the editor got no gradient: nothing was learned" if training
                   else "so these rows cannot tell the methods apart")
    return (f"every reward was 0: the task model never succeeded on "
            f"{'this multi-turn suite' if multi else 'these tasks'}, {consequence}. " +
            ("The offline 135M task model mostly echoes the observation in multi-turn play; " if multi else "") +
            "use a stronger task model (--task-url) or an easier suite.")


def metrics_row(step, evolutions, cands, st, client_delta, t0, t_sampled, t_trained, lr) -> dict:
    n_inst = len(evolutions)
    G = len(evolutions[0].generations)
    reward_per_gen = [sum(ev.seed_reward for ev in evolutions) / n_inst]
    reward_per_gen += [sum(ev.generations[g].mean_reward for ev in evolutions) / n_inst for g in range(G)]
    best_per_gen = [sum(ev.generations[g].current_reward for ev in evolutions) / n_inst for g in range(G)]
    a_inter = [sum(ev.generations[g].inter_advantage for ev in evolutions) / n_inst for g in range(G)]
    groups = [gen for ev in evolutions for gen in ev.generations]
    parsed = [c for c in cands if c.skill is not None]
    sampled_tokens = sum(len(c.token_ids) for c in cands)
    # the carried skill that gained most over its instance's seed skill (a tie: the higher reward)
    best = max(evolutions, key=lambda ev: (ev.final_reward - ev.seed_reward, ev.final_reward))
    return {
        "step": step,
        "reward_per_generation": reward_per_gen,          # [seed skill, mean of generation 1..G candidates]
        "carried_reward_per_generation": best_per_gen,    # reward of the skill carried after generation g
        "reward_mean_candidates": sum(c.reward for c in cands) / len(cands),
        "a_inter": a_inter,
        "loss": st["loss"], "kl": st["kl_mean"], "ratio_mean": st["ratio_mean"],
        "clip_frac_low": st["clip_frac_low"], "clip_frac_high": st["clip_frac_high"],
        "grad_norm": st["grad_norm"], "logp_mismatch": st["logp_mismatch"], "lr": lr,
        "zero_variance_groups": sum(g.zero_variance for g in groups) / len(groups),
        "unparsed_share": 1 - len(parsed) / len(cands),
        "skill_tokens_mean": sampled_tokens / len(cands),
        "skill_chars_mean": sum(len(c.skill) for c in parsed) / max(1, len(parsed)),
        "trained_sequences": st["trained_sequences"],
        "task_calls": client_delta["calls"],
        "task_tokens": client_delta["prompt_tokens"] + client_delta["completion_tokens"],
        "editor_sample_tokens_per_s": sampled_tokens / max(t_sampled - t0, 1e-9),
        "train_tokens_per_s": st["train_tokens"] / max(t_trained - t_sampled, 1e-9),
        "seconds_sampling_and_rollouts": t_sampled - t0, "seconds_update": t_trained - t_sampled,
        "instances": [ev.instance.id for ev in evolutions],
        "best_skill": best.final_skill, "best_skill_reward": best.final_reward,
        "best_skill_gain": best.final_reward - best.seed_reward, "best_skill_instance": best.instance.id,
    }


def plot_rewards(path: Path, rows: list[dict], generations: int) -> None:
    from minskill.plot import write_svg_plot
    series = {("seed skill (g=0)" if g == 0 else f"generation {g}"):
              [(r["step"] + 1, r["reward_per_generation"][g]) for r in rows] for g in range(generations + 1)}
    write_svg_plot(path, series, title="Skill-R1: mean candidate reward per generation",
                   xlabel="training step", ylabel="mean verifier reward")


def train(args) -> int:
    from minskill.server import embedded_client
    from minskill.skill_r1 import evolve_batch, make_instances
    from minskill.rollout import load_skills
    from minskill.weights import load_model

    out = Path(args.out)
    check_run_folder(out, args.resume, args.overwrite, "train_grpo.py")
    state, ckpt = None, None
    if args.resume:
        ckpt = find_checkpoint(out)
        if ckpt is None:
            sys.exit(f"--resume: no checkpoint in {out} (nothing to resume; drop --resume to start a run)")
        state = load_trainer_state(ckpt, restore_rng=False)  # restored below, once the models are built
        changed = [f"--{k.replace('_', '-')} {state['args'].get(k)!r} -> {getattr(args, k)!r}"
                   for k in RESUME_MUST_MATCH if state["args"].get(k) != getattr(args, k)]
        if changed:
            sys.exit(f"--resume: these flags differ from the checkpoint's run, so it would not continue the "
                     f"same run: {', '.join(changed)}")
        if state["args"]["steps"] != args.steps:
            print(f"note: --steps {state['args']['steps']} -> {args.steps} changes the cosine schedule")
    editor, tokenizer = load_model(str(ckpt) if ckpt else args.editor, dtype=torch.float32, device=device())
    editor.gradient_checkpointing = args.grad_checkpointing
    editor_spec = state["editor_spec"] if state else args.editor
    ref_model = None
    if args.beta > 0:  # the reference is the editor before any training (not the resumed checkpoint)
        ref_model = load_model(editor_spec, dtype=torch.float32, device=device())[0] if state \
            else copy.deepcopy(editor)
        ref_model.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(editor.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                                  betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps, args.warmup_ratio))
    rows: list[dict] = []
    start_step = 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        rows, start_step = list(state["metrics"]), state["step"]
        print(f"resuming {ckpt} at step {start_step}", flush=True)
    else:
        torch.manual_seed(args.seed)
        random.seed(args.seed)

    tasks = load_tasks(args, "train")
    instances = make_instances(tasks, args.tasks_per_instance, prefix="train")
    if not instances:
        sys.exit(f"suite {args.suite!r} has no task type with {args.tasks_per_instance} training tasks")
    seed_skillset = load_skills(args.seed_skills, args.suite)
    metrics_path, svg_path = out / "metrics.jsonl", out / "reward_curve.svg"
    open_run_folder(out, args.resume, args.overwrite, "train_grpo.py")
    write_jsonl_atomic(metrics_path, rows)  # exactly the steps the checkpoint holds
    n_params = sum(p.numel() for p in editor.parameters())
    print(f"Skill-R1 (bi-level GRPO): editor {editor_spec} ({n_params / 1e6:.1f}M parameters), task model "
          f"{args.task_url or 'embedded default (smollm2-135m, greedy)'}; suite {args.suite}: "
          f"{len(instances)} training instances of {args.tasks_per_instance} tasks; "
          f"{args.steps} steps x {args.instances_per_step} instances x G={args.generations} x K={args.candidates} "
          f"candidates, n={args.rollouts}; λ={args.lam} β={args.beta} agg={args.agg} lr={args.lr}"
          f"{' bf16' if args.bf16 else ''}; reference model: "
          f"{'frozen copy of the editor' if ref_model is not None else 'none (β = 0)'} -> {out}", flush=True)

    warned = False
    with embedded_client(args.task_url, args.task_model, api_key=args.task_api_key) as client:
        t_run = time.time()
        for step in range(start_step, args.steps):
            t0, stats0 = time.time(), client.stats
            picks = instance_order(len(instances), step, args.instances_per_step, args.seed)
            batch = [instances[i] for i in picks]
            editor.eval()
            with autocast(args):
                evolutions = evolve_batch(
                    editor, tokenizer, client, batch, seeds=[step_seed(args.seed, step, j) for j in range(len(batch))],
                    seed_skills=[seed_skill_for(seed_skillset, inst.type) for inst in batch], generations=args.generations,
                    candidates=args.candidates, rollouts=args.rollouts, lam=args.lam, scale_by_std=args.scale_by_std,
                    temperature=args.editor_temperature, top_p=args.editor_top_p,
                    max_skill_tokens=args.max_skill_tokens, context_tokens=args.context_tokens,
                    task_max_tokens=args.task_max_tokens, task_temperature=args.task_temperature)
            t_sampled = time.time()
            editor.train()
            cands = [c for ev in evolutions for c in ev.candidates()]
            st = policy_update(editor, ref_model, optimizer, cands, args)
            lr = optimizer.param_groups[0]["lr"]
            scheduler.step()
            t_trained = time.time()
            stats1 = client.stats
            delta = {k: stats1[k] - stats0[k] for k in stats1}
            row = metrics_row(step, evolutions, cands, st, delta, t0, t_sampled, t_trained, lr)
            rows.append(row)
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            plot_rewards(svg_path, rows, args.generations)
            done = step + 1 - start_step
            eta = (time.time() - t_run) / done * (args.steps - step - 1)
            print(f"step {step + 1}/{args.steps} | reward " +
                  " → ".join(f"{r:.2f}" for r in row["reward_per_generation"]) +
                  f" (best carried {row['best_skill_reward']:.2f}) | A_inter {sum(row['a_inter']) / len(row['a_inter']):+.2f}"
                  f" | kl {row['kl']:.4f} | zero-var {row['zero_variance_groups']:.2f} | unparsed "
                  f"{row['unparsed_share']:.2f} | {row['task_calls']} task calls | "
                  f"{time.time() - t0:.0f} s/step | ETA {eta / 60:.1f} min", flush=True)
            if not warned and step + 1 < args.steps and all(max(r["reward_per_generation"]) == 0 and r["reward_mean_candidates"] == 0
                                  for r in rows):
                print(f"warning: so far {all_zero_note(tasks)}", flush=True)
                warned = True
            if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
                save_checkpoint(out / "checkpoint", editor, tokenizer, {
                    "step": step + 1, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "args": vars(args), "editor_spec": editor_spec, "metrics": rows})
        calls = client.stats["calls"]

    if rows:
        first, last = rows[0], rows[-1]
        print(f"\ndone: {len(rows)} steps. Mean candidate reward per generation (g=0 is the seed skill): first "
              f"step {[round(r, 2) for r in first['reward_per_generation']]}, last step "
              f"{[round(r, 2) for r in last['reward_per_generation']]}; task-model calls this session: {calls}.")
        if all(max(r["reward_per_generation"]) == 0 and r["reward_mean_candidates"] == 0 for r in rows):
            print("note: " + all_zero_note(tasks))
        best = max(rows, key=lambda r: (r["best_skill_gain"], r["best_skill_reward"]))
        if best["best_skill_gain"] > 0:
            print(f"best edited skill: reward {best['best_skill_reward']:.2f} on {best['best_skill_instance']} "
                  f"(+{best['best_skill_gain']:.2f} over its seed skill), step {best['step'] + 1}:\n"
                  f"{best['best_skill'].strip()[:600]}")
        else:
            print("no edited skill beat its instance's seed skill in this run.")
    print(f"wrote {out / 'checkpoint'} (editor in HF layout + trainer_state.pt), {metrics_path}, {svg_path}")
    return 0


# -------------------------------------------------------------------------------------------- evaluation


def trained_with_lambda(spec: str) -> float | None:
    """λ of the run that wrote a checkpoint folder (from its trainer_state.pt), None when unknown."""
    state_file = Path(spec) / "trainer_state.pt"
    if not state_file.is_file():
        return None
    return float(torch.load(state_file, weights_only=False)["args"]["lam"])


def evaluate(args) -> int:
    """The paper's rows on held-out instances. Each held-out instance has tasks_per_instance tasks the editor
    evolves the skill on (with their verifier feedback) and as many *other* tasks of the same type on which
    the carried skill is scored; success = share of those evaluation tasks solved."""
    from minskill.rollout import run_rollouts, wilson_interval
    from minskill.server import embedded_client
    from minskill.skill_r1 import Instance, evolve_batch, make_instances
    from minskill.rollout import load_skills
    from minskill.weights import load_model

    m = args.tasks_per_instance
    tasks = load_tasks(args, "heldout")
    pairs = make_instances(tasks, 2 * m, prefix="heldout")
    # spread the instances over the task types
    by_type: dict[str, list] = {}
    for p in pairs:
        by_type.setdefault(p.type, []).append(p)
    pairs = [p for k in range(max(map(len, by_type.values()), default=0)) for ps in by_type.values()
             if k < len(ps) for p in [ps[k]]][: args.eval_instances]
    if not pairs:
        sys.exit(f"suite {args.suite!r}: no task type has {2 * m} held-out tasks")
    evo = [Instance(p.id, p.type, p.tasks[:m]) for p in pairs]
    test = [p.tasks[m:] for p in pairs]
    seed_skillset = load_skills(args.seed_skills, args.suite)
    seed_skills = [seed_skill_for(seed_skillset, inst.type) for inst in evo]
    rows = []
    with embedded_client(args.task_url, args.task_model, api_key=args.task_api_key) as client:
        def success(skill_per_instance: list[str]) -> tuple[float, int, int]:
            """(success rate, successes, rollouts) of the skills on their instances' evaluation tasks."""
            c0, scores = client.stats["calls"], []
            for skill, ts in zip(skill_per_instance, test):
                scores += [tr.reward for tr in run_rollouts(client, ts, skill or None, n=args.rollouts,
                                                            temperature=args.task_temperature,
                                                            max_tokens=args.task_max_tokens, seed=args.seed)]
            return sum(scores) / len(scores), client.stats["calls"] - c0, len(scores)

        rows.append(("no skill", *success([""] * len(evo)), [], 0))
        print("evaluated: no skill", flush=True)
        rows.append(("seed skill" + ("" if seed_skillset is not None else " (--seed-skills none: = no skill)"), *success(seed_skills), [], 0))
        print("evaluated: seed skill", flush=True)
        editors = [("Skill-R1 inference-only (editor frozen)", args.editor),
                   ("vanilla GRPO (λ = 0)", args.grpo_editor), ("Skill-R1 (λ > 0)", args.skillr1_editor)]
        for name, spec in editors:
            if not spec:
                print(f"skipped: {name} (no editor given)", flush=True)
                continue
            trained_lam = trained_with_lambda(spec)
            if trained_lam is not None and name != editors[0][0]:
                if (trained_lam == 0) != name.startswith("vanilla"):
                    print(f"warning: {spec} was trained with λ = {trained_lam}, yet it fills the row '{name}'")
                name = f"{name.split(' (')[0]} (λ = {trained_lam:g})"
            editor, tokenizer = load_model(spec, dtype=torch.float32, device=device())
            editor.eval()
            c0 = client.stats["calls"]
            with torch.no_grad(), autocast(args):
                evolutions = evolve_batch(
                    editor, tokenizer, client, evo, seeds=[step_seed(args.seed, 10**6, k) for k in range(len(evo))],
                    seed_skills=seed_skills, generations=args.generations, candidates=args.candidates,
                    rollouts=args.rollouts, lam=args.lam, temperature=args.editor_temperature,
                    top_p=args.editor_top_p, max_skill_tokens=args.max_skill_tokens,
                    context_tokens=args.context_tokens, task_max_tokens=args.task_max_tokens,
                    task_temperature=args.task_temperature)
            evolve_calls = client.stats["calls"] - c0
            per_gen = [success([ev.generations[g].current_skill for ev in evolutions])
                       for g in range(args.generations)]
            final, eval_calls, n = per_gen[-1]
            rows.append((f"{name}: {spec}", final, sum(c for _, c, _ in per_gen), n,
                         [s for s, _, _ in per_gen], evolve_calls))
            print(f"evaluated: {name}", flush=True)
            del editor

    n_eval = sum(len(t) for t in test) * args.rollouts
    print(f"\nSkill-R1 evaluation, held-out split of {args.suite}: {len(evo)} instances "
          f"({', '.join(sorted({i.type for i in evo}))}), {n_eval} evaluation rollouts per row; "
          f"G={args.generations} K={args.candidates} n={args.rollouts}; task model "
          f"{args.task_model or args.task_url or 'embedded default (smollm2-135m, greedy)'}\n")
    print("| method | success (95% CI) | " + " | ".join(f"g={g + 1}" for g in range(args.generations)) +
          " | task calls: evolve | task calls: evaluate |")
    print("|---|---|" + "---|" * args.generations + "---|---|")
    for name, s, eval_calls, n, per_gen, evolve_calls in rows:
        lo, hi = wilson_interval(s * n, n)
        gens = " | ".join(f"{x:.3f}" for x in per_gen) if per_gen else " | ".join("–" for _ in range(args.generations))
        print(f"| {name} | {s:.3f} ({lo:.2f}–{hi:.2f}) | {gens} | {evolve_calls} | {eval_calls} |")
    print("\nsuccess: share of evaluation tasks solved with the skill carried after the last generation; g=k: "
          "with the skill carried after generation k; evolve calls: task-model requests spent writing the skills "
          "(on each instance's own tasks); evaluate calls: requests spent scoring them.")
    if all(s == 0 for _, s, _, _, per_gen, _ in rows) and all(x == 0 for r in rows for x in r[4]):
        print("note: " + all_zero_note([t for ts in test for t in ts], training=False))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the embedded task-model server
    return evaluate(args) if args.eval else train(args)


if __name__ == "__main__":
    sys.exit(main())
