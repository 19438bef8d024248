"""int8 weight-only quantization of a frozen minskill Transformer (the task model, the teacher).

A frozen model needs no float weights. On a CPU, decoding one token streams every weight matrix
through memory once, and the matmul kernels read weights at about the same bytes per second
whatever their dtype, so bytes per weight decide the speed: int8 (1 byte) against bf16 (2) or
float32 (4).

Each linear layer y = x Wᵀ + b with W ∈ R^{out×in} is stored as int8 codes Q and one scale per
output channel (row) o:

    s_o  = ⌈max_i |W_oi| / 127⌉_bf16      (rounded UP to a bfloat16 number; s_o = 1 for a zero row)
    Q_oi = round(W_oi / s_o)  ∈ [−127, 127]
    y_o  = s_o · Σ_i x_i Q_oi + b_o       (= x (diag(s) Q)ᵀ + b)

The kernel keeps its scales in bfloat16, so s_o is made a bfloat16 number *before* Q is computed,
and rounded up so that |W_oi / s_o| ≤ 127 needs no clamp: the weights used are then exactly
s_o·Q_oi and the error of one weight is at most s_o / 2 (s_o ≤ (1 + 2⁻⁷)·max_i |W_oi| / 127). The
product runs in torch's own kernel `torch._weight_int8pack_mm(x, Q, s)` with bfloat16 activations
(its fast path; float32 activations take a slow one). On a device where that kernel is missing, the
layer keeps the same Q and s and computes x (diag(s) Q)ᵀ with the weights dequantized exactly in
float32 at each call (s_o·Q_oi has 8 + 7 significant bits: float32 holds it exactly, bfloat16 would
round it by up to 2⁻⁹ of |W|): the same weights, without the speed; the two paths' outputs differ
only by the rounding of their accumulations.

`quantize_int8(model)` converts every projection of every layer (q, k, v, o, gate, up, down) and the
output head, in place, and casts the rest (embeddings, norms) to bfloat16, so activations flow in
bfloat16 end to end. A tied head is quantized from the embedding matrix, which itself stays bfloat16
(a lookup table reads one row per token: it is not on the bandwidth path). Only inference: the codes
are buffers, not parameters, and a quantized model cannot be trained or saved back to HF layout.
Trained models (the editor, the rewriter) stay in float.

int4 (`quantize_int4`, `--quantize int4`) halves the bytes again. Each row is cut into groups of
G = 32 consecutive inputs, and each group g of row o has its own scale and offset (the layout of
the Q4_1 blocks of a GGUF file, which is what the offline default model ships: nn.weights):

    lo, hi = min_i W_oi, max_i W_oi  (i in g)
    s_og = ⌊(hi − lo) / 15⌉_bf16  (s_og = 1 for a constant group),   z_og = ⌊lo + 8·s_og⌉_bf16
    Q_oi = clamp(round((W_oi − z_og) / s_og) + 8, 0, 15)
    y_o  = Σ_g s_og · Σ_{i in g} x_i (Q_oi − 8)  +  Σ_g z_og · Σ_{i in g} x_i  + b_o

so the weights used are exactly (Q_oi − 8)·s_og + z_og, within about s_og / 2 of W_oi. The output
head stays int8, as GGUF's 4-bit files keep it 8-bit: its logits choose every token, and with 4-bit
head weights the offline model's greedy replies to the held-out qa tasks came out a third as long
(docs/benchmarks.md). The product
runs in `torch._weight_int4pack_mm_for_cpu` (codes packed two to a byte by
`torch._convert_weight_to_int4pack_for_cpu`); where it is missing the layer dequantizes exactly in
float32, as int8 does. Both kernels give a row the same bits whatever rows share the call (tested:
tests/test_quantize.py), which the server's batch-invariant engine relies on. On this project's
2-core CPU a decoding step's products take about half int8's time (docs/benchmarks.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZE_CHOICES = ("auto", "none", "int8", "int4")
INT4_GROUP = 32     # G: inputs per int4 group (one scale and one offset each)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q int8 (out, in), s (out,): float32 holding bfloat16 values) with W ≈ diag(s) Q, per the
    module docstring: |W − diag(s) Q| ≤ s / 2 elementwise."""
    w = weight.detach().float()
    exact = w.abs().amax(dim=1) / 127.0
    exact = torch.where(exact > 0, exact, torch.ones_like(exact))
    scales = exact.to(torch.bfloat16)
    # round up to the next bfloat16 where rounding went down (positive numbers: the next bit
    # pattern)
    up = (scales.view(torch.int16) + 1).view(torch.bfloat16)
    scales = torch.where(scales.float() < exact, up, scales).float()
    # (the clamp never acts)
    codes = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
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


