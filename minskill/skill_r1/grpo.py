"""Bi-level GRPO for Skill-R1: advantages over candidate skills and the clipped policy loss.

This module is pure tensor math (torch only, nothing else from minskill), so it can be tested
against hand computations.

Advantages (one task instance, generation g, K candidate skills s_g^(1..K))
---------------------------------------------------------------------------
r_g^(i) is the mean verifier score of the n task-model rollouts run with skill s_g^(i).

    A_intra(g, i) = r_g^(i) - mean_i r_g^(i)          (--scale-by-std: / (std_i r_g^(i) + eps))
    A_inter(g)    = mean_i r_g^(i) - mean_i r_{g-1}^(i)   (g = 1: r_0, the seed skill's score)
    A(g, i)       = A_intra(g, i) + λ · A_inter(g) / S    (S: the inter scale, below)

λ = 0 is vanilla GRPO. A_intra ranks the K candidates against each other; A_inter rewards (or
punishes) the whole generation for improving on the previous one, so that the editor also learns
to make progress across generations. std is the sample standard deviation (Bessel-corrected,
as in TRL and verl); a group of one candidate has std 0. Every token of candidate i's skill gets
the advantage A(g, i).

The inter scale S (--inter-scale; `inter_divisor`), one per instance and step:

    raw         S = 1                                       (the paper's A = A_intra + λ·A_inter)
    pooled-std  S = std(r_0, r_1^(1..K), …, r_G^(1..K)) + eps   (S = 1 when that std is 0)

The paper writes A = A_intra + λ·A_inter, A_intra "as in standard GRPO", and does not say how the
two scales meet. With A_intra divided by its group's std (--scale-by-std) it has unit spread, while
the raw A_inter stays on the reward scale (a few hundredths), so λ·A_inter is a small share of A
(`inter_share`, in each step's row of metrics.jsonl, measures it) and λ says little about how much
the two levels weigh.

pooled-std (the default, chosen by a λ sweep: docs/results-skill-r1.md) puts A_inter on A_intra's
footing, so λ = 1 weighs one std of improvement across generations like one std of rank within a
group. S pools all the instance's rewards of the step (r_0 and the K·G candidates'): one divisor
per instance, so its G inter terms keep their relative sizes. Not the std of the G + 1 generation
means: dividing the very numbers A_inter differences by their spread would make it scale-free (a
+0.01 and a +0.3 improvement alike) and, from 2 or 3 values, noisy. With r_0 in the pool the std is
0 only when every reward is equal; then every A_inter is 0 (up to rounding, which 1/eps would
magnify) and S = 1. pooled-std is meant with --scale-by-std (the default): without it A_intra
stays on the reward scale, where the raw A_inter already is.

Policy loss (per valid token t of sequence b; log-probs at the sampling temperature)
------------------------------------------------------------------------------------
    ratio_{b,t} = exp(logp_θ − logp_old)          (= 1 on the first pass; old is detached)
    surr_{b,t}  = min(ratio · A_b, clip(ratio, 1 − ε_low, 1 + ε_high) · A_b)
    kl_{b,t}    = exp(logp_ref − logp_θ) − (logp_ref − logp_θ) − 1   (k3 of KL, ≥ 0)
    ℓ_{b,t}     = −surr_{b,t} + β · kl_{b,t}      (KL(π_θ ‖ π_ref); only given ref_logp)

Aggregation over the (B, T) grid, m_{b,t} ∈ {0, 1} the mask of valid (completion) tokens:

    token_mean : Σ_{b,t} m·ℓ / Σ_{b,t} m           (every token of the batch weighs the same)
    seq_mean   : (1/B) Σ_b [ Σ_t m·ℓ / Σ_t m ]      (each sequence weighs the same: the
                                                 original GRPO; a row without valid tokens adds 0)
    dr_grpo    : Σ_{b,t} m·ℓ / (B · max_new_tokens) (Dr. GRPO: a constant normaliser, so no
                                                 length bias; max_new_tokens is required)

Clip fractions (reported in stats; the TRL convention) are fractions of *valid* tokens where the
clip is active, i.e. where the clipped term wins the min and the token's gradient is zero:

    clip_frac_low  = mean over valid tokens of [ratio < 1 − ε_low  and A < 0]
    clip_frac_high = mean over valid tokens of [ratio > 1 + ε_high and A > 0]

A token with ratio < 1 − ε_low but A > 0 is *not* clipped: the min picks the unclipped ratio·A,
and the gradient pushes the ratio back up. Likewise ratio > 1 + ε_high with A < 0.

Note: the loss value is near zero by construction. On the first pass ratio = 1 and, within a group,
the intra advantages sum to zero, so the surrogate averages to ≈ −λ·A_inter / S (plus β·KL).
Its value says nothing about progress; watch the reward (and KL, clip fractions) instead.
"""
from __future__ import annotations

