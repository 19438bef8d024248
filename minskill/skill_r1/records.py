"""What a Skill-R1 training run records after each step: its row of metrics.jsonl, its skill lineage
(lineage.jsonl), the reward curve (reward_curve.svg) and the progress line on stdout.

This is the run loop's bookkeeping, not the algorithm: train_grpo.train calls it between steps,
after train_step has computed (the reading path of a step, tests/reading_path.py, therefore leaves
it out). Under torchrun (minskill.distributed) `step_over_ranks` first puts the ranks' shares of the
step together, so every rank holds the global figures; rank 0 alone writes them, once.
"""
from __future__ import annotations

import time
from pathlib import Path

from minskill import distributed, gates
from minskill.files import append_jsonl
from minskill.plot import write_svg_plot
from minskill.serve.client import usage_delta
from minskill.skill_r1.grpo import inter_share
from minskill.rollout import cut_totals, reasoning_cut_note
from minskill.skill_r1.loop import (OUTCOMES_SHOWN, reasoning_cuts, rollout_errors,
                                    zero_reward_note)


# policy_update's stats that are means over its trained tokens; the others are sums but for
# grad_norm (the norm of the gradient summed over the ranks: the same on each)
TOKEN_MEANS = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl_mean", "logp_mismatch")


def step_over_ranks(evolutions, cands, st, usage_now: dict, usage_before: dict):
    """(evolutions, candidates, update stats, task-model usage since usage_before) of the whole
    step: in one process the rank's own; under torchrun every rank's evolutions and candidates in
    rank order (the step's instance order), the stats as one process computes them (token means
    weighted by each rank's trained tokens; the loss, each rank's part of the one loss, and the
    counts summed) and the usage summed, but busy_seconds: the most of any rank (the ranks' calls
    overlap in time: their union is at least that)."""
    usage = usage_delta(usage_now, usage_before)
    if distributed.world() == 1:
        return evolutions, cands, st, usage
    parts = distributed.gather((evolutions, cands))
    tokens, sequences, loss, *weighted = distributed.sum_over_ranks(
        st["train_tokens"], st["trained_sequences"], st["loss"],
        *(st[k] * st["train_tokens"] for k in TOKEN_MEANS))
    st = {**st, "train_tokens": tokens, "trained_sequences": sequences, "loss": loss,
          **{k: w / tokens if tokens else 0.0 for k, w in zip(TOKEN_MEANS, weighted)}}
    busy = distributed.max_over_ranks(usage["busy_seconds"])
    usage = {**dict(zip(usage, distributed.sum_over_ranks(*usage.values()))), "busy_seconds": busy}
    return [ev for evs, _ in parts for ev in evs], [c for _, cs in parts for c in cs], st, usage


