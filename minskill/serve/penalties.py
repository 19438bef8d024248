"""Sampling controls users send: `logit_bias`, vLLM's `repetition_penalty`, `frequency_penalty` and
`presence_penalty`, applied to each row's logits before its token is chosen.

A row's logits change by what that row has read and written, never by its batch (its tokens depend
on its own prompt and generator only, as minskill.serve.scheduler's invariants say). In vLLM's
order, with the row's prompt tokens P and the tokens it has generated so far O:

    1. logit_bias:          logits[t] += bias[t]                          (OpenAI's, -100 to 100)
    2. repetition_penalty:  for t in P ∪ O: logits[t] / r if logits[t] > 0, else logits[t] * r
    3. frequency, presence: logits[t] -= frequency * count(t in O) + presence * (count(t in O) > 0)

then temperature, top-k / top-p and a JSON schema's mask (serve.constrained) as without them. The
penalties change the distribution a token is drawn from, so the reply's log-probs are of the
penalized distribution (as constrained decoding's are of the constrained one). Checking the request
fields: parse_penalties; rows without controls are left as they are, and a batch without any costs
nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minskill.serve.errors import bad_request

MAX_BIAS = 100.0      # OpenAI's bound on a logit_bias value
MAX_REPETITION = 10.0     # vLLM takes any > 0; past this a reply is all new tokens anyway


@dataclass(frozen=True)
class Penalties:
    """One request's controls (the module docstring's order); the neutral values change nothing."""
    frequency: float = 0.0
    presence: float = 0.0
    repetition: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()      # (token id, bias), ids sorted

    @property
    def neutral(self) -> bool:
        return self == Penalties()

    @property
    def field(self) -> str:
        """The first request field that sets these controls (for messages)."""
        given = {"frequency_penalty": self.frequency != 0, "presence_penalty": self.presence != 0,
                 "repetition_penalty": self.repetition != 1, "logit_bias": bool(self.logit_bias)}
        return next((name for name, value in given.items() if value), "logit_bias")


def parse_penalties(payload: dict, vocab_size: int | None, number) -> Penalties | None:
    """A request's controls (None: all neutral), or a 400 naming the field at fault;
    `number(payload, key, default, low, high, low_open)` checks one number (serve.backends').
    Penalties from -2 to 2, as OpenAI's; repetition_penalty > 0, up to MAX_REPETITION."""
    penalties = Penalties(number(payload, "frequency_penalty", 0.0, -2.0, 2.0),
                          number(payload, "presence_penalty", 0.0, -2.0, 2.0),
                          number(payload, "repetition_penalty", 1.0, 0.0, MAX_REPETITION, True),
                          parse_logit_bias(payload.get("logit_bias"), vocab_size))
    return None if penalties.neutral else penalties


def parse_logit_bias(value, vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    """A request's `logit_bias` ({"token id": bias, ...}, as OpenAI takes it) as (id, bias) pairs,
    or a 400 naming the entry at fault; ids at or past `vocab_size` (when the backend knows it) are
    refused."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request(f"'logit_bias' must be an object {{\"token id\": bias}}, got "
                          f"{value!r:.100}", "logit_bias")
    pairs = []
    for key, bias in value.items():
        where = f"logit_bias.{key}"
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise bad_request(f"'logit_bias' keys must be token ids (\"1234\"), got {key!r:.40}",
                              where)
        if vocab_size is not None and int(key) >= vocab_size:
            raise bad_request(f"'{where}': token id {key} is not in the model's vocabulary "
                              f"({vocab_size} tokens)", where)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not -MAX_BIAS <= bias <= MAX_BIAS:
            raise bad_request(f"'{where}' must be a number from -{MAX_BIAS:g} to {MAX_BIAS:g}, got "
                              f"{bias!r:.40}", where)
        pairs.append((int(key), float(bias)))
    return tuple(sorted(pairs))


def apply_penalties(logits: torch.Tensor, rows) -> torch.Tensor:
    """`logits` (rows, V) with each row's controls applied (rows without: as they are); the engine's
    rows have .penalties, .prompt and .tokens."""
    penalized = [i for i, row in enumerate(rows) if getattr(row, "penalties", None) is not None]
    if not penalized:
        return logits
    logits = logits.clone()
    for i in penalized:
        row = rows[i]
        logits[i] = penalized_logits(logits[i], row.penalties, row.prompt, row.tokens)
    return logits


def penalized_logits(logits: torch.Tensor, penalties: Penalties, prompt: list[int],
                     output: list[int]) -> torch.Tensor:
    """One row's (V,) logits after its controls (module docstring), from its own tokens only."""
    logits, device, width = logits.clone(), logits.device, logits.shape[0]
    if penalties.logit_bias:
        ids, biases = zip(*((t, b) for t, b in penalties.logit_bias if t < width))
        logits[torch.tensor(ids, device=device)] += torch.tensor(biases, device=device,
                                                                 dtype=logits.dtype)
    if penalties.repetition != 1.0:
        seen = torch.tensor(sorted({t for t in [*prompt, *output] if t < width}), dtype=torch.long,
                            device=device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / penalties.repetition,
                                   values * penalties.repetition)
    if output and (penalties.frequency or penalties.presence):
        counts = torch.bincount(torch.tensor(output, device=device), minlength=width)[:width]
        counts = counts.to(logits.dtype)
        logits -= penalties.frequency * counts + penalties.presence * (counts > 0).to(logits.dtype)
    return logits