import math
import statistics

import torch

AGGREGATIONS = ("token_mean", "seq_mean", "dr_grpo")
INTER_SCALES = ("raw", "pooled-std")   # --inter-scale: the divisor S of A_inter (module docstring)


def inter_divisor(seed_reward: float, generations: list[list[float]], how: str = "raw",
                  eps: float = 1e-4) -> float:
    """S of the module docstring for one instance: 1 (raw), or the sample std of the seed skill's
    reward and all its generations' candidates' rewards + eps (pooled-std; 1 when that std is 0)."""
    if how not in INTER_SCALES:
        raise ValueError(f"inter scale: unknown {how!r}; choose one of {', '.join(INTER_SCALES)}")
    pooled = [float(seed_reward)] + [float(r) for rewards in generations for r in rewards]
    # exact arithmetic: 0 when every reward is equal, and then every A_inter is 0 already
    spread = statistics.stdev(pooled) if how != "raw" and len(pooled) > 1 else 0.0
    return spread + eps if spread > 0 else 1.0


def bilevel_advantages(rewards, prev_mean: float | None, lam: float, scale_by_std: bool = False,
                       eps: float = 1e-4, inter_divisor: float = 1.0) -> torch.Tensor:
    """A(i) = A_intra(i) + λ · A_inter / S for the K candidates of one generation (prev_mean: the
    previous generation's mean reward, None: A_inter = 0; inter_divisor: S, 1 in the raw form)."""
    inter = float(lam) * inter_advantage(rewards, prev_mean) / inter_divisor   # x / 1.0 == x: raw
    return intra_advantages(rewards, scale_by_std, eps) + inter


def _as_reward_tensor(rewards, where: str) -> torch.Tensor:
    """Rewards (list or tensor) as a 1-D float32 tensor; raises ValueError naming `where`."""
    r = torch.as_tensor(rewards, dtype=torch.float32).detach()
    if r.dim() != 1 or r.numel() == 0 or not torch.isfinite(r).all():
        raise ValueError(f"{where}: rewards must be a non-empty 1-D sequence of finite numbers, "
                         f"got {r.tolist()}")
    return r


def intra_advantages(rewards, scale_by_std: bool = False, eps: float = 1e-4) -> torch.Tensor:
    """A_intra(i) = r_i − mean(r)  [/ (std(r) + eps) when scale_by_std]. Returns float32 (K,)."""
    r = _as_reward_tensor(rewards, "intra_advantages")
    centred = r - r.mean()
    if scale_by_std:   # the sample std (TRL/verl's); a single value has std 0, not NaN
        centred = centred / ((r.std(unbiased=True) if r.numel() > 1 else 0.0) + eps)
    return centred


def inter_advantage(rewards, prev_mean: float | None) -> float:
    """A_inter = mean(r) − prev_mean; 0.0 when prev_mean is None (no earlier generation to compare
    with)."""
    r = _as_reward_tensor(rewards, "inter_advantage")
    if prev_mean is not None and not math.isfinite(float(prev_mean)):
        raise ValueError(f"inter_advantage: prev_mean must be finite, got {prev_mean}")
    return 0.0 if prev_mean is None else float(r.mean()) - float(prev_mean)


def inter_share(groups) -> float:
    """The share of λ·A_inter/S in the advantage, mean |λ·A_inter(g)/S| / mean |A(g, i)| over
    every candidate of `groups` (each: the K advantages A(g, ·) of one generation of one instance;
    0.0 when every A is 0). The advantages suffice: A_intra sums to 0 over a group (scaled or not),
    so λ·A_inter(g)/S is the group's mean A."""
    inter = total = 0.0
    for advantages in groups:
        advantages = [float(a) for a in advantages]
        if not advantages:
            continue
        inter += len(advantages) * abs(sum(advantages) / len(advantages))
        total += sum(abs(a) for a in advantages)
    return inter / total if total > 0 else 0.0


def check_loss_config(lam: float, eps_low: float, eps_high: float, beta: float, agg: str) -> None:
    """The update's knobs, checked once at set-up (train_grpo.py), not per micro-batch: ValueError
    naming the knob."""
    if not math.isfinite(float(lam)):
        raise ValueError(f"lam must be finite, got {lam}")
    if not (0.0 <= eps_low < 1.0 and eps_high >= 0.0 and beta >= 0.0):
        raise ValueError(f"policy loss: need 0 <= eps_low < 1, eps_high >= 0 and beta >= 0, got "
                         f"eps_low={eps_low}, eps_high={eps_high}, beta={beta}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"policy loss: unknown agg {agg!r}; choose one of "
                         f"{', '.join(AGGREGATIONS)}")


