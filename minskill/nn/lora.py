"""LoRA: low-rank adapters on the linear projections of a minskill Transformer (Hu et al., 2021).

A frozen projection W (out × in, bias b) gets a trainable update of rank r:

    y = W x + b + (α / r) · B A dropout(x)          A: r × in,   B: out × r

A is drawn like nn.Linear's own weights (kaiming-uniform with a = √5, PEFT's default) and B = 0, so
at initialisation B A = 0 and the adapted model computes exactly what the base computes. Only A and
B train:
the base weights are frozen (in bfloat16 on CUDA by default: `default_base_dtype`), while A, B,
their gradients and their AdamW moments are float32, so the update is not rounded to bf16's 8 bits
of mantissa. The adapter's input is cast to float32 and its output back to the base's dtype.

    trainable parameters per adapted projection = r · (in + out)
    training memory before activations ≈ (2 or 4) · P_base + 16 · P_adapters bytes
                                         (bf16 or float32 base; adapter weight, gradient, two AdamW
                                         moments)

Targets are the projections by their HF names: q_proj, k_proj, v_proj, o_proj (attention),
gate_proj, up_proj, down_proj (MLP): all seven by default. lm_head and the embeddings stay frozen
and unadapted (the log-prob code reads lm_head.weight directly).

Three more things the trainers need:

* `adapters_disabled(model)`: inside it the adapters are skipped, so the model is its base again.
  With a KL penalty (β > 0) the reference policy is the base; `AdaptersOff(model)` is that view for
  code that takes a model, so no second copy of the weights exists.
* Merging: W' = W + (α / r) · B A (computed in float32). `merged_model(model)` is a plain
  Transformer with those weights, written in HF layout by `save_pretrained`, so every HF tool loads
  it unchanged. It is kept in float32 even for a bf16 base: rounding W' to bf16 would lose most of
  a small trained update.
* PEFT's adapter layout (what `peft.PeftModel.from_pretrained(base, folder)` reads):
  `adapter_config.json` (peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
  base_model_name_or_path, ...) and `adapter_model.safetensors` holding, for each adapted module
  NAME, `base_model.model.NAME.lora_A.weight` (r × in) and `base_model.model.NAME.lora_B.weight`
  (out × r). In this module the same tensors are the parameters NAME.lora_A.weight and
  NAME.lora_B.weight, and the frozen base weight keeps its HF name NAME.weight.

This module imports minskill.nn.model (for the merged Transformer) and minskill.nn.weights (to save
it) only. """
from __future__ import annotations

import argparse
import json
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from minskill.files import read_json_object
from minskill.nn.model import Transformer
from minskill.nn.weights import save_pretrained

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_DIR = "adapter"                        # the PEFT folder inside a checkpoint
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."              # PEFT's prefix: PeftModel -> LoraModel -> the HF
                                               # model
