"""Paired comparisons of two skill sources on the same tasks: gained/lost, an exact sign test, and a
bootstrap interval that resamples instances, not tasks.

Two rows A and B score the same tasks; s_A(t), s_B(t) ∈ [0, 1] are a task's scores (the mean over its n
rollouts, so n identical greedy replies count once, not n times). Per task d(t) = s_B(t) − s_A(t).

    difference  D = mean_t d(t)
    gained      = #{t : d(t) > 0},   lost = #{t : d(t) < 0}        (ties drop out)
    sign test   p = min(1, 2 · Σ_{i ≤ min(gained, lost)} C(m, i) / 2^m),   m = gained + lost
                (two-sided exact binomial test of "B beats A as often as A beats B"; McNemar's exact test
                 when the scores are 0/1)
    one-sided   p = Σ_{i ≥ gained} C(m, i) / 2^m = P(X ≥ gained), X ~ Bin(m, 1/2)
                (`sign_test_p_greater`: "B beats A more often than A beats B"; the gates of minskill/gates.py)

The tasks of one instance share one evolved skill, so they are not independent; the interval resamples
whole instances. With instances j = 1..J holding their tasks' differences, one bootstrap draw picks J
instances with replacement and takes the mean d over all their tasks; the 95% interval is the 2.5th and
97.5th percentiles of `draws` such means, drawn from random.Random(seed).
"""
from __future__ import annotations

import math
import random


def sign_test_p(gained: int, lost: int) -> float:
    """Two-sided exact sign test (module docstring); 1.0 when there is no untied pair."""
    m = gained + lost
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(gained, lost) + 1))
    return min(1.0, 2 * tail / 2 ** m)


def bootstrap_by_instance(diffs: list[list[float]], draws: int = 10_000, seed: int = 0,
                          level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean task difference, resampling instances (module docstring)."""
    groups = [g for g in diffs if g]
    if not groups:
        return 0.0, 0.0
    rng = random.Random(seed)
    sums, sizes = [sum(g) for g in groups], [len(g) for g in groups]
    means = []
    for _ in range(draws):
        picks = [rng.randrange(len(groups)) for _ in groups]
        means.append(sum(sums[k] for k in picks) / sum(sizes[k] for k in picks))
    means.sort()
    lo = means[int(math.floor((1 - level) / 2 * draws))]
    hi = means[min(draws - 1, int(math.ceil((1 + level) / 2 * draws)) - 1)]
    return lo, hi


def compare(scores_a: list[list[float]], scores_b: list[list[float]], draws: int = 10_000,
            seed: int = 0) -> dict:
    """B against A on the same tasks, grouped by instance: difference, gained, lost, p, 95% interval."""
    if [len(g) for g in scores_a] != [len(g) for g in scores_b]:
        raise ValueError("compare: the two rows must score the same tasks, grouped the same way")
    diffs = [[b - a for a, b in zip(ga, gb)] for ga, gb in zip(scores_a, scores_b)]
    flat = [d for g in diffs for d in g]
    gained, lost = sum(d > 0 for d in flat), sum(d < 0 for d in flat)
    lo, hi = bootstrap_by_instance(diffs, draws, seed)
    return {"difference": sum(flat) / max(1, len(flat)), "gained": gained, "lost": lost,
            "p": sign_test_p(gained, lost), "ci95": (lo, hi), "n": len(flat)}


def sign_test_p_greater(gained: int, lost: int) -> float:
    """One-sided exact sign test of "B beats A more often than A beats B": p = P(X ≥ gained),
    X ~ Bin(gained + lost, 1/2) (ties drop out); 1.0 when there is no untied pair."""
    m = gained + lost
    if m == 0:
        return 1.0
    return sum(math.comb(m, i) for i in range(gained, m + 1)) / 2 ** m
