"""Paired comparisons of two skill sources on the same tasks, tested on the unit that carries an
independently sampled skill.

Two rows A and B score the same tasks; s_A(t), s_B(t) ∈ [0, 1] are a task's scores (the mean over
its n rollouts, so n identical greedy replies count once, not n times). Per task
d(t) = s_B(t) − s_A(t).

By instance (`compare`: train_grpo.py --eval). Instance j = 1..J evolves its own skill and scores it
on its tasks T_j, so the d(t) of one instance share one sampled skill and are not independent; the
instances are.

    D_j = mean_{t ∈ T_j} d(t)                     the instance's mean difference
    D̄  = (1/J) Σ_j D_j                           "difference" (= the task mean when all |T_j| are
                                                  equal)

    sign-flip permutation test, two-sided, of "each D_j is symmetric about 0" (A and B exchangeable
    within an instance):
        p = #{ε ∈ {−1, +1}^J : |Σ_j ε_j D_j| ≥ |Σ_j D_j|} / 2^J
          = min(1, 2 · min(p₊, p₋)),   p₊ = #{F ⊆ {1..J} : Σ_{j∈F} D_j ≤ 0} / 2^J,
                                       p₋ the same with ≥ 0
        (F = the instances whose sign is flipped, ∅ included; the two forms agree because the
         sign-flip distribution is symmetric about 0). Exact: all 2^J patterns for J ≤ EXACT_UP_TO
         = 20; above, a Monte Carlo over B = `draws` (default 100,000) patterns drawn from
         numpy.random.default_rng(seed), each instance flipped with probability 1/2,
         p₊ = (1 + #{b : Σ_{j∈F_b} D_j ≤ 0}) / (1 + B) (still a valid p).

    95% interval: the test inverted over shifts δ (Hartigan 1969). The 2^J − 1 subset means
        M_F = mean_{j∈F} D_j  (F ≠ ∅),  sorted M_(1) ≤ … ≤ M_(2^J−1),  k = ⌊(α/2) · 2^J⌋,  α = 0.05:
        interval [M_(k), M_(2^J−k)],   coverage 1 − 2k/2^J ≥ 1 − α when the D_j are symmetric
                                       about their centre (J = 12: k = 102, coverage 0.9502).
        It holds exactly the δ whose test of D_j − δ gives p > α, so 0 lies outside it exactly when
        p ≤ α. With k = 0 (J ≤ 5) no 95% test can reject: the interval is [−1, 1], the whole range
        of a difference of scores in [0, 1]. Monte Carlo (J > 20): the same order statistics of the
        B sampled subset means.

    Why this interval and not a Student t one on the D_j: in a seeded null/alternative simulation at
    J = 12 instances × 20 Bernoulli tasks (per-instance skill-quality shift sd 0, 0.1, 0.2 drawn
    independently for each row, base rates 0.05-0.5, true differences 0-0.2, shared task difficulty,
    skewed effects) the two covered alike (inversion 0.947-0.964, t 0.944-0.962; 0.93 for both under
    a strongly skewed effect) with the same width; the inversion is the same test as p (never p ≤
    0.05 with 0 inside the interval) and needs symmetry, not normality. The percentile bootstrap
    over the 12 instances that --eval used before covered only 0.905-0.928. In the same simulation
    the per-task sign test below rejected a true null in 0.10-0.30 of runs with per-instance skill
    variation, the sign-flip test in 0.03-0.04 (tests/test_paired.py re-checks it).

    per task (descriptive only, not a test: the tasks of an instance share one skill)
        per_task_gained = #{t : d(t) > 0},   per_task_lost = #{t : d(t) < 0}      (ties drop out)

    What p and the interval generalise over (`generalises_over`, said under each table of them): new
    instances; where the instances share their scoring tasks, not new scoring tasks.

By task (`compare_tasks`, `sign_test_p`, `sign_test_p_greater`): where the tasks are independent
draws scored under one fixed skill set (the gates of minskill/gates.py, the transfer matrix of
minskill/measure/transfer.py), the task is the unit:
    gained = #{t : d(t) > 0},   lost = #{t : d(t) < 0},   m = gained + lost
    sign test   p = min(1, 2 · Σ_{i ≤ min(gained, lost)} C(m, i) / 2^m)
                (two-sided exact binomial test of "B beats A as often as A beats B"; McNemar's
                 exact test when the scores are 0/1)
    one-sided   p = Σ_{i ≥ gained} C(m, i) / 2^m = P(X ≥ gained), X ~ Bin(m, 1/2)
                (`sign_test_p_greater`: "B beats A more often than A beats B"; the gates)
    interval    percentile bootstrap of the task mean (`bootstrap_by_instance` with one task per
                group): `draws` resamples from random.Random(seed), the 2.5th and 97.5th
                percentiles.
"""
from __future__ import annotations

import math
import random

import numpy as np

EXACT_UP_TO = 20          # instances up to which the sign-flip test enumerates all 2^J patterns
_TIE = 1e-9               # |Σ_F D_j| below this is a tie at 0 (the D_j are sums of float scores)


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate, k = `successes` of n; (0, 1) when n = 0:
        center = (p + z²/2n) / (1 + z²/n),  half = z·sqrt(p(1−p)/n + z²/4n²) / (1 + z²/n),  p = k/n
    (a bound at p = 0 or 1 is exactly 0 or 1: floating point would leave 1e-16 off)."""
    if n <= 0:
        return 0.0, 1.0
    p, denom = successes / n, 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes <= 0 else max(0.0, center - half)
    return low, (1.0 if successes >= n else min(1.0, center + half))


def sign_test_p(gained: int, lost: int) -> float:
    """Two-sided exact sign test (module docstring); 1.0 when there is no untied pair."""
    m = gained + lost
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(gained, lost) + 1))
    return min(1.0, 2 * tail / 2 ** m)


def sign_test_p_greater(gained: int, lost: int) -> float:
    """One-sided exact sign test of "B beats A more often than A beats B" (module docstring); 1.0
    when m = 0."""
    m = gained + lost
    return sum(math.comb(m, i) for i in range(gained, m + 1)) / 2 ** m


def _all_subsets(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_{j∈F} values_j, |F|) for all 2^J subsets F (∅ first), built by doubling: F without j, then
    with j."""
    sums, sizes = np.zeros(1), np.zeros(1, dtype=np.int64)
    for v in values:
        sums, sizes = np.concatenate([sums, sums + v]), np.concatenate([sizes, sizes + 1])
    return sums, sizes