BASE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class LoraConfig:
    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    base_model_name_or_path: str | None = None    # written into adapter_config.json

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def check_lora_config(cfg: LoraConfig) -> None:
    """ValueError naming the bad setting."""
    if not isinstance(cfg.rank, int) or cfg.rank < 1:
        raise ValueError(f"LoRA rank must be a positive integer, got {cfg.rank!r}")
    if not cfg.alpha > 0:
        raise ValueError(f"LoRA alpha must be > 0, got {cfg.alpha!r}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"LoRA dropout must be in [0, 1), got {cfg.dropout!r}")
    unknown = [t for t in cfg.targets if t not in DEFAULT_TARGETS]
    if unknown or not cfg.targets:
        raise ValueError(f"unknown LoRA target module "
                         f"{', '.join(map(repr, unknown)) or '(none given)'}: choose among "
                         f"{', '.join(DEFAULT_TARGETS)}")


def _float32_linear(in_features: int, out_features: int) -> nn.Linear:
    """An uninitialised bias-free float32 nn.Linear on the CPU (nn.Linear's own init would draw
    from the global RNG, which a resumed run restores and must find untouched)."""
    with torch.device("meta"):
        layer = nn.Linear(in_features, out_features, bias=False, dtype=torch.float32)
    return layer.to_empty(device="cpu")


class LoRALinear(nn.Module):
    """A frozen nn.Linear (its `weight` and `bias` keep their names) plus the float32 adapter
    (lora_A, lora_B)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.lora_A, self.lora_B = _float32_linear(self.in_features, rank), _float32_linear(rank,
                self.out_features)
        # drawn on the CPU from `generator`, so the init depends on neither the device nor the
        # global RNG
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), generator=generator)
        nn.init.zeros_(self.lora_B.weight)
        self.lora_A.to(base.weight.device)
        self.lora_B.to(base.weight.device)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / rank
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if not self.enabled:
            return y
        delta = self.lora_B(self.lora_A(self.lora_dropout(x.to(self.lora_A.weight.dtype))))
        return y + (delta * self.scaling).to(y.dtype)

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """W + (α/r) B A in float32."""
        return self.weight.float() + self.scaling * (self.lora_B.weight @ self.lora_A.weight)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, r={self.lora_A.out_features}, "
                f"scaling={self.scaling:g}")


def lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    """(HF module name, layer) of every adapted projection, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


def has_lora(model) -> bool:
    """Whether `model` holds adapters (anything that is not an nn.Module holds none)."""
    return isinstance(model, nn.Module) and any(isinstance(m, LoRALinear) for m in model.modules())


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """What the optimizer gets: with LoRA the adapters only; without, every parameter (in
    parameters() order)."""
    return [p for p in model.parameters() if p.requires_grad]


def apply_lora(model: Transformer, rank: int, alpha: float | None = None, dropout: float = 0.0,
               target_modules=DEFAULT_TARGETS, base_dtype: torch.dtype | None = None, seed: int = 0,
               base_model_name_or_path: str | None = None) -> Transformer:
    """Freeze `model` (cast to base_dtype if given) and wrap each target projection in a
    LoRALinear, in place. alpha None = 2·rank. A of successive layers is drawn from one generator
    seeded with `seed`."""
    cfg = LoraConfig(rank, float(2 * rank if alpha is None else alpha), float(dropout),
                     tuple(target_modules), base_model_name_or_path)
    check_lora_config(cfg)
    if has_lora(model):
        raise ValueError("the model already has LoRA adapters")
    model.requires_grad_(False)
    if base_dtype is not None:
        model.to(base_dtype)
    generator = torch.Generator().manual_seed(seed)
    found = set()
    for name, module in list(model.named_modules()):
        leaf = name.rpartition(".")[2]
        if leaf in cfg.targets and isinstance(module, nn.Linear):
            parent = model.get_submodule(name.rpartition(".")[0])
            setattr(parent, leaf, LoRALinear(module, cfg.rank, cfg.alpha, cfg.dropout, generator))
            found.add(leaf)
    missing = [t for t in cfg.targets if t not in found]
    if missing:
        raise ValueError(f"LoRA target module {', '.join(missing)} not found in the model")
    model.lora_config = cfg
    return model


@contextmanager
def adapters_disabled(model: nn.Module):
    """Inside: every adapter is skipped, so `model` computes its base model (the KL reference)."""
    layers = [m for _, m in lora_layers(model)]
    before = [m.enabled for m in layers]
    for m in layers:
        m.enabled = False
    try:
        yield model
    finally:
        for m, was in zip(layers, before):
            m.enabled = was


class AdaptersOff:
    """The base model inside an adapted one, for code that takes a model (e.g. the reference of a KL
    penalty): its forward and hidden_states run with the adapters off; everything else is the
    model's."""

    def __init__(self, model: Transformer):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def hidden_states(self, *args, **kwargs):
        with adapters_disabled(self.model):
            return self.model.hidden_states(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        with adapters_disabled(self.model):
            return self.model(*args, **kwargs)


# ------------------------------------------------------------------------------------------ merging

@torch.no_grad()
def merged_state_dict(model: Transformer, dtype: torch.dtype = torch.float32, device="cpu") -> dict:
    """The HF state dict of the merged model (W' = W + (α/r) B A for adapted projections), on
    `device`."""
    state = {k: v.detach().to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
             for k, v in model.state_dict().items() if ".lora_" not in k}
    for name, layer in lora_layers(model):
        state[f"{name}.weight"] = layer.merged_weight().to(device=device, dtype=dtype)
    if model.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def merged_model(model: Transformer, dtype: torch.dtype = torch.float32,
                 device="cpu") -> Transformer:
    """A plain Transformer (no adapters) with the merged weights; the adapted model is left as it
    is."""
    state = merged_state_dict(model, dtype, device)
    with torch.device("meta"):
        merged = Transformer(model.config)
    merged.load_state_dict(state, strict=True, assign=True)
    if model.config.tie_word_embeddings:
        merged.lm_head.weight = merged.model.embed_tokens.weight
    return merged


# -------------------------------------------------------------------------------------- PEFT layout

def peft_config(cfg: LoraConfig) -> dict:
    """adapter_config.json: the LoraConfig fields PEFT reads, for what this module implements."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM",
            "base_model_name_or_path": cfg.base_model_name_or_path, "revision": None,
            "inference_mode": True, "r": cfg.rank,
            "lora_alpha": int(cfg.alpha) if float(cfg.alpha).is_integer() else cfg.alpha,
            "lora_dropout": cfg.dropout, "target_modules": sorted(cfg.targets), "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "modules_to_save": None, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters under PEFT's tensor names, float32 on the CPU."""
    state = {}
    for name, layer in lora_layers(model):
        state[f"{PEFT_PREFIX}{name}.lora_A.weight"] = layer.lora_A.weight.detach().float().cpu(
                ).contiguous()
        state[f"{PEFT_PREFIX}{name}.lora_B.weight"] = layer.lora_B.weight.detach().float().cpu(
                ).contiguous()
    return state


def save_peft_adapter(model: Transformer, folder,
                      base_model_name_or_path: str | None = None) -> Path:
    """Write adapter_config.json and adapter_model.safetensors (PEFT's layout) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = model.lora_config
    if base_model_name_or_path is not None:
        cfg = LoraConfig(**{**asdict(cfg), "base_model_name_or_path": base_model_name_or_path})
    save_file(adapter_state_dict(model), str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (folder / ADAPTER_CONFIG).write_text(json.dumps(peft_config(cfg), indent=2) + "\n",
                                         encoding="utf-8")
    return folder


@torch.no_grad()
def load_peft_adapter(model: Transformer, folder) -> Transformer:
    """Copy the adapter of a PEFT folder into a model that apply_lora adapted with the same
    settings (its rank, alpha and targets are checked against adapter_config.json); every tensor
    must be present. A missing, unreadable or mismatched file is an error naming it
    (FileNotFoundError, ValueError); the model is changed only once everything has been checked."""
    folder = Path(folder)
    config_file, weights_file = folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS
    absent = [path.name for path in (config_file, weights_file) if not path.is_file()]
    if absent:
        raise FileNotFoundError(f"{folder}: no LoRA adapter (missing {' and '.join(absent)})")
    if not has_lora(model):
        raise ValueError(f"{folder} holds a LoRA adapter but the model has none: adapt it first "
                         f"(--lora-rank)")
    saved = read_json_object(config_file, "a PEFT adapter config")
    cfg, alpha, targets = model.lora_config, saved.get("lora_alpha"), saved.get("target_modules")
    ours = {"r": cfg.rank, "lora_alpha": cfg.alpha, "target_modules": sorted(cfg.targets)}
    theirs = {"r": saved.get("r"),
              "lora_alpha": float(alpha) if type(alpha) in (int, float) else alpha,
              "target_modules": sorted(targets) if isinstance(targets, list) and all(
                  isinstance(t, str) for t in targets) else targets}
    if ours != theirs:
        raise ValueError(f"{config_file}: the adapter was saved with {theirs}, this model is "
                         f"adapted with {ours}")
    try:
        tensors = load_file(str(weights_file))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{weights_file}: damaged, not a readable safetensors file "
                         f"({e})") from None
    pairs = []
    for name, layer in lora_layers(model):
        for part in ("lora_A", "lora_B"):
            key, param = f"{PEFT_PREFIX}{name}.{part}.weight", getattr(layer, part).weight
            if key not in tensors or tensors[key].shape != param.shape:
                raise ValueError(f"{weights_file}: tensor {key} is " + (
                    "missing" if key not in tensors else f"of shape {tuple(tensors[key].shape)}, "
                                                         f"not {tuple(param.shape)}"))
            pairs.append((param, tensors[key]))
    for param, tensor in pairs:
        param.copy_(tensor)
    return model


def save_lora_model(model: Transformer, folder) -> Path:
    """What a checkpoint of an adapted model holds: the merged model in HF layout (config.json,
    model.safetensors, float32) in `folder`, and the adapter alone in PEFT's layout in
    folder/adapter."""
    save_pretrained(merged_model(model), folder)
    save_peft_adapter(model, Path(folder) / ADAPTER_DIR)
    return Path(folder)


# ------------------------------------------------------------------------------------------- flags

def add_lora_arguments(group) -> None:
    """--lora-rank, --lora-alpha, --lora-dropout, --lora-targets, --lora-base-dtype (one definition
    for both trainers); `lora_settings` checks and completes them."""
    group.add_argument("--lora-rank", type=int, default=0,
                       help="train LoRA adapters of rank R on a frozen base "
                       "instead of every weight (default 0 = full fine-tune)")
    group.add_argument("--lora-alpha", type=float, default=None,
                       help="LoRA α: the update is scaled by α/R "
                       "(default 2·R)")
    group.add_argument("--lora-dropout", type=float, default=0.0,
                       help="dropout on the adapters' input (default 0, "
                       "PEFT's default; in GRPO it would also make the ratio of two passes noisy)")
    group.add_argument("--lora-targets", default=",".join(DEFAULT_TARGETS), type=target_list,
                       help="comma-separated projections to "
                       f"adapt (default all attention and MLP projections: "
                       f"{','.join(DEFAULT_TARGETS)})")
    group.add_argument("--lora-base-dtype", choices=tuple(BASE_DTYPES), default=None,
                       help="storage of the "
                       "frozen base weights with LoRA: bfloat16 halves their memory, and bf16 "
                       "autocast then reads them as they are instead of casting the whole base "
                       "every forward; the adapters and their AdamW state stay float32 (default: "
                       "bfloat16 on CUDA, float32 on the CPU)")


def default_base_dtype(device) -> str:
    """--lora-base-dtype left unset: bfloat16 on CUDA (half the memory; under bf16 autocast a
    float32 base is cast anew at every forward, each decoded token included), float32 on the CPU
    (whose results stay as they were)."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def target_list(targets: str) -> list[str]:
    """--lora-targets "q_proj, v_proj" as the list every run saves (so a resumed run compares like
    with like)."""
    return [t.strip() for t in targets.split(",") if t.strip()]


def lora_settings(args: argparse.Namespace) -> LoraConfig | None:
    """The LoraConfig the flags ask for (None: --lora-rank 0), after normalising args in place
    (alpha filled in, targets as a list, the base dtype by the device); ValueError naming the flag
    for a bad value."""
    targets = target_list(args.lora_targets) if isinstance(args.lora_targets,
                                                           str) else list(args.lora_targets)
    args.lora_targets = targets
    if args.lora_rank < 0:
        raise ValueError(f"--lora-rank must be >= 0 (0: no LoRA), got {args.lora_rank}")
    if args.lora_rank == 0:
        if args.lora_alpha is not None or args.lora_dropout != 0 \
                or args.lora_base_dtype not in (None,
                                                "float32") or tuple(targets) != DEFAULT_TARGETS:
            raise ValueError("--lora-alpha, --lora-dropout, --lora-targets and --lora-base-dtype "
                             "need --lora-rank > 0")
        args.lora_base_dtype = "float32"   # a full fine-tune trains the base itself: float32
                                           # master weights
        return None
    if args.lora_base_dtype is None:
        args.lora_base_dtype = default_base_dtype(getattr(args, "device", "cpu"))
    args.lora_alpha = float(2 * args.lora_rank if args.lora_alpha is None else args.lora_alpha)
    cfg = LoraConfig(args.lora_rank, args.lora_alpha, args.lora_dropout, tuple(targets))
    try:
        check_lora_config(cfg)
    except ValueError as e:
        raise ValueError(f"--lora-*: {e}") from None
    return cfg
