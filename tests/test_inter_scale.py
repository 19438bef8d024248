"""--inter-scale: A_inter's divisor S (skill_r1.grpo.inter_divisor), the share of λ·A_inter in the
advantage (grpo.inter_share), and the flag's resume, against values computed by hand."""
import math

import pytest
import torch

import train_grpo
from minskill.runs import mark_run_folder
from minskill.skill_r1.grpo import inter_advantage, inter_divisor, inter_share, intra_advantages
from minskill.skill_r1.loop import Candidate, Evolution, Generation, Instance, assign_advantages
from minskill.skill_r1.records import metrics_row


def evolution(seed: float, generations: list[list[float]]) -> Evolution:
    """An Evolution with only what assign_advantages reads: the rewards, each generation's mean."""
    ev = Evolution(Instance("x", "t", []), "", seed, [])
    for g, rewards in enumerate(generations, 1):
        group = [Candidate(g, [], [], [], "", "skill", None, reward=r) for r in rewards]
        mean = sum(rewards) / len(rewards)
        prev = ev.generations[-1].mean_reward if ev.generations else seed
        ev.generations.append(Generation(g, group, mean, mean - prev, 0, "skill", max(rewards)))
    return ev


def advantages(ev: Evolution) -> list[list[float]]:
    return [[c.advantage for c in gen.candidates] for gen in ev.generations]