def _check_loss_inputs(logp, old_logp, advantages, mask, ref_logp, beta):
    """Raise ValueError when policy_loss's tensors do not fit (naming every one's shape) or beta >
    0 lacks ref_logp."""
    alike = [(name, t) for name, t in (("old_logp", old_logp), ("mask", mask),
                                       ("ref_logp", ref_logp)) if t is not None]
    if logp.dim() != 2 or advantages.shape != logp.shape[:1] or any(t.shape != logp.shape
                                                                    for _, t in alike):
        got = ", ".join(f"{name} {tuple(t.shape)}"
                        for name, t in [("logp", logp), *alike, ("advantages", advantages)])
        raise ValueError(f"policy_loss: logp, old_logp, mask (and ref_logp) must be (B, T) alike "
                         f"and advantages (B,); got {got}")
    if beta > 0.0 and ref_logp is None:
        raise ValueError("policy_loss: beta > 0 needs ref_logp (the frozen reference model's "
                         "log-probs)")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, ref_logp: torch.Tensor | None = None, eps_low: float = 0.2,
                eps_high: float = 0.2, beta: float = 0.0, agg: str = "token_mean",
                max_new_tokens: int | None = None) -> tuple[torch.Tensor, dict]:
    """The clipped GRPO surrogate with optional k3 KL, aggregated by `agg` (module docstring;
    knobs: check_loss_config). logp, old_logp, mask (True at completion tokens) and ref_logp (or
    None) are (B, T); advantages (B,)."""
    # the advantages come from rewards computed on the CPU; the log-probs live where the model does
    advantages = torch.as_tensor(advantages, dtype=torch.float32, device=logp.device)
    mask = mask.to(logp.device)
    _check_loss_inputs(logp, old_logp, advantages, mask, ref_logp, beta)
    valid = mask.bool()
    weight = valid.to(logp.dtype)
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)                      # (B, 1)
    # Zero the log-ratio at masked positions so padding garbage cannot turn into inf * 0 = nan.
    ratio = torch.exp(torch.where(valid, logp - old_logp.detach(), torch.zeros_like(logp)))
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    kl = _k3_kl(logp, ref_logp, valid) if ref_logp is not None else None   # reported whenever given
    if beta > 0.0:   # in the loss only when beta > 0
        per_token = per_token + beta * kl
    masked = per_token * weight
    if agg == "token_mean":
        loss = masked.sum() / weight.sum().clamp(min=1.0)
    else:
        loss = _sequence_aggregate(masked, weight, agg, max_new_tokens)
    return loss, _loss_stats(ratio, adv, kl, weight, eps_low, eps_high)


def _k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """k3 = exp(logp_ref − logp_θ) − (logp_ref − logp_θ) − 1 per token (0 at masked
    positions)."""
    ref_minus_logp = torch.where(valid, ref_logp.detach() - logp, torch.zeros_like(logp))
    return torch.exp(ref_minus_logp) - ref_minus_logp - 1.0


def _sequence_aggregate(masked: torch.Tensor, weight: torch.Tensor, agg: str,
                        max_new_tokens: int | None):
    """The seq_mean and dr_grpo losses of policy_loss (module docstring) from the masked per-token
    losses."""
    if agg == "seq_mean":
        return (masked.sum(-1) / weight.sum(-1).clamp(min=1.0)).mean()
    if agg != "dr_grpo":
        raise ValueError(f"policy_loss: unknown agg {agg!r}; choose one of "
                         f"{', '.join(AGGREGATIONS)}")
    longest = int(weight.sum(-1).max()) if weight.shape[0] else 0
    if max_new_tokens is None or int(max_new_tokens) <= 0 or longest > int(max_new_tokens):
        raise ValueError(f"policy_loss: agg='dr_grpo' needs max_new_tokens (the sampling limit), "
                         f"positive and at least the longest completion ({longest} valid tokens), "
                         f"got {max_new_tokens}")
    return masked.sum() / (masked.shape[0] * int(max_new_tokens))   # the generation limit, not T


@torch.no_grad()
def _loss_stats(ratio, adv, kl, weight, eps_low: float, eps_high: float) -> dict:
    """Means over the valid tokens of the ratio, the clip indicators (module docstring) and the KL;
    their number."""
    def valid_mean(x: torch.Tensor) -> float:
        return float((x.to(weight.dtype) * weight).sum() / weight.sum().clamp(min=1.0))
    low, high = (ratio < 1.0 - eps_low) & (adv < 0), (ratio > 1.0 + eps_high) & (adv > 0)
    return {"ratio_mean": valid_mean(ratio), "clip_frac_low": valid_mean(low),
            "clip_frac_high": valid_mean(high), "clip_frac": valid_mean(low | high),
            "kl_mean": valid_mean(kl) if kl is not None else 0.0, "num_tokens": float(weight.sum())}
