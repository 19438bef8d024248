"""Tests of minskill.skill_r1.grpo: bi-level advantages and the clipped GRPO loss, against hand computations."""
import math

import pytest
import torch

from minskill.skill_r1.grpo import (bilevel_advantages, check_loss_config, inter_advantage, intra_advantages,
                                   policy_loss)

# A hand-made batch: 3 sequences of 4, 2 and 3 valid tokens (9 in all), right-padded to T = 4.
MASK = torch.tensor([[1, 1, 1, 1],
                     [1, 1, 0, 0],
                     [1, 1, 1, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, -0.5, 2.0])
LENGTHS = [4, 2, 3]


def _logp_leaf(values=None):
    values = torch.full((3, 4), -1.0) if values is None else torch.tensor(values)
    return values.clone().requires_grad_(True)


# --------------------------------------------------------------------------------------------- advantages

def test_lambda_zero_gives_mean_centred_advantages():
    adv = bilevel_advantages([0.2, 0.5, 0.8, 0.5], prev_mean=0.1, lam=0.0)
    assert adv.dtype == torch.float32
    assert torch.allclose(adv, torch.tensor([-0.3, 0.0, 0.3, 0.0]), atol=1e-6)
    assert abs(float(adv.sum())) < 1e-6


def test_inter_term_matches_hand_computation():
    rewards = [0.2, 0.5, 0.8, 0.5]                       # mean 0.5
    assert inter_advantage(rewards, 0.3) == pytest.approx(0.2)
    assert inter_advantage(rewards, 0.9) == pytest.approx(-0.4)
    assert inter_advantage(rewards, None) == 0.0
    adv = bilevel_advantages(rewards, prev_mean=0.3, lam=0.5)   # intra + 0.5 * 0.2
    assert torch.allclose(adv, torch.tensor([-0.2, 0.1, 0.4, 0.1]), atol=1e-6)
    # Worse than the previous generation: every candidate is pushed down by λ·A_inter.
    adv = bilevel_advantages(torch.tensor([0.0, 0.0]), prev_mean=1.0, lam=2.0)
    assert torch.allclose(adv, torch.tensor([-2.0, -2.0]))


def test_scale_by_std_uses_sample_std_and_handles_degenerate_groups():
    # mean 0.5, deviations ±0.5, Bessel variance 4·0.25/3 = 1/3.
    std = math.sqrt(1 / 3)
    adv = intra_advantages([0.0, 1.0, 1.0, 0.0], scale_by_std=True)
    expected = torch.tensor([-0.5, 0.5, 0.5, -0.5]) / (std + 1e-4)
    assert torch.allclose(adv, expected, atol=1e-6)
    # The inter term is not divided by the std.
    adv = bilevel_advantages([0.0, 1.0, 1.0, 0.0], prev_mean=0.25, lam=1.0, scale_by_std=True)
    assert torch.allclose(adv, expected + 0.25, atol=1e-6)
    # Zero variance and a single candidate give zeros, not NaN.
    assert torch.equal(intra_advantages([0.7, 0.7, 0.7], scale_by_std=True), torch.zeros(3))
    assert torch.equal(intra_advantages([0.7], scale_by_std=True), torch.zeros(1))


def test_advantage_input_errors():
    with pytest.raises(ValueError, match="non-empty 1-D"):
        bilevel_advantages([], prev_mean=0.0, lam=1.0)
    with pytest.raises(ValueError, match="finite"):
        bilevel_advantages([0.0, float("nan")], prev_mean=0.0, lam=1.0)
    with pytest.raises(ValueError, match="prev_mean"):
        inter_advantage([0.0], float("inf"))


# --------------------------------------------------------------------------------------------- loss

@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "dr_grpo"])
def test_ratio_one_beta_zero_gradient_equals_reinforce(agg):
    logp = _logp_leaf([[-1.0, -2.0, -0.5, -3.0], [-0.1, -1.5, 0.0, 0.0], [-2.2, -0.7, -1.1, 0.0]])
    loss, stats = policy_loss(logp, logp.detach(), ADV, MASK, agg=agg, max_new_tokens=5)
    loss.backward()
    # REINFORCE: d loss / d logp_{b,t} = −A_b · m_{b,t} / normaliser, with the normaliser of `agg`.
    expected = torch.zeros(3, 4)
    for b, length in enumerate(LENGTHS):
        normaliser = {"token_mean": 9.0, "seq_mean": 3.0 * length, "dr_grpo": 3.0 * 5}[agg]
        expected[b, :length] = -ADV[b] / normaliser
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    # And the same as autograd through the REINFORCE objective itself.
    logp2 = logp.detach().clone().requires_grad_(True)
    per_token = -ADV[:, None] * logp2 * MASK
    reinforce = {"token_mean": per_token.sum() / 9,
                 "seq_mean": (per_token.sum(1) / torch.tensor(LENGTHS, dtype=torch.float32)).mean(),
                 "dr_grpo": per_token.sum() / 15}[agg]
    reinforce.backward()
    assert torch.allclose(logp.grad, logp2.grad, atol=1e-6)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_frac_low"] == 0.0 and stats["clip_frac_high"] == 0.0 and stats["kl_mean"] == 0.0