def _sampled_subsets(values: np.ndarray, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_{j∈F_b} values_j, |F_b|) for `draws` random subsets (each j in with probability 1/2), in
    chunks."""
    rng, sums, sizes = np.random.default_rng(seed), [], []
    chunk = max(1, 4_000_000 // len(values))
    for start in range(0, draws, chunk):
        picks = rng.random((min(chunk, draws - start), len(values))) < 0.5
        sums.append(picks @ values)
        sizes.append(picks.sum(axis=1))
    return np.concatenate(sums), np.concatenate(sizes)


def sign_flip(means: list[float], level: float = 0.95, draws: int = 100_000,
              seed: int = 0) -> tuple[float, tuple[float, float], str]:
    """(two-sided p, interval at `level`, how: "exact" | "monte carlo") of the sign-flip test on the
    per-instance mean differences D_j, and the interval that inverts it (module docstring)."""
    d = np.asarray(means, dtype=np.float64)
    J, alpha = len(d), 1 - level
    if J == 0:
        return 1.0, (-1.0, 1.0), "exact"
    if J <= EXACT_UP_TO:
        sums, sizes = _all_subsets(d)          # ∅ included: it is the observed pattern
        total, how = 2 ** J, "exact"
        p_plus, p_minus = np.sum(sums <= _TIE) / total, np.sum(sums >= -_TIE) / total
    else:
        sums, sizes = _sampled_subsets(d, draws, seed)
        total, how = draws + 1, "monte carlo"
        p_plus, p_minus = (1 + np.sum(sums <= _TIE)) / total, (1 + np.sum(sums >= -_TIE)) / total
    p = float(min(1.0, 2 * min(p_plus, p_minus)))
    subset_means = np.sort(sums[sizes > 0] / sizes[sizes > 0])
    k = math.floor(alpha / 2 * total)
    if k == 0:
        return p, (-1.0, 1.0), how
    return p, (float(subset_means[k - 1]), float(subset_means[len(subset_means) - k])), how


def compare(scores_a: list[list[float]], scores_b: list[list[float]], draws: int = 100_000,
            seed: int = 0) -> dict:
    """B against A on the same tasks, grouped by instance (module docstring, "By instance"): the
    mean instance difference D̄, the sign-flip p and its 95% interval by instance, and, descriptive
    only, the tasks gained and lost per task. Instances without a task drop out."""
    if [len(g) for g in scores_a] != [len(g) for g in scores_b]:
        raise ValueError("compare: the two rows must score the same tasks, grouped the same way")
    diffs = [[b - a for a, b in zip(ga, gb)] for ga, gb in zip(scores_a, scores_b) if ga]
    means = [sum(g) / len(g) for g in diffs]
    p, interval, how = sign_flip(means, draws=draws, seed=seed)
    flat = [d for g in diffs for d in g]
    return {"difference": sum(means) / max(1, len(means)), "p": p, "ci95": interval, "test": how,
            "instances": len(means), "n": len(flat),
            "per_task_gained": sum(d > 0 for d in flat), "per_task_lost": sum(d < 0 for d in flat)}


def bootstrap_by_instance(diffs: list[list[float]], draws: int = 10_000, seed: int = 0,
                          level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean task difference, resampling the groups of `diffs` (one draw
    picks as many groups with replacement and takes the mean d over all their tasks), from
    random.Random(seed)."""
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


def generalises_over(task_ids: list[list[str]]) -> str:
    """What `compare`'s p and interval generalise over, said under every table of them
    (train_grpo.py --eval, combine, the report): the instances are the sample; where the
    instances share their scoring tasks (an id repeated: --eval-scoring shared), the tasks
    are not."""
    n_scored = sum(len(ids) for ids in task_ids)
    n_distinct = len({t for ids in task_ids for t in ids})
    if n_distinct < n_scored:
        return (f"p-values and intervals generalise over new instances (each a skill evolved "
                f"afresh on evolve tasks of its own), not over new scoring tasks: each type's "
                f"instances share one set of scoring tasks ({n_distinct} distinct here), so a "
                f"difference holds on these tasks.")
    return ("p-values and intervals generalise over new instances (each a skill evolved afresh "
            "and scored on tasks of its own).")


def compare_tasks(scores_a: list[float], scores_b: list[float], draws: int = 10_000,
                  seed: int = 0) -> dict:
    """B against A on the same independent tasks under fixed skill sets (module docstring, "By
    task"): difference, gained, lost, the two-sided sign-test p and a bootstrap 95% interval over
    tasks."""
    if len(scores_a) != len(scores_b):
        raise ValueError("compare_tasks: the two rows must score the same tasks")
    flat = [b - a for a, b in zip(scores_a, scores_b)]
    gained, lost = sum(d > 0 for d in flat), sum(d < 0 for d in flat)
    return {"difference": sum(flat) / max(1, len(flat)), "gained": gained, "lost": lost,
            "p": sign_test_p(gained, lost),
            "ci95": bootstrap_by_instance([[d] for d in flat], draws, seed),
            "n": len(flat)}
