"""minskill.paired against hand computations: the exact sign test, and the bootstrap that resamples instances."""
import math

import pytest

from minskill.paired import bootstrap_by_instance, compare, sign_test_p


@pytest.mark.parametrize("gained, lost, expected", [
    (0, 0, 1.0),                       # no untied pair: nothing to test
    (5, 0, 2 * 1 / 32),                # m = 5: 2 · C(5,0) / 2^5
    (3, 1, 2 * (1 + 4) / 16),          # m = 4: 2 · (C(4,0) + C(4,1)) / 2^4 = 0.625
    (1, 1, 1.0),                       # 2 · (1 + 2) / 4 > 1: capped
    (1, 3, 2 * (1 + 4) / 16),          # symmetric
])
def test_sign_test_by_hand(gained, lost, expected):
    assert sign_test_p(gained, lost) == pytest.approx(expected)


def test_sign_test_of_the_readme_base_skill_comparison():
    """70 gained / 36 lost (the base skills against no skill on 320 qa tasks): p ≈ 0.001."""
    p = sign_test_p(70, 36)
    assert p == pytest.approx(2 * sum(math.comb(106, i) for i in range(37)) / 2 ** 106) and 0.001 < p < 0.002


def test_bootstrap_is_exact_when_every_resample_has_the_same_mean():
    """Instances (sum 1 over 2 tasks) and (0.5 over 1 task): any resample's task mean is 0.5."""
    assert bootstrap_by_instance([[1.0, 0.0], [0.5]], draws=500, seed=3) == (0.5, 0.5)


def test_bootstrap_resamples_instances_not_tasks():
    """Two instances of one task each, d = 1 and d = 0: resamples give 1, 0.5 or 0 (each end with
    probability 1/4), so the 95% interval is [0, 1]. Resampling the four tasks of [[1, 1], [0, 0]] by task
    would give a narrower interval; by instance it is the same [0, 1]."""
    assert bootstrap_by_instance([[1.0], [0.0]], draws=4000, seed=0) == (0.0, 1.0)
    assert bootstrap_by_instance([[1.0, 1.0], [0.0, 0.0]], draws=4000, seed=0) == (0.0, 1.0)


def test_bootstrap_with_a_fixed_seed_is_reproducible():
    diffs = [[1.0, 0.0, 0.0], [0.0, -1.0], [1.0], [0.0, 0.0, 1.0, 0.0]]
    first = bootstrap_by_instance(diffs, draws=2000, seed=7)
    assert first == bootstrap_by_instance(diffs, draws=2000, seed=7)
    assert -1.0 <= first[0] <= 0.2 <= first[1] <= 1.0      # the mean difference, 2/10, lies inside


def test_compare_counts_and_refuses_different_tasks():
    a = [[1.0, 0.0], [0.0, 0.0, 1.0]]
    b = [[1.0, 1.0], [1.0, 0.0, 0.0]]
    result = compare(a, b, draws=1000, seed=0)
    assert (result["gained"], result["lost"], result["n"]) == (2, 1, 5)
    assert result["difference"] == pytest.approx(1 / 5) and result["p"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="same tasks"):
        compare(a, [[1.0], [0.0]])