def test_pooled_std_divides_a_inter_by_the_std_of_the_seed_and_every_candidate():
    # pooled rewards 0, (0 1 1 0), (1 1 1 1): mean 2/3, squared deviations 3·4/9 + 6·1/9 = 2,
    # Bessel variance 2/8
    seed, gens = 0.0, [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    assert inter_divisor(seed, gens, "raw") == 1.0
    assert inter_divisor(seed, gens, "pooled-std") == pytest.approx(0.5 + 1e-4, abs=1e-12)
    ev = evolution(seed, gens)
    assign_advantages([ev], lam=1.0, scale_by_std=True, inter_scale="pooled-std")
    intra = 0.5 / (math.sqrt(1 / 3) + 1e-4)         # generation 1: ±0.5 / its sample std
    inter = 0.5 / (0.5 + 1e-4)                     # both generations' means rise by 0.5
    expected = [[inter - intra, inter + intra, inter + intra, inter - intra], [inter] * 4]
    for got, want in zip(advantages(ev), expected):
        assert got == pytest.approx(want, abs=1e-5)


def test_raw_is_the_papers_form_bit_for_bit():
    seed, gens = 0.25, [[0.0, 0.5, 0.75, 0.25], [0.5, 0.5, 1.0, 0.0]]
    ev = evolution(seed, gens)
    assign_advantages([ev], lam=0.5, scale_by_std=True)          # the function's default: raw
    # the expression A was computed by before --inter-scale existed
    before = [(intra_advantages(r, True) + 0.5 * inter_advantage(r, prev)).tolist()
              for r, prev in zip(gens, [seed, 0.375])]
    assert advantages(ev) == before
    # A_inter stays on the reward scale: generation 2's mean 0.5 is 0.125 above generation 1's
    assert sum(advantages(ev)[1]) / 4 == pytest.approx(0.5 * 0.125, abs=1e-6)


def test_zero_variance_within_groups_but_not_across_them():
    # pooled 0, 1, 1, 1, 1: mean 0.8, squared deviations 0.64 + 4·0.04 = 0.8, Bessel 0.2
    ev = evolution(0.0, [[1.0, 1.0], [1.0, 1.0]])
    assign_advantages([ev], lam=1.0, scale_by_std=True, inter_scale="pooled-std")
    s = math.sqrt(0.2) + 1e-4
    assert advantages(ev)[0] == pytest.approx([1 / s] * 2, abs=1e-5)
    assert advantages(ev)[1] == pytest.approx([0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("reward", [0.0, 1 / 3, 0.7])
def test_no_spread_at_all_gives_zeros_not_nan(reward):
    # every reward equal, the seed's included: the std is 0, S = 1, every A is 0 (up to float32
    # rounding, which a division by eps would magnify)
    gens = [[reward] * 4, [reward] * 4]
    assert inter_divisor(reward, gens, "pooled-std") == 1.0
    ev = evolution(reward, gens)
    assign_advantages([ev], lam=2.0, scale_by_std=True, inter_scale="pooled-std")
    flat = torch.tensor([a for group in advantages(ev) for a in group])
    assert torch.isfinite(flat).all() and flat.abs().max() < 1e-6


def test_degenerate_pools_and_bad_forms():
    assert inter_divisor(0.5, [], "pooled-std") == 1.0          # the seed alone: nothing to scale
    assert inter_divisor(0.0, [[1.0]], "pooled-std") == pytest.approx(math.sqrt(0.5) + 1e-4)
    with pytest.raises(ValueError, match="unknown 'z'.*raw, pooled-std"):
        inter_divisor(0.0, [[1.0]], "z")


def test_inter_share_equals_the_hand_computation():
    # group means 0.5 and 0.2 are λ·A_inter/S:
    # (2·0.5 + 2·0.2) / (|1.5| + |−0.5| + 0.2 + 0.2) = 1.4 / 2.4
    assert inter_share([[1.5, -0.5], [0.2, 0.2]]) == pytest.approx(1.4 / 2.4)
    assert inter_share([[0.3, -0.3]]) == 0.0                     # λ = 0: all A_intra
    assert inter_share([[0.0, 0.0], []]) == 0.0                  # nothing moves: 0, not NaN
    ev = evolution(0.0, [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assign_advantages([ev], lam=1.0, scale_by_std=True, inter_scale="pooled-std")
    inter, intra = 0.5 / (0.5 + 1e-4), 0.5 / (math.sqrt(1 / 3) + 1e-4)
    # generation 1: |inter ± intra|, two of each; generation 2: inter
    total = 2 * abs(inter - intra) + 2 * (inter + intra) + 4 * inter
    assert inter_share(advantages(ev)) == pytest.approx(8 * inter / total, abs=1e-5)


def test_flag_default_record_and_resume_of_a_run_saved_without_it(tmp_path, capsys):
    assert train_grpo.parse_args([]).inter_scale == "pooled-std"     # chosen by the λ sweep
    assert train_grpo.parse_args(["--inter-scale", "raw"]).inter_scale == "raw"
    with pytest.raises(SystemExit):
        train_grpo.parse_args(["--inter-scale", "std"])
    assert "inter_scale" in train_grpo.RESUME_MUST_MATCH
    # a run folder started before --inter-scale existed (its saved flags lack it), nothing saved
    # yet: --resume starts it again with its flags, and the form it had was the raw one
    old = {k: v for k, v in vars(train_grpo.parse_args([])).items() if k != "inter_scale"}
    mark_run_folder(tmp_path, "train_grpo.py", old)
    resume = ["--resume", "--out", str(tmp_path)]
    assert train_grpo.parse_args(resume).inter_scale == "raw"
    with pytest.raises(SystemExit, match="--inter-scale 'raw' -> 'pooled-std'"):
        train_grpo.parse_args(resume + ["--inter-scale", "pooled-std"])
    mark_run_folder(tmp_path, "train_grpo.py", {**old, "inter_scale": "pooled-std"})
    assert train_grpo.parse_args(resume).inter_scale == "pooled-std"   # a new run keeps its form


def test_each_step_records_the_share_of_lambda_a_inter():
    ev = evolution(0.0, [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    cands = assign_advantages([ev], lam=0.5, scale_by_std=True, inter_scale="pooled-std")
    stats = dict.fromkeys(("loss", "kl_mean", "ratio_mean", "clip_frac_low", "clip_frac_high",
                           "grad_norm", "logp_mismatch", "trained_sequences", "train_tokens"), 0.0)
    usage = dict.fromkeys(("calls", "prompt_tokens", "completion_tokens", "busy_seconds",
                           "request_seconds"), 0)
    row = metrics_row(0, [ev], cands, stats, usage, 0.0, 1.0, 1e-5)
    # λ·A_inter/S = 0.5 · 0.5 / (0.5 + 1e-4) in both generations;
    # A_intra = ±0.5 / (√(1/3) + 1e-4) in generation 1 only (generation 2 has no spread)
    inter, intra = 0.25 / (0.5 + 1e-4), 0.5 / (math.sqrt(1 / 3) + 1e-4)
    total = 2 * abs(inter - intra) + 2 * (inter + intra) + 4 * inter
    assert row["inter_share"] == pytest.approx(8 * inter / total, abs=1e-5)
