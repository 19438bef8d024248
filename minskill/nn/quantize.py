"""int8 weight-only quantization of a frozen minskill Transformer (the task model, the teacher).

A frozen model needs no float weights. On a CPU, decoding one token streams every weight matrix through
memory once, and the matmul kernels read weights at about the same bytes per second whatever their
dtype, so bytes per weight decide the speed: int8 (1 byte) against bf16 (2) or float32 (4).

Each linear layer y = x Wᵀ + b with W ∈ R^{out×in} is stored as int8 codes Q and one scale per output
channel (row) o:

    s_o  = ⌈max_i |W_oi| / 127⌉_bf16                (rounded UP to a bfloat16 number; s_o = 1 for a zero row)
    Q_oi = round(W_oi / s_o)  ∈ [−127, 127]
    y_o  = s_o · Σ_i x_i Q_oi + b_o                 (= x (diag(s) Q)ᵀ + b)

The kernel keeps its scales in bfloat16, so s_o is made a bfloat16 number *before* Q is computed, and
rounded up so that |W_oi / s_o| ≤ 127 needs no clamp: the weights used are then exactly s_o·Q_oi and the
error of one weight is at most s_o / 2 (s_o ≤ (1 + 2⁻⁷)·max_i |W_oi| / 127). The product runs in torch's
own kernel `torch._weight_int8pack_mm(x, Q, s)` with bfloat16 activations (its fast path; float32
activations take a slow one). On a device where that kernel is missing, the layer keeps the same Q and s
and computes x (diag(s) Q)ᵀ with the weights dequantized exactly in float32 at each call (s_o·Q_oi has
8 + 7 significant bits: float32 holds it exactly, bfloat16 would round it by up to 2⁻⁹ of |W|): the same
weights, without the speed; the two paths' outputs differ only by the rounding of their accumulations.

`quantize_int8(model)` converts every projection of every layer (q, k, v, o, gate, up, down) and the
output head, in place, and casts the rest (embeddings, norms) to bfloat16, so activations flow in
bfloat16 end to end. A tied head is quantized from the embedding matrix, which itself stays bfloat16
(a lookup table reads one row per token: it is not on the bandwidth path). Only inference: the codes
are buffers, not parameters, and a quantized model cannot be trained or saved back to HF layout.
Trained models (the editor, the rewriter) stay in float.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZE_CHOICES = ("auto", "none", "int8")


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q int8 (out, in), s (out,): float32 holding bfloat16 values) with W ≈ diag(s) Q, per the module
    docstring: |W − diag(s) Q| ≤ s / 2 elementwise."""
    w = weight.detach().float()
    exact = w.abs().amax(dim=1) / 127.0
    exact = torch.where(exact > 0, exact, torch.ones_like(exact))
    scales = exact.to(torch.bfloat16)
    # round up to the next bfloat16 where rounding went down (positive numbers: the next bit pattern)
    up = (scales.view(torch.int16) + 1).view(torch.bfloat16)
    scales = torch.where(scales.float() < exact, up, scales).float()
    codes = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)   # (the clamp never acts)
    return codes, scales


def has_int8_kernel(device: torch.device | str) -> bool:
    """Whether torch's int8-weight matmul runs on `device` (tried once on a tiny product)."""
    try:
        x = torch.zeros(1, 32, dtype=torch.bfloat16, device=device)
        codes = torch.zeros(8, 32, dtype=torch.int8, device=device)
        torch._weight_int8pack_mm(x, codes, torch.ones(8, dtype=torch.bfloat16, device=device))
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


class Int8Linear(nn.Module):
    """y = s ⊙ (x Qᵀ) + b, with Q int8 and s one scale per output channel (module docstring)."""

    def __init__(self, linear: nn.Linear | None = None, weight: torch.Tensor | None = None,
                 use_kernel: bool | None = None):
        super().__init__()
        weight = linear.weight if weight is None else weight
        device = weight.device
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        codes, scales = quantize_rows(weight)
        self.use_kernel = has_int8_kernel(device) if use_kernel is None else use_kernel
        if self.use_kernel:
            self.register_buffer("codes", codes)
            self.register_buffer("scales", scales.to(torch.bfloat16))
        else:  # no kernel here: the same codes and scales, dequantized exactly (float32) at each call
            self.register_buffer("codes", codes)
            self.register_buffer("scales", scales)
        bias = None if linear is None or linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if not self.use_kernel:
            weight = self.codes.float() * self.scales.float()[:, None]
            bias = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), weight, bias).to(torch.bfloat16)
        flat = x.reshape(-1, self.in_features)
        y = torch._weight_int8pack_mm(flat.contiguous(), self.codes, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, " \
               f"{'torch int8 kernel' if self.use_kernel else 'dequantized float32 per call'}"


@torch.no_grad()
def quantize_int8(model, use_kernel: bool | None = None):
    """Quantize `model` (a minskill Transformer) in place for inference; returns it (module docstring)."""
    head_weight = model.lm_head.weight
    if use_kernel is None:   # asked once for the model, not once per layer
        use_kernel = has_int8_kernel(head_weight.device)
    model.requires_grad_(False).eval()
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTIONS:
                if isinstance(getattr(block, name, None), nn.Linear):
                    setattr(block, name, Int8Linear(getattr(block, name), use_kernel=use_kernel))
    model.lm_head = Int8Linear(weight=head_weight, use_kernel=use_kernel)
    model.to(torch.bfloat16)   # embeddings and norms: activations stay bf16 between the int8 products
    return model


def apply_quantization(model, quantize: str | None):
    """The `--quantize` option of the frozen-model entry points: "none" (or None) leaves `model` as it is,
    "int8" quantizes it, "auto" quantizes it on a CPU with the int8 kernel. Returns `model`.
    Not the default for a script's own models (a frozen model served by minskill.serve is where it
    pays). The int8 kernel gives a row the same bits whatever rows share the call; the server's
    batch-invariant engine (serve.aligned) keeps the rest of a row's arithmetic independent of its
    batch too."""
    if quantize == "auto":
        quantize = "int8" if model.device.type == "cpu" and has_int8_kernel("cpu") else "none"
    if quantize in (None, "none"):
        return model
    if quantize == "int8":
        return quantize_int8(model)
    raise ValueError(f"--quantize {quantize!r}: choose one of {', '.join(QUANTIZE_CHOICES)}")


def has_int8_layers(model) -> bool:
    """Whether `model` runs int8 weights (some layer is an Int8Linear)."""
    return any(isinstance(m, Int8Linear) for m in model.modules())
