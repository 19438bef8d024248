"""The memory of one Skill-R1 update, predicted from a model config, and measured on the CPU.

`python -m minskill.measure.bench memory --config qwen3-1.7b -K 8 --prompt-tokens 512
--skill-tokens 64` prints `predict_update_memory`: what train_grpo.policy_update holds at its peak,
in bytes, for the published Qwen3 configs (QWEN3_CONFIGS, from each model's config.json) or any
ModelConfig, in CUDA's attention layout (UpdateShape.device: "cpu" for the CPU's):

    weights     N · 4 (full fine-tune: float32 master weights) or N_base · (2 | 4) + N_lora · 4
                (LoRA)
    grads       N_train · 4                    (float32, like the weights they update)
    optimizer   N_train · 8                    (AdamW's two moments, float32)
    activations what one micro-batch of m candidates keeps for the backward (below), and the bf16
                copies bf16 autocast makes of the float32 layer matrices W (the matmuls keep them):
                2·W once (trained: autocast caches them), 2·2·W for a frozen LoRA base (each of
                the two passes casts again), none for a LoRA base under checkpointing
    transient   the largest short-lived tensors on top: a chunk of logits and its gradient (and
                lm_head's bf16 copy); one layer's recomputation and gradients under checkpointing
                (and its weights' bf16 copies); the rows pass's gradient of every trained tensor,
                which autograd holds until the prompt pass's backward adds its own
    update peak weights + grads + max(activations + transient, optimizer + AdamW temporaries)
    KV cache    sampling's cache before the update: K rows of P + S slots per layer
    sampling peak  weights + grads + optimizer (all alive between updates) + KV cache + a row of
                   logits per candidate
    peak        the larger of the two

Activations of the shared-prefix update (nn.shared_prefix: the prompt once, then m rows of S
completion tokens attending to its P keys), per layer, with H hidden, I intermediate, q = n_h·d,
kv = n_kv·d, r the LoRA rank, counted from the tensors model.py's operations save. In bytes: a of
a matmul's output (2 under autocast or over a bf16 base, else 4), b of a trained matmul's input
(2 under autocast, else 4), s of the residual stream (2 over a bf16 base, else 4); norms compute
in float32:

    per token   norms 2·(4H + 4) (+ 2·s·H when their weights train); trained matmuls' inputs
                b·(5H + q + I) when each projection casts its own copy (autocast, or float32
                adapters over a bf16 base), else b·(2H + q + I); LoRA's B inputs 7·b·r;
                q/k-norm 4·(q + kv + n_h + n_kv) (+ a·(q + kv) when trained); SwiGLU 3·a·I;
                fused attention 2·a·q + 4·n_h (q, output, log-sum-exp)
    prompt      + 2·a·kv per token (its keys/values, which the cache keeps); float32 GQA on CUDA
                runs the math kernel instead of a fused one: 3·a·q + 4·n_h·P (scaled q, k and v
                repeated to the query heads, probabilities)
    per row     a·2·kv·(P + S): its keys/values (the prompt's, expanded, and its own); 2·q for
                2·kv on CUDA, where model.attend repeats them to the query heads for a masked
                attention; a·S·(P + S): the additive mask
    final       (P + m·S)·(4H + 4) (+ s·H when trained): the last norm; m·S·s·H: the hidden
                states the logits are read from
    checkpointed per token s·H (each layer's input) and the prompt's keys/values only; one layer's
                activations come back for its backward (transient)

`largest_micro_batch` is the largest m whose peak fits a GPU of a given size. The figures count
tensor bytes, as torch.cuda.max_memory_allocated does (not the allocator's reserved segments: leave
~10% for them).

`LiveBytes` measures the same quantity on the CPU: a TorchDispatchMode that adds each new tensor
storage an operation returns and subtracts it when the storage is freed (a weak reference), so its
peak is what a device allocator would have had allocated at once (the CPU has no allocator
statistics to read). tests/test_memory.py checks the prediction against it within 20% on small
configs, in the CPU's layout and in CUDA's (k/v repeated, made to happen on the CPU). """
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minskill.nn.model import EXPAND_KV_FOR_MASK, ModelConfig
from minskill.nn.weights import config_from_hf

