"""The shared-prefix update (minskill.nn.shared_prefix): one prompt pass for a whole GRPO group gives the same
log-probs and the same gradient of every parameter as the unshared computation (the prompt repeated for each
completion, sampling.completion_logprobs), within 1e-5 in float32, for the three aggregations and with β > 0."""
import copy

import pytest
import torch

from minskill.nn.sampling import completion_logprobs
from minskill.nn.shared_prefix import grouped_logprobs, shared_prefix_logprobs
from minskill.nn.weights import load_model
from minskill.skill_r1.grpo import policy_loss
from tiny import make_tiny_model_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("sp"), family="qwen3", chat_format="qwen3")
    model, _ = load_model(str(folder), dtype=torch.float32)
    return model, copy.deepcopy(model).eval().requires_grad_(False)


PROMPT = [5, 17, 33, 2, 91, 40, 7, 12, 66, 3]
COMPLETIONS = [[8, 9, 10, 11], [21], [30, 31, 32], [44, 45]]


def test_log_probs_equal_the_unshared_ones(models):
    model, _ = models
    with torch.no_grad():
        shared, mask = shared_prefix_logprobs(model, PROMPT, COMPLETIONS, temperature=0.7)
        plain, plain_mask = completion_logprobs(model, [PROMPT] * len(COMPLETIONS), COMPLETIONS, temperature=0.7)
    assert torch.equal(mask, plain_mask)
    assert torch.allclose(shared[mask], plain[mask], atol=1e-5)


def grads(model, logp_fn, agg, beta, ref):
    model.zero_grad(set_to_none=True)
    logp, mask = logp_fn(model)
    ref_logp = logp_fn(ref)[0].detach() if beta > 0 else None
    advantages = torch.tensor([0.5, -0.25, 1.0, -1.25])
    loss, _ = policy_loss(logp, logp.detach() - 0.05, advantages, mask, ref_logp=ref_logp, beta=beta, agg=agg,
                          max_new_tokens=8)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("agg, beta", [("token_mean", 0.0), ("seq_mean", 0.0), ("dr_grpo", 0.0),
                                       ("token_mean", 0.1)])
def test_every_parameter_gradient_equals_the_unshared_one(models, agg, beta):
    model, ref = models
    shared = grads(model, lambda m: shared_prefix_logprobs(m, PROMPT, COMPLETIONS), agg, beta, ref)
    plain = grads(model, lambda m: completion_logprobs(m, [PROMPT] * len(COMPLETIONS), COMPLETIONS), agg, beta, ref)
    assert shared.keys() == plain.keys() and len(shared) == len(list(model.parameters()))
    for name in plain:
        assert torch.allclose(shared[name], plain[name], atol=1e-5, rtol=1e-4), name


def test_an_empty_prompt_is_refused(models):
    with pytest.raises(ValueError, match="at least one token"):
        shared_prefix_logprobs(models[0], [], [[1]])


def test_grouped_rows_come_back_in_their_order(models):
    """Two prompts interleaved over five rows: the same values and mask as the unshared computation."""
    model, _ = models
    other = [9, 8, 7, 6]
    prompts = [PROMPT, other, PROMPT, other, PROMPT]
    completions = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]]
    with torch.no_grad():
        grouped, mask = grouped_logprobs(model, prompts, completions, temperature=0.9)
        plain, plain_mask = completion_logprobs(model, prompts, completions, temperature=0.9)
    assert torch.equal(mask, plain_mask) and torch.allclose(grouped[mask], plain[mask], atol=1e-5)
