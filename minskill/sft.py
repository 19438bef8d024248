"""Supervised fine-tuning (SFT) of a chat model on (prompt, target reply) pairs: tokens, loss,
training loop. minskill/masa/rewriter_sft.py turns MASA's rewriter records into such chats,
minskill/skill_r1/cold_start.py the Skill-R1 editor's own prompts and skill replies.

With x the prompt tokens and y the target tokens, the loss of an effective batch is the token mean

    L(θ) = −(1/|T|) Σ_{t∈T} log p_θ(y_t | y_<t, x)      (T: every target position of the batch)

Decisions (in full, with the schedule's equations: docs/sft.md):
1. A chat is tokenised exactly as at inference, the target ending with the end-of-turn token.
2. log p_θ is computed at target positions only, in recomputed chunks: no (B, T, V) float32 logits.
3. The MASA paper's recipe is the default (AdamW, lr 1e-5, warmup + cosine, effective batch 4).
4. Batches are right-padded: no attention mask is needed, the loss mask removes the pads.
5. Checkpoints are staged HF folders plus trainer_state.pt; a resume replays the same batches.
6. `share_prompts`: a micro-batch computes each prompt once for all its targets (same L).
7. torchrun: each rank takes its share of a batch; gradients summed over ranks before clipping.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from minskill import distributed
from minskill.files import open_append, read_jsonl, write_jsonl_atomic
from minskill.nn.lora import ADAPTER_DIR, has_lora, load_peft_adapter, trainable_parameters
from minskill.nn.model import Transformer
from minskill.nn.optim import lr_factor
from minskill.nn.shared_prefix import shared_prefix_logprobs
from minskill.nn.tokenizer import Tokenizer
from minskill.nn.weights import load_pretrained
from minskill.plot import write_svg_plot
from minskill.runs import (TRAINER_STATE, load_trainer_state, recover_checkpoint, save_checkpoint,
                           set_rng_state)


# ----------------------------------------------------------------------------- tokenisation

@dataclass
class Example:
    """One tokenised record: `input_ids[num_prompt_tokens:]` are the target tokens (loss on them
    only)."""
    input_ids: list[int]
    num_prompt_tokens: int
    truncated: bool = False

    @property
    def num_target_tokens(self) -> int:
        return len(self.input_ids) - self.num_prompt_tokens


def end_of_turn_id(tokenizer: Tokenizer) -> int:
    """The token that closes an assistant turn in this tokenizer's chat template (<|im_end|>,
    <|eot_id|>).

    Found by rendering a one-turn chat and taking the first stop token after the assistant's
    content."""
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    prompt = tokenizer.apply_chat_template(probe[:1], add_generation_prompt=True)
    full = tokenizer.apply_chat_template(probe, add_generation_prompt=False)
    stops = set(tokenizer.stop_token_ids)
    for token in full[len(prompt):]:
        if token in stops:
            return token
    return tokenizer.eos_token_id


def encode_chat(tokenizer: Tokenizer, prompt: list[dict], target_text: str, max_length: int,
                too_long: str = "skip", eot_id: int | None = None) -> Example | None:
    """Tokenise prompt + target. Returns None when the example must be skipped.

    too_long="skip" drops an example longer than max_length; "truncate" keeps its first max_length
    tokens (still at least one target token). An example whose prompt alone fills max_length is
    skipped."""
    if too_long not in ("skip", "truncate"):
        raise ValueError(f"too_long must be 'skip' or 'truncate', got {too_long!r}")
    eot_id = end_of_turn_id(tokenizer) if eot_id is None else eot_id
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    target_ids = tokenizer.encode(target_text.strip()) + [eot_id]
    ids = prompt_ids + target_ids
    if len(ids) <= max_length:
        return Example(ids, len(prompt_ids))
    if too_long == "skip" or len(prompt_ids) >= max_length:
        return None
    return Example(ids[:max_length], len(prompt_ids), truncated=True)


def collate(examples: list[Example], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a batch. Returns input_ids (B, T) and loss_mask (B, T): True exactly at target
    tokens."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = [e.input_ids + [pad_id] * (width - len(e.input_ids)) for e in examples]
    loss_mask = [[e.num_prompt_tokens <= t < len(e.input_ids) for t in range(width)]
                 for e in examples]
    return (torch.tensor(input_ids, dtype=torch.long, device=device),
            torch.tensor(loss_mask, dtype=torch.bool, device=device))


# ----------------------------------------------------------------------------- the loss

def _chunk_nll(lm_head: torch.nn.Module, hidden: torch.Tensor,
               targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(lm_head(hidden).float(), targets, reduction="sum")


def target_nll(model: Transformer, input_ids: torch.Tensor, loss_mask: torch.Tensor,
               chunk_tokens: int = 1024) -> tuple[torch.Tensor, int]:
    """(−Σ_{t∈T} log p(y_t | y_<t), |T|) over the target tokens marked by `loss_mask` (B, T).

    Token t is predicted from the hidden state at t−1, so position 0 is never a target. Logits are
    computed only at target positions, chunk_tokens rows at a time; while training, each chunk is
    checkpointed so its (chunk, V) float32 logits are freed after the forward and recomputed in
    backward."""
    hidden = model.hidden_states(input_ids)                       # (B, T, H)
    predicts = loss_mask[:, 1:]                                   # hidden at t predicts token t+1
    states = hidden[:, :-1][predicts]                             # (N, H)
    targets = input_ids[:, 1:][predicts]                          # (N,)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, targets.numel(), chunk_tokens):
        piece = (states[start:start + chunk_tokens], targets[start:start + chunk_tokens])
        if torch.is_grad_enabled():
            total = total + checkpoint(_chunk_nll, model.lm_head, *piece, use_reentrant=False)
        else:
            total = total + _chunk_nll(model.lm_head, *piece)
    return total, int(targets.numel())


# ----------------------------------------------------------------------------- schedule and config

@dataclass
class SFTConfig:
    lr: float = 1e-5
    warmup_ratio: float = 0.1
    min_lr_ratio: float = 0.0
    epochs: float = 5.0
    batch_size: int = 4            # effective batch (examples per optimizer step)
    micro_batch_size: int = 1      # examples per forward/backward; accumulation = batch / micro
    max_length: int = 4096
    too_long: str = "skip"         # or "truncate"
    weight_decay: float = 0.0
    adam_betas: tuple = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0         # max global grad L2 norm; 0 = no clipping
    bf16: bool = False             # bf16 autocast (weights and optimizer stay float32)
    gradient_checkpointing: bool = False
    chunk_tokens: int = 1024       # rows of logits per loss chunk
    val_fraction: float = 0.1      # held-out share of the data when no validation set is given
    eval_every: int = 20           # optimizer steps between validation losses (0 = only at the end)
    save_every: int = 50           # optimizer steps between checkpoints (the last step always
                                   # saves)
    keep_checkpoints: int = 2
    log_every: int = 1
    seed: int = 0
    max_steps: int | None = None   # stop after this many optimizer steps (the schedule still spans
                                   # all)
    share_prompts: bool = False    # chats of one prompt trained together, the prompt computed once
                                   # (docstring)

    def __post_init__(self):
        if self.batch_size < 1 or self.micro_batch_size < 1 or \
                self.batch_size % self.micro_batch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a positive multiple of "
                             f"micro_batch_size ({self.micro_batch_size})")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.too_long not in ("skip", "truncate"):
            raise ValueError(f"too_long must be 'skip' or 'truncate', got {self.too_long!r}")
        if self.epochs <= 0 or self.lr <= 0 or self.max_length < 2:
            raise ValueError("epochs and lr must be positive and max_length at least 2")
        self.adam_betas = tuple(self.adam_betas)


# The command-line flags both SFT commands (rewrite.py train, skill_r1.cold_start) spell the same
# way, and the SFTConfig field each sets; the flags one command alone has go to config_from_args'
# `fields`
FLAG_FIELDS = {"lr": "lr", "warmup_ratio": "warmup_ratio", "min_lr_ratio": "min_lr_ratio",
               "epochs": "epochs",
               "batch_size": "batch_size", "micro_batch": "micro_batch_size",
               "weight_decay": "weight_decay",
               "grad_clip": "grad_clip", "bf16": "bf16",
               "grad_checkpointing": "gradient_checkpointing",
               "val_fraction": "val_fraction", "eval_every": "eval_every",
               "save_every": "save_every",
               "keep_checkpoints": "keep_checkpoints", "seed": "seed", "max_steps": "max_steps"}


def config_from_args(args, **fields) -> SFTConfig:
    """The SFTConfig an SFT command's parsed flags name (FLAG_FIELDS), with `fields` for the
    rest."""
    return SFTConfig(**{field: getattr(args, flag) for flag, field in FLAG_FIELDS.items()},
                     **fields)


def add_sft_arguments(group, defaults: SFTConfig, *, unit: str, held_out: str, max_steps_help: str,
                      main=None) -> None:
    """The training flags of FLAG_FIELDS that both SFT commands take, declared once (--bf16 and
    --seed each command declares with its device and data flags). `unit`: what a batch holds
    ("records", "chats"); `held_out`: what --val-fraction holds out; --lr, --epochs and
    --batch-size go to `main` when given."""
    d, main = defaults, main or group
    main.add_argument("--lr", type=float, default=d.lr,
                      help="peak learning rate (default %(default)g)")
    main.add_argument("--epochs", type=float, default=d.epochs, help="default %(default)g")
    main.add_argument("--batch-size", type=int, default=d.batch_size,
                      help=f"effective batch in {unit} (default %(default)s)")
    group.add_argument("--micro-batch", type=int, default=d.micro_batch_size,
                       help=f"{unit} per forward/backward; accumulation = batch / micro (default "
                            "%(default)s)")
    group.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio,
                       help="default %(default)s")
    group.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio,
                       help="cosine floor as a share of --lr (default %(default)g)")
    group.add_argument("--weight-decay", type=float, default=d.weight_decay,
                       help="AdamW (default %(default)g)")
    group.add_argument("--grad-clip", type=float, default=d.grad_clip,
                       help="max gradient norm, 0 = off (default %(default)g)")
    group.add_argument("--grad-checkpointing", action="store_true",
                       help="recompute layer activations in backward")
    group.add_argument("--val-fraction", type=float, default=d.val_fraction,
                       help=f"share of {held_out} held out for the validation loss (default "
                            "%(default)s)")
    group.add_argument("--eval-every", type=int, default=d.eval_every,
                       help="validation loss every N steps (default %(default)s)")
    group.add_argument("--save-every", type=int, default=d.save_every,
                       help="checkpoint every N steps (default %(default)s)")
    group.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                       help="checkpoints kept (default %(default)s)")
    group.add_argument("--max-steps", type=int, default=None, help=max_steps_help)


def split_records(records: list, val_fraction: float, seed: int = 0) -> tuple[list, list]:
    """Deterministic (train, validation) split; at least one training record is always kept."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_val = min(len(records) - 1, round(val_fraction * len(records))) if val_fraction > 0 else 0
    n_val = max(0, n_val)
    val = [records[i] for i in sorted(order[:n_val])]
    train = [records[i] for i in sorted(order[n_val:])]
    return train, val