# The published config.json of Qwen/Qwen3-0.6B, -1.7B, -4B and -8B (head_dim 128, vocab 151936,
# rope_theta 1e6,
# q/k RMSNorm: model_type qwen3). "tiny" is the same architecture small enough for a CPU smoke test.
QWEN3_COMMON = dict(model_type="qwen3", vocab_size=151936, head_dim=128, rope_theta=1000000.0,
                    rms_norm_eps=1e-6, max_position_embeddings=40960, attention_bias=False,
                    hidden_act="silu")
QWEN3_CONFIGS = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=512, tie_word_embeddings=True),
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GIB = 2 ** 30


def published_config(name: str) -> ModelConfig:
    """The ModelConfig of a QWEN3_CONFIGS entry."""
    return config_from_hf({**QWEN3_COMMON, **QWEN3_CONFIGS[name]})


@dataclass(frozen=True)
class UpdateShape:
    """What one update computes: K candidates of S tokens after one P-token prompt, m per
    micro-batch."""
    candidates: int = 8
    prompt_tokens: int = 512
    skill_tokens: int = 64
    micro_batch: int = 4
    lora_rank: int = 0
    lora_base_bytes: int = 4          # 2: a bf16 base
    bf16: bool = False                # bf16 autocast over float32 weights
    grad_checkpointing: bool = False
    chunk_tokens: int = 2048          # sampling.token_logprobs' rows of logits at a time
    foreach: bool = True              # AdamW's multi-tensor path (the default on CUDA; CPU loops
                                      # per tensor)
    device: str = "cuda"              # whose attention layout: CUDA repeats k/v for masked SDPA


def _projections(c: ModelConfig) -> dict[str, tuple[int, int]]:
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    H, I = c.hidden_size, c.intermediate_size
    return {"q_proj": (H, q), "k_proj": (H, kv), "v_proj": (H, kv), "o_proj": (q, H),
            "gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}


def parameter_counts(c: ModelConfig, lora_rank: int = 0) -> tuple[int, int]:
    """(parameters of the model, of them trained): all of them, or the LoRA adapters on
    LORA_TARGETS."""
    proj = _projections(c)
    per_layer = sum(i * o for i, o in proj.values()) + 2 * c.hidden_size + (2 * c.head_dim
            if c.qk_norm else 0)
    embed = c.vocab_size * c.hidden_size
    n = c.num_hidden_layers * per_layer + embed * (1 if c.tie_word_embeddings
                                                   else 2) + c.hidden_size
    lora = c.num_hidden_layers * sum(lora_rank * (i + o) for i, o in proj.values())
    return (n + lora, lora) if lora_rank else (n, n)


def predict_update_memory(c: ModelConfig, s: UpdateShape) -> dict[str, int]:
    """The components of one update's peak in bytes (module docstring); "peak" is their
    combination."""
    n, n_train = parameter_counts(c, s.lora_rank)
    n_lora = n_train if s.lora_rank else 0
    weights = (n - n_lora) * (s.lora_base_bytes if s.lora_rank else 4) + 4 * n_lora
    m, P, S = min(s.micro_batch, s.candidates), s.prompt_tokens, s.skill_tokens
    L, H, V = c.num_hidden_layers, c.hidden_size, c.vocab_size
    a, _, stream = _activation_bytes(s)
    kv = c.num_key_value_heads * c.head_dim
    matmul_weights = L * sum(i * o for i, o in _projections(c).values())
    casts = _kept_casts(s, matmul_weights)
    prefix = _layer_bytes(c, s, P, 1, P, own_keys=True)
    rows = _layer_bytes(c, s, m * S, m, P + S, own_keys=False)
    grads, optimizer = 4 * n_train, 8 * n_train
    if s.grad_checkpointing:        # each layer's input, and the prompt's keys/values (the cache)
        activations = L * (stream * H * (P + m * S) + a * 2 * kv * P)
        # one layer recomputed, the gradients of its tensors, and its weights' bf16 copies
        layer_again = 3 * max(prefix, rows) // 2 + (
            2 * matmul_weights // L if s.bf16 and not _bf16_base(s) else 0)
        rows_freed = 0
    else:
        activations, layer_again = L * (prefix + rows), max(prefix, rows) // 2
        rows_freed = L * rows
    # every trained tensor serves both passes: autograd holds the rows pass's gradient of each
    # until the prompt pass's arrives, while the prompt pass's backward runs
    waiting = grads + layer_again - rows_freed
    # the final norm's float32 input and 1/rms (and its output when its weight trains), and the
    # hidden states the logits are read from
    activations += (P + m * S) * (4 * H + 4 + (0 if s.lora_rank else stream * H)) + \
        m * S * stream * H + casts
    # a chunk's logits, log-softmax and their gradient; under autocast lm_head's bf16 copy
    logits = 4 * 3 * min(s.chunk_tokens, m * S) * V + (
        2 * V * H if s.bf16 and not _bf16_base(s) else 0)
    # AdamW's step makes temporaries: of every trained tensor at once (foreach), or of one at a
    # time (a loop)
    proj = _projections(c).values()
    largest = max(s.lora_rank * max(i, o) for i, o in proj) if s.lora_rank else \
        max(V * H, *(i * o for i, o in proj))
    adam_temps = 4 * n_train if s.foreach else 8 * largest
    transient = max(logits, layer_again, waiting)
    # sampling the K candidates before the update: a KV cache of K rows of P + S slots in the
    # compute dtype
    kv_cache = L * 2 * kv * s.candidates * (P + S) * a
    update = weights + grads + max(activations + transient, optimizer + adam_temps)
    sampling = weights + grads + optimizer + kv_cache + 4 * 2 * s.candidates * V
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": activations,
            "transient": transient, "update peak": update, "sampling KV cache": kv_cache,
            "sampling peak": sampling, "peak": max(update, sampling)}


