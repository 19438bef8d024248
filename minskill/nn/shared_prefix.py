"""Shared-prefix log-probabilities: one forward (and backward) of a GRPO group's prompt for all its
samples.

The K candidate skills of one Skill-R1 generation are sampled from ONE editor prompt x of P tokens
(often ~500), and each is only ~64 tokens long. The plain update (sampling.completion_logprobs)
runs x + y_i through the model for every i, so the prompt is computed K times forward and K times
backward. Here the prompt runs once, with gradient, and every completion attends to its keys and
values:

    (h_x, {K_l, V_l})   = layers(x)                          once per group, P tokens
    h_{y_i}             = layers(y_i | K_l, V_l)             K rows of |y_i| tokens, positions
                                                             P..P+|y_i|−1
    log π(y_i,t | x, y_i,<t) = log_softmax(W h / T)[y_i,t]   h = h_x[P−1] for t = 0, else
                                                             h_{y_i}[t−1]

Autograd sums the K branches' gradients into the one prompt pass, so ∂L/∂θ is the same as in the
unshared computation (tests/test_shared_prefix.py compares every parameter's gradient within 1e-5
in float32). Completions are right-padded: under causal attention a real token never sees a later
pad, and pad keys are masked; pad positions give values that the returned mask marks invalid.

train_grpo.policy_update (`--shared-prefix`, on by default) calls `shared_prefix_logprobs` on each
micro-batch, which holds one prompt. `grouped_logprobs(model, prompts, completions)` is the drop-in
for sampling.completion_logprobs on rows of several prompts (the --eval KL): rows with the same
prompt form a group, each group runs through `shared_prefix_logprobs`, and the rows come back in
their order, padded alike.

The keys and values live in `DifferentiableKV`, which has the interface the model's attention uses
on a KV cache (`update(layer, k, v)` returns the keys and values to attend to, plus `length`,
`key_mask`, `next_position`), but concatenates instead of writing into preallocated buffers: an
in-place write into one shared buffer would invalidate the tensors autograd saved for the backward
pass. """
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from minskill.nn.sampling import token_logprobs


class DifferentiableKV:
    """Keys/values per layer, kept as autograd tensors; `expand(n)` makes n rows share one
    prefix."""

    def __init__(self, num_layers: int, batch_size: int, max_len: int, device):
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.next_position = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.batch_size, self.length, self.max_len, self.keeps_new = batch_size, 0, max_len, True

    def update(self, layer: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)
        if self.keeps_new:   # an expanded cache makes the last pass: keeping its rows' keys would
                             # only hold memory
            self.k[layer], self.v[layer] = k, v
        return k, v

    def expand(self, n: int) -> "DifferentiableKV":
        """The same prefix for n rows (a view: no copy; gradients flow back to the one prefix), for
        a last pass."""
        new = copy.copy(self)   # length and max_len as they are
        new.k, new.v = [t.expand(n, -1, -1, -1) for t in self.k], [
            t.expand(n, -1, -1, -1) for t in self.v
        ]
        new.key_mask, new.next_position = self.key_mask.expand(n, -1).clone(
                ), self.next_position.expand(n).clone()
        new.batch_size, new.keeps_new = n, False
        return new


def shared_prefix_logprobs(model, prompt: list[int], completions: list[list[int]], *,
                           temperature: float = 1.0,
                           chunk_tokens: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, Tc) float32 log-probs of the completions' tokens after `prompt` and their (K, Tc) bool
    mask: what sampling.completion_logprobs returns for K copies of the prompt, the prompt computed
    once (differentiable)."""
    if not prompt:
        raise ValueError("shared_prefix_logprobs: the prompt needs at least one token")
    device = model.device
    K, P = len(completions), len(prompt)
    Tc = max((len(c) for c in completions), default=0)
    mask = torch.tensor([[t < len(c) for t in range(Tc)] for c in completions], dtype=torch.bool,
                        device=device)
    if Tc == 0:
        return torch.zeros(K, 0, device=device), mask
    kv = DifferentiableKV(model.config.num_hidden_layers, 1, P + Tc, device)
    # (1, P, H)
    prefix = model.hidden_states(torch.tensor([prompt], device=device), cache=kv)
    # right-padded
    ids = torch.tensor([c + [0] * (Tc - len(c)) for c in completions], device=device)
    # (K, Tc, H)
    hidden = model.hidden_states(ids, mask.long(), cache=kv.expand(K))
    # token t is predicted from the hidden state one slot earlier: the prompt's last one for t = 0
    # (K, Tc, H)
    before = torch.cat([prefix[:, -1:].expand(K, 1, -1), hidden[:, :-1]], dim=1)
    values = token_logprobs(before[mask], ids[mask], model.lm_head.weight, temperature or 1.0,
                            chunk_tokens)
    return torch.zeros(K, Tc, device=device).masked_scatter(mask, values), mask


def grouped_logprobs(model, prompts: list[list[int]], completions: list[list[int]], *,
                     temperature: float = 1.0,
                     chunk_tokens: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """sampling.completion_logprobs's result, computing each distinct prompt once (module
    docstring)."""
    if len(prompts) != len(completions):
        raise ValueError(f"grouped_logprobs: {len(prompts)} prompts but {len(completions)} "
                         f"completions")
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(row)
    Tc = max((len(c) for c in completions), default=0)
    pieces, masks, order = [], [], []
    for prompt, rows in groups.items():
        logp, mask = shared_prefix_logprobs(model, list(prompt), [completions[r] for r in rows],
                                            temperature=temperature, chunk_tokens=chunk_tokens)
        pieces.append(F.pad(logp, (0, Tc - logp.shape[1])))
        masks.append(F.pad(mask, (0, Tc - mask.shape[1])))
        order += rows
    back = torch.argsort(torch.tensor(order, device=model.device))   # group order -> the rows' own
                                                                     # order
    return torch.cat(pieces)[back], torch.cat(masks)[back]