class WeightOnlyLinear(nn.Module):
    """What the int8 and int4 layers share: y = x Wᵀ + b with W held as codes and bfloat16
    activations. A subclass gives `product` (its kernel on (M, in) rows) and `dequantized` (W in
    float32, for a device without the kernel: the same weights, without the speed)."""

    def __init__(self, linear: nn.Linear | None, weight: torch.Tensor, use_kernel: bool):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.use_kernel = use_kernel
        bias = None if linear is None or linear.bias is None else \
            linear.bias.detach().to(torch.bfloat16)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if not self.use_kernel:
            bias = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.dequantized(), bias).to(torch.bfloat16)
        y = self.rows(x.reshape(-1, self.in_features).contiguous())
        return y.view(*x.shape[:-1], self.out_features)

    def rows(self, flat: torch.Tensor) -> torch.Tensor:
        """x Wᵀ + b on (M, in) contiguous bfloat16 rows, with the kernel (what forward does once
        its input is in that shape; serve.lean_decode calls it directly)."""
        y = self.product(flat)
        return y if self.bias is None else y + self.bias

    def product(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantized(self) -> torch.Tensor:
        raise NotImplementedError


class Int8Linear(WeightOnlyLinear):
    """y = s ⊙ (x Qᵀ) + b, with Q int8 and s one scale per output channel (module docstring)."""
    ROW_AXES = {"codes": 0, "scales": 0}     # each buffer's axis of output rows (stacked)

    def __init__(self, linear: nn.Linear | None = None, weight: torch.Tensor | None = None,
                 use_kernel: bool | None = None):
        weight = linear.weight if weight is None else weight
        super().__init__(linear, weight,
                         has_int8_kernel(weight.device) if use_kernel is None else use_kernel)
        codes, scales = quantize_rows(weight)
        self.register_buffer("codes", codes)
        # the kernel keeps its scales in bfloat16; without it they are dequantized exactly (float32)
        self.register_buffer("scales", scales.to(torch.bfloat16) if self.use_kernel else scales)

    def product(self, flat: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(flat, self.codes, self.scales)

    def dequantized(self) -> torch.Tensor:
        return self.codes.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, " \
               f"{'torch int8 kernel' if self.use_kernel else 'dequantized float32 per call'}"


def has_int4_kernel(device: torch.device | str) -> bool:
    """Whether torch's int4-weight matmul for the CPU runs on `device` (tried once)."""
    try:
        packed = torch._convert_weight_to_int4pack_for_cpu(
            torch.zeros(16, INT4_GROUP, dtype=torch.int32, device=device), 1)
        scales_zeros = torch.zeros(1, 16, 2, dtype=torch.bfloat16, device=device)
        x = torch.zeros(1, INT4_GROUP, dtype=torch.bfloat16, device=device)
        torch._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scales_zeros)
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def quantize_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Q int32 (out, in) in 0..15, s, z (out, in / G): float32 holding bfloat16 values) with
    W ≈ (Q − 8)·s + z per group of G inputs, per the module docstring."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // INT4_GROUP, INT4_GROUP)
    lo, hi = groups.amin(-1), groups.amax(-1)
    steps = ((hi - lo) / 15).to(torch.bfloat16).float()
    zeros = (lo + 8 * steps).to(torch.bfloat16).float()          # a constant group: z = lo, Q = 8
    scales = torch.where(steps > 0, steps, torch.ones_like(steps))
    codes = torch.round((groups - zeros[..., None]) / scales[..., None]) + 8
    return codes.clamp_(0, 15).to(torch.int32).reshape(out_features, in_features), scales, zeros