def test_aggregations_give_their_defining_values():
    # Ratios inside the clip range, so the per-token loss is −ratio·A; masked slots hold garbage.
    ratios = torch.tensor([[1.0, 1.1, 0.9, 1.05],
                           [1.2, 0.8, 7.0, 7.0],
                           [1.0, 0.95, 1.15, 7.0]])
    logp = _logp_leaf(torch.zeros(3, 4).tolist())
    old = -torch.log(ratios)
    old[1, 2:] = float("nan")
    old[2, 3] = float("inf")
    adv = torch.tensor([1.0, -1.0, 2.0])
    # Per-token losses: row 0: −1, −1.1, −0.9, −1.05 (sum −4.05); row 1: 1.2, 0.8 (sum 2.0);
    # row 2: −2, −1.9, −2.3 (sum −6.2). Total −8.25 over 9 tokens.
    kwargs = dict(eps_low=0.25, eps_high=0.25)
    token_mean, _ = policy_loss(logp, old, adv, MASK, agg="token_mean", **kwargs)
    seq_mean, _ = policy_loss(logp, old, adv, MASK, agg="seq_mean", **kwargs)
    dr_grpo, stats = policy_loss(logp, old, adv, MASK, agg="dr_grpo", max_new_tokens=6, **kwargs)
    assert token_mean.item() == pytest.approx(-8.25 / 9, abs=1e-6)
    assert seq_mean.item() == pytest.approx((-4.05 / 4 + 2.0 / 2 - 6.2 / 3) / 3, abs=1e-6)
    assert dr_grpo.item() == pytest.approx(-8.25 / (3 * 6), abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(9.15 / 9, abs=1e-6)
    assert stats["num_tokens"] == 9.0
    for loss in (token_mean, seq_mean, dr_grpo):
        assert torch.isfinite(loss)


def test_clipped_tokens_on_the_favoured_side_get_zero_gradient():
    # One sequence of six tokens, advantage +1, and one of six tokens, advantage −1.
    ratios = torch.tensor([[1.5, 1.25, 1.1, 0.5, 0.9, 1.0],
                           [0.5, 0.75, 0.9, 1.5, 1.1, 1.0]])
    mask = torch.ones(2, 6, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    logp = torch.zeros(2, 6, requires_grad=True)
    loss, stats = policy_loss(logp, -torch.log(ratios), adv, mask, eps_low=0.2, eps_high=0.28)
    loss.backward()
    grad = logp.grad
    # A > 0: ratio 1.5 > 1 + 0.28 is clipped (zero gradient); 1.25 < 1.28 is not (asymmetric ε_high).
    # ratio 0.5 < 0.8 with A > 0 is on the other side: min keeps ratio·A, gradient −A·ratio/N.
    # A < 0: ratio 0.5 and 0.75 < 0.8 are clipped; 1.5 with A < 0 is not.
    clipped = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    assert torch.all(grad[clipped] == 0)
    expected = -adv[:, None] * ratios / 12          # d(−ratio·A)/dlogp = −A·ratio, token mean over 12
    assert torch.allclose(grad[~clipped], expected[~clipped], atol=1e-6)
    assert torch.all(grad[~clipped] != 0)
    assert stats["clip_frac_high"] == pytest.approx(1 / 12)
    assert stats["clip_frac_low"] == pytest.approx(2 / 12)
    assert stats["clip_frac"] == pytest.approx(3 / 12)


def test_kl_is_zero_with_zero_gradient_when_policy_equals_reference():
    logp = _logp_leaf([[-1.0, -2.0, -0.5, -3.0], [-0.1, -1.5, 0.0, 0.0], [-2.2, -0.7, -1.1, 0.0]])
    zero_adv = torch.zeros(3)
    loss, stats = policy_loss(logp, logp.detach(), zero_adv, MASK, ref_logp=logp.detach(), beta=0.5)
    loss.backward()
    assert loss.item() == 0.0 and stats["kl_mean"] == 0.0
    assert torch.all(logp.grad == 0)


def test_kl_k3_value_and_gradient_when_policy_differs():
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[0.5, -1.0]])                # d = ref − logp
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = policy_loss(logp, logp.detach(), torch.zeros(1), mask, ref_logp=ref, beta=0.1)
    k3 = [math.exp(0.5) - 0.5 - 1, math.exp(-1.0) + 1.0 - 1]
    assert stats["kl_mean"] == pytest.approx(sum(k3) / 2, rel=1e-6)
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 2, rel=1e-6)
    loss.backward()
    # d k3 / d logp = 1 − exp(ref − logp)
    expected = torch.tensor([[0.1 * (1 - math.exp(0.5)) / 2, 0.1 * (1 - math.exp(-1.0)) / 2]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    # With β = 0 the KL is reported but not in the loss.
    loss0, stats0 = policy_loss(logp, logp.detach(), torch.zeros(1), mask, ref_logp=ref, beta=0.0)
    assert loss0.item() == 0.0 and stats0["kl_mean"] == pytest.approx(stats["kl_mean"])


def test_first_pass_loss_is_minus_lambda_inter_advantage():
    # Documented property: on the first pass the intra part averages out (equal lengths), leaving −λ·A_inter.
    adv = bilevel_advantages([0.0, 1.0, 0.5, 0.5], prev_mean=0.25, lam=0.5)
    logp = torch.full((4, 3), -1.0, requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones(4, 3, dtype=torch.bool))
    assert loss.item() == pytest.approx(-0.5 * 0.25, abs=1e-6)


def test_loss_input_errors():
    logp = _logp_leaf()
    with pytest.raises(ValueError, match="token_mean, seq_mean, dr_grpo"):
        policy_loss(logp, logp.detach(), ADV, MASK, agg="sum")
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy_loss(logp, logp.detach(), ADV, MASK, agg="dr_grpo")
    with pytest.raises(ValueError, match="longest completion"):
        policy_loss(logp, logp.detach(), ADV, MASK, agg="dr_grpo", max_new_tokens=3)
    with pytest.raises(ValueError, match=r"advantages \(B,\); got logp \(3, 4\), .*advantages \(2,\)"):
        policy_loss(logp, logp.detach(), ADV[:2], MASK)
    with pytest.raises(ValueError, match=r"must be \(B, T\) alike.*mask \(3, 3\)"):
        policy_loss(logp, logp.detach(), ADV, MASK[:, :3])
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss(logp, logp.detach(), ADV, MASK, beta=0.1)



def test_the_update_knobs_are_checked_at_set_up():
    check_loss_config(lam=0.5, eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean")
    with pytest.raises(ValueError, match="eps_low"):
        check_loss_config(lam=0.5, eps_low=1.0, eps_high=0.2, beta=0.0, agg="token_mean")
    with pytest.raises(ValueError, match="beta"):
        check_loss_config(lam=0.5, eps_low=0.2, eps_high=0.2, beta=-1.0, agg="token_mean")
    with pytest.raises(ValueError, match="lam must be finite"):
        check_loss_config(lam=float("nan"), eps_low=0.2, eps_high=0.2, beta=0.0, agg="token_mean")
    with pytest.raises(ValueError, match="token_mean, seq_mean, dr_grpo"):
        check_loss_config(lam=0.5, eps_low=0.2, eps_high=0.2, beta=0.0, agg="sum")