def metrics_row(step, evolutions, cands, st, usage, t0, t_sampled, lr) -> dict:
    """One row of metrics.jsonl: rewards per generation (averaged over the step's instances), the
    update's stats, the task model's usage (client.Usage) and the speeds. The editor samples while
    no task-model request is out, so its seconds are the sampling phase's wall time minus the task
    model's busy seconds in it. `errors`: the step's rollouts that ended with an error (scored 0);
    when every one did, TaskModelFailed stops the run before the step is recorded or saved.
    `reasoning_cut`: of its `rollouts`, the replies all reasoning (loop.reasoning_cuts)."""
    errors = rollout_errors(evolutions, f"training step {step + 1}")
    t_trained, n_inst, G = time.time(), len(evolutions), len(evolutions[0].generations)

    def per_generation(value):  # value(evolution, g) averaged over the instances, for g = 1..G
        return [sum(value(ev, g) for ev in evolutions) / n_inst for g in range(G)]

    groups = [gen for ev in evolutions for gen in ev.generations]
    parsed = [c for c in cands if c.skill is not None]
    sampled_tokens = sum(len(c.token_ids) for c in cands)
    # the carried skill that gained most over its instance's seed skill (a tie: the higher reward)
    best = max(evolutions, key=lambda ev: (ev.final_reward - ev.seed_reward, ev.final_reward))
    return {
        "step": step, "errors": errors,   # [seed skill, mean of generation 1..G candidates]:
        "reward_per_generation": [sum(ev.seed_reward for ev in evolutions) / n_inst] +
                                 per_generation(lambda ev, g: ev.generations[g].mean_reward),
        "carried_reward_per_generation": per_generation(
            lambda ev, g: ev.generations[g].current_reward),
        "reward_mean_candidates": sum(c.reward for c in cands) / len(cands),
        "a_inter": per_generation(lambda ev, g: ev.generations[g].inter_advantage),
        "loss": st["loss"], "kl": st["kl_mean"], "ratio_mean": st["ratio_mean"],
        "clip_frac_low": st["clip_frac_low"], "clip_frac_high": st["clip_frac_high"],
        "grad_norm": st["grad_norm"], "logp_mismatch": st["logp_mismatch"], "lr": lr,
        # all K rewards of a group equal: A_intra = 0 for its candidates, only λ·A_inter moves it
        "zero_variance_groups": sum(len({c.reward for c in g.candidates}) == 1
                                    for g in groups) / len(groups),
        # mean |λ·A_inter| / mean |A|: how much the inter-generation term weighs (grpo.inter_share)
        "inter_share": inter_share([[c.advantage for c in g.candidates] for g in groups]),
        "beat_seed_share": sum(c.reward > ev.seed_reward for ev in evolutions
                               for c in ev.candidates()) / len(cands),
        "unparsed_share": 1 - len(parsed) / len(cands),
        "skill_tokens_mean": sampled_tokens / len(cands),
        "skill_chars_mean": sum(len(c.skill) for c in parsed) / max(1, len(parsed)),
        "trained_sequences": st["trained_sequences"],
        "task_calls": usage["calls"],
        "task_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        "task_prompt_tokens": usage["prompt_tokens"],
        "task_completion_tokens": usage["completion_tokens"],
        "task_reasoning_tokens": usage.get("reasoning_tokens", 0), **reasoning_cuts(evolutions),
        "task_seconds": usage["busy_seconds"], "task_request_seconds": usage["request_seconds"],
        "seconds_editor_sampling": max(0.0, t_sampled - t0 - usage["busy_seconds"]),
        "editor_sampled_tokens": sampled_tokens,
        "editor_sample_tokens_per_s": sampled_tokens / max(t_sampled - t0, 1e-9),
        "train_tokens_per_s": st["train_tokens"] / max(t_trained - t_sampled, 1e-9),
        "seconds_sampling_and_rollouts": t_sampled - t0, "seconds_update": t_trained - t_sampled,
        "instances": [ev.instance.id for ev in evolutions],
        "best_skill": best.final_skill, "best_skill_reward": best.final_reward,
        "best_skill_gain": best.final_reward - best.seed_reward,
        "best_skill_instance": best.instance.id,
    }


def log_step(run, args, row: dict, t0: float, t_run: float, evolutions) -> None:
    """Append the step's row to metrics.jsonl (and run.rows), its skill lineage to lineage.jsonl;
    redraw the curve; print the progress line (run: skill_r1.run_setup.Run)."""
    run.rows.append(row)
    if not distributed.is_main():   # torchrun: rank 0 alone writes the run folder (and prints)
        return
    append_jsonl(run.out / "metrics.jsonl", row)
    for record in lineage_records(row["step"], evolutions):
        append_jsonl(run.out / "lineage.jsonl", record)
    plot_rewards(run.out / "reward_curve.svg", run.rows, args.generations)
    step = row["step"]
    eta = (time.time() - t_run) / (step + 1 - run.start_step) * (args.steps - step - 1)
    print(f"step {step + 1}/{args.steps} | reward "
          + " → ".join(f"{r:.2f}" for r in row["reward_per_generation"]) +
          f" (best carried {row['best_skill_reward']:.2f}) | A_inter "
          f"{sum(row['a_inter']) / len(row['a_inter']):+.2f} | kl {row['kl']:.4f} | zero-var "
          f"{row['zero_variance_groups']:.2f} | unparsed {row['unparsed_share']:.2f} | "
          f"{row['task_calls']} task calls{errors_note(row)} | {time.time() - t0:.0f} s/step | ETA "
          f"{eta / 60:.1f} min", flush=True)
    # said once, on this session's first step: a run that never saw a reward cannot learn (it
    # names the replies cut inside their reasoning, if any; else they are said when first seen)
    if step == run.start_step and step + 1 < args.steps and no_reward_yet(run.rows):
        print(f"warning: so far {zero_reward_note(run.tasks, run.rows)}", flush=True)
    elif row["reasoning_cut"] and not any(r.get("reasoning_cut") for r in run.rows[:-1]):
        print(reasoning_cut_note(cut_totals([row], of="rollouts")), flush=True)