class Int4Linear(WeightOnlyLinear):
    """y = x ((Q − 8)·s + z)ᵀ + b, Q in 0..15, one s and z per group of G inputs of a row
    (module docstring)."""
    ROW_AXES = {"codes": 0, "scales_zeros": 1}     # each buffer's axis of output rows (stacked)

    def __init__(self, linear: nn.Linear | None = None, weight: torch.Tensor | None = None,
                 use_kernel: bool | None = None):
        weight = linear.weight if weight is None else weight
        super().__init__(linear, weight,
                         has_int4_kernel(weight.device) if use_kernel is None else use_kernel)
        if self.in_features % INT4_GROUP:
            raise ValueError(f"int4 weights need in_features a multiple of {INT4_GROUP}, got a "
                             f"{self.out_features}x{self.in_features} layer: use --quantize int8")
        codes, scales, zeros = quantize_groups(weight)
        # the kernel packs rows 16 at a time: zero rows (weights 0: s = 1, z = 0, Q = 8) pad the
        # output, cut off after the product
        extra = -self.out_features % 16
        codes = F.pad(codes, (0, 0, 0, extra), value=8)
        scales, zeros = F.pad(scales, (0, 0, 0, extra), value=1), F.pad(zeros, (0, 0, 0, extra))
        if self.use_kernel:   # the kernel's layout: codes two to a byte, (groups, out, 2) bf16
            self.register_buffer("codes", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
            self.register_buffer("scales_zeros", torch.stack([scales.t(), zeros.t()], dim=-1)
                                 .to(torch.bfloat16).contiguous())
        else:   # no kernel here: one scale and offset per input, dequantized at each call
            per_input = (scales.repeat_interleave(INT4_GROUP, 1),
                         zeros.repeat_interleave(INT4_GROUP, 1))
            self.register_buffer("codes", codes.to(torch.int8))
            self.register_buffer("scales_zeros", torch.stack(per_input, dim=-1))

    def product(self, flat: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int4pack_mm_for_cpu(flat, self.codes, INT4_GROUP, self.scales_zeros)
        return y if y.shape[-1] == self.out_features else y[:, :self.out_features]

    def dequantized(self) -> torch.Tensor:
        scales, zeros = self.scales_zeros.unbind(-1)
        return ((self.codes.float() - 8) * scales + zeros)[:self.out_features]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 " \
               f"(groups of {INT4_GROUP}), " \
               f"{'torch int4 kernel' if self.use_kernel else 'dequantized float32 per call'}"


@torch.no_grad()
def quantize_int8(model, use_kernel: bool | None = None):
    """Quantize `model` (a minskill Transformer) to int8 in place for inference; returns it (module
    docstring)."""
    if use_kernel is None:   # asked once for the model, not once per layer
        use_kernel = has_int8_kernel(model.lm_head.weight.device)
    return _quantized(model, lambda **kw: Int8Linear(**kw, use_kernel=use_kernel))


@torch.no_grad()
def quantize_int4(model, use_kernel: bool | None = None):
    """Quantize `model`'s layers to int4 (groups of INT4_GROUP inputs) and its output head to int8,
    in place; returns it (module docstring)."""
    device = model.lm_head.weight.device
    if use_kernel is None:
        use_kernel = has_int4_kernel(device)
    head_kernel = has_int8_kernel(device)
    return _quantized(model, lambda **kw: Int4Linear(**kw, use_kernel=use_kernel),
                      head=lambda **kw: Int8Linear(**kw, use_kernel=head_kernel))


def stacked(layers: list) -> WeightOnlyLinear | None:
    """One layer computing the outputs of `layers` (same inputs) side by side: their rows of codes
    stacked, so one kernel call replaces several. Each kernel computes an output from its own row
    of codes, so the outputs keep the bits they had apart; the int4 kernel, though, packs rows in
    blocks (of 64 on this project's CPU), and rows stacked across a block's edge are read wrong. So
    the stacked layer is tried once on a probe, and None is returned where its outputs differ from
    the layers' (as for other layer types, formats, input widths, or no kernel). On success the
    layers read views of the stacked codes: no weight is held twice (tests/test_lean_decode.py)."""
    first = layers[0]
    if type(first) not in (Int8Linear, Int4Linear) or any(
            type(layer) is not type(first) or layer.in_features != first.in_features
            or not layer.use_kernel for layer in layers):
        return None
    new = type(first).__new__(type(first))
    nn.Module.__init__(new)
    new.in_features, new.use_kernel = first.in_features, True
    new.out_features = sum(layer.out_features for layer in layers)
    biases = [layer.bias if layer.bias is not None else
              torch.zeros(layer.out_features, dtype=torch.bfloat16) for layer in layers]
    new.register_buffer("bias", None if all(layer.bias is None for layer in layers)
                        else torch.cat(biases))
    for name, axis in type(first).ROW_AXES.items():
        new.register_buffer(name, torch.cat([getattr(layer, name) for layer in layers], dim=axis))
    probe = torch.randn(3, first.in_features, generator=torch.Generator().manual_seed(0)).to(
        device=first.codes.device, dtype=torch.bfloat16)
    if not torch.equal(new(probe), torch.cat([layer(probe) for layer in layers], dim=-1)):
        return None
    start = 0
    for layer in layers:   # rows along axis 0 are contiguous views: the layers share them
        rows = slice(start, start + layer.out_features)
        for name, axis in type(first).ROW_AXES.items():
            if axis == 0 and getattr(layer, name).shape[0] == layer.out_features:
                setattr(layer, name, getattr(new, name)[rows])
        start += layer.out_features
    return new


def _quantized(model, layer, head=None):
    """Every projection of every layer made `layer(linear=...)`, the output head `head(weight=...)`
    (default: `layer`); the rest (embeddings, norms) cast to bfloat16, where activations stay
    between the products."""
    head = head or layer
    head_weight = model.lm_head.weight
    model.requires_grad_(False).eval()
    for decoder_layer in model.model.layers:
        for block in (decoder_layer.self_attn, decoder_layer.mlp):
            for name in PROJECTIONS:
                if isinstance(getattr(block, name, None), nn.Linear):
                    setattr(block, name, layer(linear=getattr(block, name)))
    model.lm_head = head(weight=head_weight)
    model.to(torch.bfloat16)
    return model


def apply_quantization(model, quantize: str | None):
    """The `--quantize` option of the frozen-model entry points: "none" (or None) leaves `model` as
    it is, "int8" / "int4" quantize it, "auto" makes it int8 on a CPU with the int8 kernel. Returns
    `model`.
    Not the default for a script's own models (a frozen model served by minskill.serve is where it
    pays). Both kernels give a row the same bits whatever rows share the call; the server's
    batch-invariant engine (serve.aligned) keeps the rest of a row's arithmetic independent of its
    batch too."""
    if quantize == "auto":
        quantize = "int8" if model.device.type == "cpu" and has_int8_kernel("cpu") else "none"
    if quantize in (None, "none"):
        return model
    if quantize == "int8":
        return quantize_int8(model)
    if quantize == "int4":
        return quantize_int4(model)
    raise ValueError(f"--quantize {quantize!r}: choose one of {', '.join(QUANTIZE_CHOICES)}")


def serving_default(device: torch.device | str) -> str:
    """`python -m minskill.serve`'s --quantize when none is given: "int4" on a CPU where torch's
    int4 kernel runs (the fewest bytes a decoded token reads: docs/benchmarks.md), else "none" (the
    --dtype weights). The scripts' --task-quantize keeps "none": their recorded numbers stay
    those of their commands."""
    return "int4" if torch.device(device).type == "cpu" and has_int4_kernel("cpu") else "none"


def weight_format(model) -> str | None:
    """"int8" or "int4" when `model` runs quantized weights (its layers' format), else None."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    projection = layers[0].mlp.down_proj if layers else None
    return {Int8Linear: "int8", Int4Linear: "int4"}.get(type(projection))