def epoch_order(n: int, seed: int, epoch: int, groups: list[list[int]] | None = None) -> list[int]:
    """The shuffled example order of one epoch: a pure function of (seed, epoch), so resume replays
    it. With `groups` (lists of example indices, e.g. prompt_groups) the groups are shuffled, each
    kept together."""
    units = groups if groups is not None else [[i] for i in range(n)]
    order = list(range(len(units)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [i for u in order for i in units[u]]


def prompt_groups(examples: list[Example]) -> list[list[int]]:
    """Indices of the examples that share one prompt (the same prompt tokens), groups in first-seen
    order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, e in enumerate(examples):
        groups.setdefault(tuple(e.input_ids[:e.num_prompt_tokens]), []).append(i)
    return list(groups.values())


# ----------------------------------------------------------------------------- checkpoints

def _fingerprint(examples: list[Example]) -> str:
    digest = hashlib.sha256()
    for e in examples:
        digest.update(json.dumps([e.num_prompt_tokens, e.input_ids]).encode())
    return digest.hexdigest()[:16]


def checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The checkpoint-<step> folders, newest (highest step) first, after putting back a checkpoint
    that a kill left aside between the renames of its save. (A save is staged and renamed into
    place, so one of them that lacks its trainer state is damaged, not half-written.)"""
    for aside in Path(out_dir).glob(".old-checkpoint-*"):
        recover_checkpoint(aside.with_name(aside.name[len(".old-"):]))
    found = [(int(child.name.split("-", 1)[1]), child)
             for child in Path(out_dir).glob("checkpoint-*")
             if child.name.split("-", 1)[1].isdigit() and child.is_dir()]
    return [child for _, child in sorted(found, reverse=True)]


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The checkpoint-<step> folder with the highest step that has a trainer state, or None."""
    return next((child for child in checkpoints(out_dir) if (child / TRAINER_STATE).is_file()),
                None)


def _prune_checkpoints(out_dir: Path, keep: int) -> None:
    for path in checkpoints(out_dir)[max(1, keep):]:   # newest first; the newest one always stays
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- output: metrics,
# plot

def _format_seconds(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


def _read_metrics(path: Path, up_to_step: int | None = None) -> list[dict]:
    # a torn last line is dropped
    rows = [row for _, row in read_jsonl(path)] if path.is_file() else []
    return [r for r in rows if isinstance(r, dict)
            and (up_to_step is None or r.get("step", 0) <= up_to_step)]


def plot_metrics(metrics_path: str | os.PathLike, svg_path: str | os.PathLike,
                 title: str = "SFT") -> None:
    """Loss curve (train and validation loss per optimizer step) from a metrics JSONL."""
    rows = _read_metrics(Path(metrics_path))
    series = {"train loss": [(r["step"], r["loss"]) for r in rows if "loss" in r],
              "validation loss": [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]}
    write_svg_plot(svg_path, series, title, "optimizer step", "mean target-token NLL")


# ----------------------------------------------------------------------------- training

def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def _forward_backward(model, examples, pad_id, device, cfg: SFTConfig,
                      n_targets_total: int) -> float:
    """Accumulate gradients of one effective batch; returns the summed NLL (for logging)."""
    nll_sum = 0.0
    for start in range(0, len(examples), cfg.micro_batch_size):
        micro = examples[start:start + cfg.micro_batch_size]
        with _autocast(device, cfg.bf16):
            if cfg.share_prompts:
                nll = shared_prompt_nll(model, micro, cfg.chunk_tokens)
            else:
                nll, _ = target_nll(model, *collate(micro, pad_id, device), cfg.chunk_tokens)
        (nll / max(1, n_targets_total)).backward()
        nll_sum += float(nll.detach())
    return nll_sum


def shared_prompt_nll(model, examples: list[Example], chunk_tokens: int = 1024) -> torch.Tensor:
    """target_nll's sum for `examples`, each run of examples with one prompt computing that prompt
    once (nn.shared_prefix: the same loss and gradient up to float rounding, the prompt's tokens
    once, not per target)."""
    total = torch.zeros((), dtype=torch.float32, device=model.device)
    start = 0
    while start < len(examples):
        prompt = examples[start].input_ids[:examples[start].num_prompt_tokens]
        end = start + 1
        while end < len(
            examples) and examples[end].input_ids[:examples[end].num_prompt_tokens] == prompt:
            end += 1
        logp, mask = shared_prefix_logprobs(model, prompt, [e.input_ids[e.num_prompt_tokens:]
                                                            for e in examples[start:end]],
                                            chunk_tokens=chunk_tokens)
        total, start = total - (logp * mask).sum(), end
    return total


@torch.no_grad()
def evaluate_loss(model: Transformer, examples: list[Example], pad_id: int,
                  micro_batch_size: int = 1,
                  bf16: bool = False, chunk_tokens: int = 1024) -> float:
    """Mean target-token NLL over `examples` (the same L as training, without gradients)."""
    total, count = _nll_sums(model, examples, pad_id, micro_batch_size, bf16, chunk_tokens)
    return total / max(1, count)


@torch.no_grad()
def _nll_sums(model: Transformer, examples: list[Example], pad_id: int, micro_batch_size: int,
              bf16: bool,
              chunk_tokens: int) -> tuple[float, int]:
    """(Σ target-token NLL, number of target tokens) over `examples`."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(examples), micro_batch_size):
        input_ids, loss_mask = collate(examples[start:start + micro_batch_size], pad_id, device)
        with _autocast(device, bf16):
            nll, n = target_nll(model, input_ids, loss_mask, chunk_tokens)
        total, count = total + float(nll), count + n
    model.train(was_training)
    return total, count


def _validation_loss(model: Transformer, examples: list[Example], pad_id: int,
                     cfg: SFTConfig) -> float:
    """evaluate_loss over every rank's share of `examples` (torchrun), the sums added up."""
    share = distributed.share(examples)[0]
    total, count = distributed.sum_over_ranks(*_nll_sums(model, share, pad_id, cfg.micro_batch_size,
                                                         cfg.bf16,
                                                          cfg.chunk_tokens))
    return total / max(1, count)


def make_optimizer(model: Transformer, cfg: SFTConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                             betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)


# SFTConfig fields that say how fast or how often, not what is learned: --resume may change them
RUN_SETTINGS = ("max_steps", "eval_every", "save_every", "log_every", "keep_checkpoints",
                "micro_batch_size",
                "gradient_checkpointing", "chunk_tokens")


def _resume(model: Transformer, optimizer, out_dir: Path, resume, cfg: SFTConfig, fingerprint: str,
            total_steps: int, log: Callable[[str], None]) -> int:
    """Load the weights, optimizer and RNG states of the checkpoint to resume (see train_sft);
    returns its step (0 when starting afresh). A run folder that holds checkpoints is never started
    over silently, nor is one without a checkpoint resumed as a fresh run. resume=True takes the
    newest checkpoint that loads: one that is damaged (a part missing or unreadable) is reported and
    the one before it tried, as a kill or a full disk can leave the newest broken while an earlier
    one is whole."""
    if not resume:
        if latest_checkpoint(out_dir) is not None:
            raise ValueError(f"{out_dir} holds checkpoints of an earlier run: resume it or choose "
                             "another output folder")
        return 0
    candidates = resume_candidates(out_dir, resume)
    problems = []
    for i, ckpt in enumerate(candidates):
        if not has_lora(model) and (ckpt / ADAPTER_DIR).is_dir():
            raise ValueError(f"{ckpt} was written with LoRA adapters: resume with the same "
                             f"--lora-* flags as the run that wrote it")
        try:
            state = _load_checkpoint(model, optimizer, ckpt)
            break
        except (FileNotFoundError, ValueError) as e:
            problems.append(f"{ckpt}: {e}" if str(ckpt) not in str(e) else str(e))
            if i + 1 < len(candidates):
                log(f"resume: warning: {problems[-1]}; falling back to the earlier "
                    f"{candidates[i + 1]}")
    else:
        raise ValueError(f"--resume: no checkpoint can be loaded: {'; '.join(problems)}")
    # the resume policy of minskill/runs.py: what shapes the result must be the saved run's
    if state.get("data_fingerprint") != fingerprint:
        raise ValueError(f"--resume: the training data differ from those {ckpt} was trained on, so "
                         "it would not continue the same run (give the same record files, or start "
                         "a new --out)")
    changed = sorted(f"{k} {v!r} -> {asdict(cfg).get(k)!r}"
                     for k, v in state.get("config", {}).items()
                     if k not in RUN_SETTINGS
                     and asdict(cfg).get(k) != (tuple(v) if isinstance(v, list) else v))
    if changed:
        raise ValueError("--resume: these settings differ from the checkpoint's run, so it would "
                         f"not continue the same run: {', '.join(changed)}")
    set_rng_state(state["rng"])
    log(f"resume: continuing from {ckpt} at step {state['step']}/{total_steps}")
    return state["step"]


def resume_candidates(out_dir: str | os.PathLike, resume: bool | str | os.PathLike) -> list[Path]:
    """The checkpoints a resume may load, in the order tried: resume=True, out_dir's (newest first);
    a path, that one. ValueError when out_dir holds none: there is nothing to resume (a script
    checks this before it loads a model or writes a file)."""
    if resume is not True:
        return [Path(resume)]
    candidates = checkpoints(out_dir)
    if not candidates:
        raise ValueError(f"--resume: nothing to resume in {out_dir} (no checkpoint-STEP folder); "
                         f"run without --resume to start a run")
    return candidates


def _load_checkpoint(model: Transformer, optimizer, ckpt: Path) -> dict:
    """Load `ckpt`'s weights and optimizer state into model and optimizer; returns its trainer state
    (RNG states not yet restored). A part missing or damaged is a FileNotFoundError / ValueError
    naming its file."""
    state = load_trainer_state(ckpt, restore_rng=False, required=("step", "optimizer", "rng"))
    if has_lora(model):   # the base is the one the run started from; only the adapter trained
        adapter = ckpt / ADAPTER_DIR
        if not adapter.is_dir():
            raise FileNotFoundError(f"{adapter} is missing (the checkpoint is damaged, or its run "
                                    "trained without LoRA: resume with the same --lora-* flags as "
                                    "the run that wrote it)")
        load_peft_adapter(model, adapter)
    else:
        saved = load_pretrained(ckpt, device=next(model.parameters()).device)
        model.load_state_dict(saved.state_dict())
        del saved
    optimizer.load_state_dict(state["optimizer"])
    return state


def _optimizer_step(model: Transformer, optimizer, batch: list[Example], pad_id: int, device,
                    cfg: SFTConfig,
                    lr: float) -> tuple[float, float]:
    """One optimizer step on one effective batch at learning rate lr: (mean target-token NLL, grad
    norm)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    n_targets = sum(e.num_target_tokens for e in batch)   # the whole batch's, also when it is
                                                          # shared by ranks
    nll_sum = _forward_backward(model, distributed.share(batch)[0], pad_id, device, cfg, n_targets)
    distributed.all_reduce_grads(model)   # torchrun: the sum over the ranks' shares, so every rank
                                          # steps alike
    nll_sum = distributed.sum_over_ranks(nll_sum)
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0
                                                     else float("inf")))
    optimizer.step()
    return nll_sum / max(1, n_targets), grad_norm


def train_sft(model: Transformer, tokenizer: Tokenizer, train_examples: list[Example],
              out_dir: str | os.PathLike, cfg: SFTConfig, val_examples: list[Example] = (),
              resume: bool | str | os.PathLike = False, log: Callable[[str], None] = print,
              title: str = "SFT") -> dict:
    """Train `model` in place on tokenised examples; returns a summary (title: the loss curve's).

    Writes to out_dir: checkpoint-<step>/ (HF model + tokenizer + trainer_state.pt), final/ (HF
    model + tokenizer), metrics.jsonl and loss.svg. resume=True continues from the latest checkpoint
    in out_dir (a path: from that checkpoint); the result equals an uninterrupted run with the same
    data and config."""
    if not train_examples:
        raise ValueError("no training examples (all records were malformed or too long?)")
    out_dir, main = Path(out_dir), distributed.is_main()   # torchrun: rank 0 alone writes out_dir
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
              else tokenizer.eos_token_id)
    model.gradient_checkpointing = cfg.gradient_checkpointing
    optimizer = make_optimizer(model, cfg)
    steps_per_epoch = math.ceil(len(train_examples) / cfg.batch_size)
    total_steps = max(1, math.ceil(steps_per_epoch * cfg.epochs))
    stop_step = total_steps if cfg.max_steps is None else min(total_steps, cfg.max_steps)
    fingerprint = _fingerprint(train_examples)
    groups = prompt_groups(train_examples) if cfg.share_prompts else None   # kept together
    metrics_path = out_dir / "metrics.jsonl"
    step = _resume(model, optimizer, out_dir, resume, cfg, fingerprint, total_steps, log)
    if main:   # metric rows past the resumed step go (a killed run may have logged past them)
        write_jsonl_atomic(metrics_path, _read_metrics(metrics_path, step))
    log(_plan_line(model, cfg, len(train_examples), len(val_examples), total_steps,
                   steps_per_epoch, device))
    model.train()
    started, tokens_seen, steps_done = time.perf_counter(), 0, 0
    train_loss = val_loss = None
    with open_append(metrics_path) if main else open(os.devnull, "a") as metrics:   # (no link)
        while step < stop_step:
            epoch, index = divmod(step, steps_per_epoch)
            order = epoch_order(len(train_examples), cfg.seed, epoch, groups)
            batch = [train_examples[i]
                     for i in order[index * cfg.batch_size:(index + 1) * cfg.batch_size]]
            lr = cfg.lr * lr_factor(step, total_steps, cfg.warmup_ratio, cfg.min_lr_ratio)
            step_started = time.perf_counter()
            train_loss, grad_norm = _optimizer_step(model, optimizer, batch, pad_id, device, cfg,
                                                    lr)
            step, steps_done = step + 1, steps_done + 1
            tokens_seen += sum(len(e.input_ids) for e in batch)
            elapsed = time.perf_counter() - started
            row = {"step": step, "epoch": round(step / steps_per_epoch, 4), "loss": train_loss,
                   "lr": lr, "grad_norm": grad_norm,
                   "target_tokens": sum(e.num_target_tokens for e in batch),
                   "tokens_per_s": tokens_seen / elapsed}
            due = cfg.eval_every and step % cfg.eval_every == 0
            if val_examples and (due or step == stop_step):
                val_loss = _validation_loss(model, val_examples, pad_id, cfg)
                row["val_loss"] = val_loss
            # the step and its validation, for the report
            row["seconds"] = time.perf_counter() - step_started
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
            if step % cfg.log_every == 0 or step == stop_step or "val_loss" in row:
                eta = elapsed / steps_done * (stop_step - step)
                log(f"step {step}/{total_steps} | loss {train_loss:.4f}"
                    + (f" | val {row['val_loss']:.4f}" if "val_loss" in row else "")
                    + f" | lr {lr:.2e} | {row['tokens_per_s']:.0f} tok/s | ETA "
                    f"{_format_seconds(eta)}")
            if main and (step % cfg.save_every == 0 or step == stop_step):
                _save_step(model, tokenizer, optimizer, out_dir, cfg, step, total_steps,
                           fingerprint)
                # so an interrupted run has its curve too
                plot_metrics(metrics_path, out_dir / "loss.svg", title)
    finished = step >= total_steps
    if finished and main:
        save_checkpoint(out_dir / "final", model, tokenizer)
    more_steps = f" --max-steps N (N > {step}: --resume keeps the saved one)"
    log(f"sft: {'done' if finished else 'stopped'} at step {step}/{total_steps}; "
        f"{'model in ' + str(out_dir / 'final') if finished else 'resume with --resume'}"
        f"{more_steps if not finished and cfg.max_steps else ''}; "
        f"metrics {metrics_path}, loss curve {out_dir / 'loss.svg'}")
    return {"step": step, "total_steps": total_steps, "finished": finished,
            "train_loss": train_loss, "val_loss": val_loss, "out_dir": str(out_dir)}


def _plan_line(model, cfg: SFTConfig, n_train: int, n_val: int, total_steps: int,
               steps_per_epoch: int, device) -> str:
    """The line train_sft logs before its first step: the data, the model, the schedule."""
    n_params, n_trained = (sum(p.numel() for p in ps)
                           for ps in (model.parameters(), trainable_parameters(model)))
    trained = f"LoRA: {n_trained / 1e6:.2f}M trained" if has_lora(model) else "all trained"
    return (f"sft: {n_train} train / {n_val} validation examples, {n_params / 1e6:.1f}M params "
            f"({trained}), {total_steps} steps ({steps_per_epoch}/epoch x {cfg.epochs:g} epochs), "
            f"batch {cfg.batch_size} = {cfg.micro_batch_size} x "
            f"{cfg.batch_size // cfg.micro_batch_size} accumulation, lr {cfg.lr:g}, "
            f"{'bf16 autocast' if cfg.bf16 else 'float32'} on {device}"
            f"{', gradient checkpointing' if cfg.gradient_checkpointing else ''}")


def _save_step(model, tokenizer, optimizer, out_dir: Path, cfg: SFTConfig, step: int,
               total_steps: int, fingerprint: str) -> None:
    """OUT/checkpoint-STEP with the trainer state a --resume reads; older ones pruned."""
    state = {"step": step, "optimizer": optimizer.state_dict(), "config": asdict(cfg),
             "data_fingerprint": fingerprint,
             "schedule": {"total_steps": total_steps, "peak_lr": cfg.lr,
                          "warmup_ratio": cfg.warmup_ratio, "min_lr_ratio": cfg.min_lr_ratio}}
    save_checkpoint(out_dir / f"checkpoint-{step}", model, tokenizer, state)
    _prune_checkpoints(out_dir, cfg.keep_checkpoints)


# ----------------------------------------------------------------------------- benchmark hook

def sft_throughput(model: Transformer, input_ids: torch.Tensor, loss_mask: torch.Tensor
                   | None = None,
                   steps: int = 3, warmup_steps: int = 1, lr: float = 1e-5, bf16: bool = False,
                   gradient_checkpointing: bool = False, chunk_tokens: int = 1024) -> dict:
    """Run `warmup_steps` + `steps` full SFT optimizer steps (forward, backward, clip, AdamW) on one
    batch.

    loss_mask None = every token after the first is a target. Returns {"tokens_per_s" (all B·T
    tokens per second of the timed steps), "seconds_per_step", "tokens_per_step", "loss" (of the
    last step)}. The model is updated in place (pass a copy if it matters)."""
    if steps < 1:
        raise ValueError(f"sft_throughput: steps must be >= 1, got {steps}")
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    loss_mask = torch.ones_like(input_ids,
                                dtype=torch.bool) if loss_mask is None else loss_mask.to(device)
    model.gradient_checkpointing = gradient_checkpointing
    model.train()
    # with LoRA: the adapters only
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=lr)
    n_targets = max(1, int(loss_mask[:, 1:].sum()))
    loss = float("nan")
    for i in range(warmup_steps + steps):
        if i == warmup_steps:
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device, bf16):
            nll, _ = target_nll(model, input_ids, loss_mask, chunk_tokens)
        (nll / n_targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss = float(nll.detach()) / n_targets
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / max(1, steps)
    return {"tokens_per_s": input_ids.numel() / seconds, "seconds_per_step": seconds,
            "tokens_per_step": input_ids.numel(), "loss": loss}