def end_note(tasks, rows: list[dict]) -> str | None:
    """The end of a training run: the all-zero note (zero_reward_note) when no reward was ever
    above 0, else the replies cut inside their reasoning over the whole run (None: neither)."""
    if no_reward_yet(rows):
        return "note: " + zero_reward_note(tasks, rows)
    return reasoning_cut_note(cut_totals(rows, of="rollouts"))


def errors_note(record: dict) -> str:
    """A step's or probe's errored rollouts for its printed line; nothing when there were none."""
    errors = record.get("errors", 0)
    return f" ({errors} rollouts ended with an error, scored 0)" if errors else ""


def no_reward_yet(rows: list[dict]) -> bool:
    return all(max(r["reward_per_generation"]) == 0 and r["reward_mean_candidates"] == 0
               for r in rows)


def plot_rewards(path: Path, rows: list[dict], generations: int) -> None:
    """Training: the mean candidate reward per generation at each step, and the candidates' mean
    gain over the seed skill averaged over the last 8 steps. Held-out probe (--probe-every): the
    mean reward of the candidates the editor writes on the probe instances, and their seed
    skill's."""
    series = {("seed skill (g=0)" if g == 0 else f"generation {g}"):
              [(r["step"] + 1, r["reward_per_generation"][g]) for r in rows]
              for g in range(generations + 1)}
    # each step trains on other instances, so single steps are noisy: a trailing mean shows trends
    gains = [r["reward_mean_candidates"] - r["reward_per_generation"][0] for r in rows]
    last_8 = [gains[max(0, i - 7):i + 1] for i in range(len(rows))]
    series["cand. − seed (8-step)"] = [(r["step"] + 1, sum(g) / len(g))
                                       for r, g in zip(rows, last_8)]
    probes = [pr for r in rows for pr in r.get("probes", [])]
    if probes:
        series["probe: candidates"] = [(pr["after_steps"], pr["reward_per_generation"][1])
                                       for pr in probes]
        series["probe: seed skill"] = [(pr["after_steps"], pr["reward_per_generation"][0])
                                       for pr in probes]
    write_svg_plot(path, series,
                   title="Skill-R1: mean candidate reward (training instances; held-out probe)",
                   xlabel="training step", ylabel="mean verifier reward")


def lineage_records(step: int, evolutions: list) -> list[dict]:
    """One lineage.jsonl record per instance of a training step, from Evolution objects after
    assign_advantages (the format, and how the report reads it: minskill/report/provenance.py's
    docstring)."""
    records = []
    for ev in evolutions:
        task_ids = [t.id for t in ev.instance.tasks]
        skills = [{"id": "g0", "generation": 0, "parent": None, "text": ev.seed_skill,
                   "reply": None,
                   "parse_error": None, "reward": ev.seed_reward, "advantage": None,
                   "task_scores": gates.per_task_means(ev.seed_outcomes, len(task_ids))}]
        carried, history, prompts, reward = ["g0"], ["g0"], [], ev.seed_reward
        for gen in ev.generations:
            ids = [f"g{gen.g}.{i}" for i in range(len(gen.candidates))]
            prompts.append({"generation": gen.g, "current": carried[-1], "history": history[::-1],
                            "prompt_tokens": len(gen.candidates[0].prompt_ids) if gen.candidates
                            else 0,
                            "outcomes_per_entry": OUTCOMES_SHOWN})
            for sid, c in zip(ids, gen.candidates):
                skills.append({"id": sid, "generation": gen.g, "parent": carried[-1],
                               "text": c.skill,
                               "reply": c.text if c.skill is None else None,
                               "parse_error": c.parse_error,
                               "reward": c.reward, "advantage": c.advantage,
                               "task_scores": gates.per_task_means(c.outcomes, len(task_ids))})
            history += ids
            # the carry gate's decision (loop._carry); without one, strict: new reward, new skill
            took = gen.gate["accepted"] if gen.gate is not None else gen.current_reward != reward
            carried.append(ids[gen.best_index] if took else carried[-1])
            reward = gen.current_reward
        records.append({"step": step, "instance": ev.instance.id, "task_type": ev.instance.type,
                        "task_ids": task_ids,
                        "questions": [t.question[:300] for t in ev.instance.tasks],
                        "skills": skills, "carried": carried, "editor_prompts": prompts,
                        "gates": [gen.gate for gen in ev.generations]})
    return records
