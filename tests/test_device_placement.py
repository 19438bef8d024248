"""Device placement, checked without a GPU.

The model sits explicitly on the CPU while torch's default device is `meta`. A tensor that the code creates
without naming a device then lands on `meta`, and the first operation that mixes it with the model's CPU
tensors raises. That is the CPU stand-in for a model on CUDA meeting tensors built on the CPU (the crash of
the first Skill-R1 update on a GPU). Every model path runs here: sampling, log-probs, the GRPO policy loss
and update (β > 0 too), an SFT step, the server's backend and the rewriter's pass.

Only torch's own optimizer internals are kept off `meta` (AdamW creates its step counter on the default
device by design); the test uses SGD inside the meta region for that reason.
"""
import copy
from types import SimpleNamespace

import pytest
import torch


import train_grpo
from minskill import sft
from minskill.masa import rewriter
from minskill.nn.sampling import completion_logprobs, generate
from minskill.nn.weights import load_model
from minskill.serve.server import CompletionRequest, ModelBackend
from minskill.skill_r1.grpo import policy_loss
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from tiny import make_tiny_model_dir


@pytest.fixture(scope="module")
def cpu_model(tmp_path_factory):
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), family="llama", chat_format="chatml")
    model, tokenizer = load_model(str(folder), dtype=torch.float32, device="cpu")
    return model, tokenizer


def meta_default():
    """Everything inside runs with `meta` as torch's default device."""
    return torch.device("meta")


def prompts_of(tokenizer, n=2):
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"question {i}"}], add_generation_prompt=True)
            for i in range(n)]


def test_meta_default_device_catches_a_tensor_built_without_a_device():
    """The premise of this file: a CPU tensor meeting one created without device= raises under meta."""
    on_cpu = torch.ones(2, device="cpu")
    with meta_default(), pytest.raises(RuntimeError):
        on_cpu + torch.tensor([1.0, 2.0])


def test_generation_creates_its_tensors_on_the_models_device(cpu_model):
    model, tokenizer = cpu_model
    prompts = prompts_of(tokenizer)
    expected = generate(model, prompts, n=2, max_new_tokens=5, temperature=[0.0, 1.0], top_p=0.9, seed=3,
                        tokenizer=tokenizer, pad_id=tokenizer.pad_token_id)
    with meta_default(), torch.no_grad():
        got = generate(model, prompts, n=2, max_new_tokens=5, temperature=[0.0, 1.0], top_p=0.9, seed=3,
                       tokenizer=tokenizer, pad_id=tokenizer.pad_token_id)
    assert [s.token_ids for s in got] == [s.token_ids for s in expected]


def test_completion_logprobs_and_policy_loss_on_the_models_device(cpu_model):
    model, tokenizer = cpu_model
    prompts, completions = prompts_of(tokenizer), [[5, 6, 7], [8, 9]]
    with meta_default():
        logp, mask = completion_logprobs(model, prompts, completions)
        # advantages given as a plain list or a tensor on another device are moved to logp's device
        loss, _ = policy_loss(logp, logp.detach(), [1.0, -1.0], mask)
        loss.backward()
    assert logp.device.type == "cpu" and torch.isfinite(loss)


@pytest.mark.parametrize("beta, shared_prefix", [(0.0, True), (0.05, True), (0.05, False)])
def test_skill_r1_policy_update_on_the_models_device(cpu_model, beta, shared_prefix):
    model, tokenizer = cpu_model
    prompts = prompts_of(tokenizer)
    candidates = [SimpleNamespace(prompt_ids=prompts[i % 2], token_ids=[5 + i, 6, 7][:2 + i % 2],
                                  logprobs=[-1.0] * (2 + i % 2), advantage=a)
                  for i, a in enumerate([0.5, -0.5, 0.25, -0.25])]
    args = SimpleNamespace(beta=beta, micro_batch=2, ppo_epochs=2, editor_temperature=1.0, eps_low=0.2,
                           eps_high=0.2, agg="token_mean", max_skill_tokens=8, grad_clip=1.0, bf16=False,
                           shared_prefix=shared_prefix)
    ref = copy.deepcopy(model).eval().requires_grad_(False) if beta > 0 else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the shared fixture model stays as it is
    with meta_default():
        stats = train_grpo.policy_update(model, ref, optimizer, candidates, args)
    assert stats["trained_sequences"] == 4 and stats["train_tokens"] > 0


def test_sft_step_on_the_models_device(cpu_model):
    model, tokenizer = cpu_model
    examples = [sft.Example(input_ids=[1, 5, 6, 7, 8], num_prompt_tokens=2, truncated=False),
                sft.Example(input_ids=[1, 9, 10], num_prompt_tokens=1, truncated=False)]
    cfg = sft.SFTConfig(micro_batch_size=1)
    with meta_default():
        nll = sft._forward_backward(model, examples, tokenizer.pad_token_id, model.device, cfg, n_targets_total=5)
        val = sft.evaluate_loss(model, examples, tokenizer.pad_token_id)
    model.zero_grad(set_to_none=True)
    assert nll > 0 and val > 0


def test_server_backend_on_the_models_device(cpu_model):
    model, tokenizer = cpu_model
    backend = ModelBackend(model, tokenizer, name="tiny")
    requests = [CompletionRequest(messages=[{"role": "user", "content": "hi"}], n=2, temperature=0.7, top_p=1.0,
                                  max_tokens=4, stop=(), seed=1)]
    with meta_default():
        choices = backend.complete(requests)
    assert len(choices[0]) == 2


def test_rewriter_pass_on_the_models_device(cpu_model):
    model, tokenizer = cpu_model
    skills = SkillSet(general=[Skill(name="be-brief", description="Answer briefly.", body="Give the answer.")],
                      task_specific={}, common_mistakes=[])
    with meta_default():
        text, finish = rewriter.rewrite_with_model(model, tokenizer, {"name": "tiny"}, skills, "short questions",
                                                  max_new_tokens=4, json_schema=False)
    assert finish in ("stop", "length") and isinstance(text, str)