def _kept_casts(s: UpdateShape, matmul_weights: int) -> int:
    """Bytes of the bf16 copies autocast makes of float32 layer weights that outlive their matmul:
    a trained weight's copy is cached for the whole forward; a frozen (LoRA base) weight is cast
    again by every pass (the prompt's, the rows'), and each pass's backward keeps its copy, unless
    checkpointing recomputes it."""
    if not s.bf16 or _bf16_base(s):
        return 0
    if not s.lora_rank:
        return 2 * matmul_weights
    return 0 if s.grad_checkpointing else 2 * 2 * matmul_weights


def _layer_bytes(c: ModelConfig, s: UpdateShape, tokens: int, rows: int, keys: int,
                 own_keys: bool) -> int:
    """Bytes one layer keeps for the backward over `tokens` query tokens in `rows` rows of `keys`
    keys each (module docstring: the tensors model.py's operations save, one term each)."""
    H, I, r = c.hidden_size, c.intermediate_size, s.lora_rank
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    a, b, stream = _activation_bytes(s)
    # two RMSNorms: their float32 input (the stream itself, or its float32 copy) and 1/rms; the
    # normalised x too when the norm's weight trains (a full fine-tune)
    per_token = 2 * (4 * H + 4 + (0 if r else stream * H))
    # the trained matmuls' inputs (b bytes): one copy per projection when each casts its own
    # (autocast, or LoRA's A reading a bf16 input in float32), else one per distinct tensor
    # (q/k/v share the first norm's output, gate/up the second's)
    per_token += b * ((5 * H if s.bf16 or _bf16_base(s) else 2 * H) + q + I)
    per_token += b * r * len(LORA_TARGETS)          # LoRA: each B's input, its A's r outputs
    if c.qk_norm:                                   # q/k-norm: float32 input, 1/rms per head
        per_token += 4 * (q + kv) + 4 * (c.num_attention_heads + c.num_key_value_heads) + (
            0 if r else a * (q + kv))
    per_token += 3 * a * I                          # SwiGLU's gate, silu(gate) and up
    if own_keys:                    # the prompt's own keys/values (kept by the cache as well)
        per_token += 2 * a * kv
        if s.device in EXPAND_KV_FOR_MASK and a == 4 and q != kv:
            # float32 GQA on CUDA: no fused kernel takes it, the math one keeps the scaled q, k
            # and v repeated to the query heads, and the float32 probabilities
            return tokens * (per_token + 3 * a * q + 4 * c.num_attention_heads * keys)
    # a fused attention's q, output and float32 log-sum-exp
    per_token += 2 * a * q + 4 * c.num_attention_heads
    if own_keys:
        return tokens * per_token
    # each row's keys/values: the prompt's, expanded, and its own; on CUDA repeated to the query
    # heads (model.attend: a mask rules out GQA in the fused kernels); the additive mask (a row's
    # own when completions are padded)
    repeated = q if s.device in EXPAND_KV_FOR_MASK and q != kv else kv
    per_row = 2 * a * repeated * keys + a * (tokens // rows) * keys
    return tokens * per_token + rows * per_row


def _bf16_base(s: UpdateShape) -> bool:
    return bool(s.lora_rank) and s.lora_base_bytes == 2


def _activation_bytes(s: UpdateShape) -> tuple[int, int, int]:
    """(a: a matmul's output, b: what a trained matmul keeps of its input, the residual stream's)
    in bytes: bf16 under autocast or over a bf16 base; a bf16 base makes a bf16 stream."""
    bf16_base = _bf16_base(s)
    return (2 if s.bf16 or bf16_base else 4), (2 if s.bf16 else 4), (2 if bf16_base else 4)


def largest_micro_batch(c: ModelConfig, s: UpdateShape, gpu_bytes: int) -> int:
    """The largest micro-batch (1..K) whose predicted peak fits in gpu_bytes; 0 when not even one
    does."""
    fits = [m for m in range(1, s.candidates + 1)
            if predict_update_memory(c, _with(s, micro_batch=m))["peak"] <= gpu_bytes]
    return max(fits, default=0)


def _with(s: UpdateShape, **changes) -> UpdateShape:
    return UpdateShape(**{**s.__dict__, **changes})


def memory_report(name: str, s: UpdateShape, gpu_gib: float) -> str:
    """What `bench memory` prints: the parts of the predicted peak in GiB, and the micro-batch that
    fits."""
    config = published_config(name)
    n, trained = parameter_counts(config, s.lora_rank)
    lines = [f"bench memory: {name} ({n:,} parameters, {trained:,} trained), predicted for one "
             f"update: K={s.candidates} x {s.skill_tokens} tokens after a {s.prompt_tokens}-token "
             f"prompt, micro-batch {s.micro_batch}, {'bf16 autocast' if s.bf16 else 'float32'}"
             f"{', gradient checkpointing' if s.grad_checkpointing else ''}, attention laid out "
             f"as on {s.device}", "| part | GiB |",
             "|---|---|"]
    lines += [
        f"| {part} | {value / GIB:.2f} |"
        for part, value in predict_update_memory(config, s).items()
    ]
    fits = largest_micro_batch(config, s, int(gpu_gib * GIB))
    lines.append(f"largest --micro-batch that fits {gpu_gib:g} GiB: {fits}" if fits else
                 f"not even --micro-batch 1 fits {gpu_gib:g} GiB (try --grad-checkpointing, "
                 f"--lora-rank, --bf16)")
    return "\n".join(lines)


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storage alive that operations inside the mode allocated: `now`, and `peak`
    since entry. Tensors made before the mode (the weights) are not in it: add them."""

    def __init__(self):
        super().__init__()
        self.now = self.peak = 0
        self._alive: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.untyped_storage(
                    ).data_ptr() not in given:
                self._track(t.untyped_storage())   # not an input returned (in place) or viewed
        return out

    def _track(self, storage) -> None:
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._alive:
            return                      # a view, an in-place result, or an empty tensor: nothing
                                        # new

        def freed(_, key=key, size=size):
            self.now -= size
            self._alive.pop(key, None)
        self._alive[key] = weakref.ref(storage, freed)
        self.now += size
        self.peak = max(self.peak, self.now)
