"""The memory of one Skill-R1 update, predicted from a model config, and measured on the CPU.

`python -m minskill.measure.bench memory --config qwen3-1.7b -K 8 --prompt-tokens 512
--skill-tokens 64` prints `predict_update_memory`: what train_grpo.policy_update holds at its peak,
in bytes, for the published Qwen3 configs (QWEN3_CONFIGS, from each model's config.json) or any
ModelConfig:

    weights     N · 4 (full fine-tune: float32 master weights) or N_base · (2 | 4) + N_lora · 4
                (LoRA)
    grads       N_train · 4                    (float32, like the weights they update)
    optimizer   N_train · 8                    (AdamW's two moments, float32)
    activations what one micro-batch of m candidates keeps for the backward (below); under bf16
    autocast also
                the bf16 copies of float32 weights (2 · N) that the matmuls keep
    transient   the largest short-lived tensors on top: a chunk of logits and its gradient, a
                layer's recomputation and gradients under checkpointing, AdamW's foreach temporaries
    update peak weights + grads + max(activations + transient, optimizer + AdamW temporaries)
    KV cache    sampling's cache before the update: K rows of P + S slots per layer
    sampling peak  weights + grads + optimizer (all alive between updates) + KV cache + a row of
                   logits per candidate
    peak        the larger of the two

Activations of the shared-prefix update (nn.shared_prefix: the prompt once, then m rows of S
completion tokens attending to its P keys), per layer, with H hidden, I intermediate, q = n_h·d, kv
= n_kv·d, counted from the tensors model.py's operations save (a = bytes of an activation: 4, or 2
under bf16 autocast; norms compute in float32):

    per token      a·(4I + 6q + 3kv) + 4·(6H) (+ 2kv for the prompt's own keys, which the cache
                   keeps)
                   + LoRA: a·r per adapted projection (+ 4·in per projection when its input is cast
                   up)
    per row        a·2kv·(P + S): the completion rows' keys/values (the prompt's, expanded), +
                   4·S·(P + S): mask
    checkpointed   per token 4·H (each layer's input) and the prompt's keys/values only; one layer's
                   activations come back for its backward (transient)

`largest_micro_batch` is the largest m whose peak fits a GPU of a given size. The figures count
tensor bytes, as torch.cuda.max_memory_allocated does (not the allocator's reserved segments: leave
~10% for them).

`LiveBytes` measures the same quantity on the CPU: a TorchDispatchMode that adds each new tensor
storage an operation returns and subtracts it when the storage is freed (a weak reference), so its
peak is what a device allocator would have had allocated at once (the CPU has no allocator
statistics to read). tests/test_memory.py checks the prediction against it within 20% on small
configs. """
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minskill.nn.model import ModelConfig
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


def _layer_bytes(c: ModelConfig, s: UpdateShape, tokens: int, rows: int, keys: int,
                 own_keys: bool) -> int:
    """Bytes one layer saves for the backward over `tokens` query tokens in `rows` rows of `keys`
    keys each."""
    H, I = c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    bf16_base = s.lora_rank and s.lora_base_bytes == 2
    a = 2 if s.bf16 or bf16_base else 4
    # SwiGLU's four I-wide tensors; q, q-norm's input/output, RoPE'd q, attention's output and
    # o_proj's input;
    # k and its norm; two RMSNorms' input/normalised/output (float32 over a float32 residual stream)
    per_token = a * (4 * I + (6 * q + 3 * kv if c.qk_norm else 4 * q + kv)) + (16 if bf16_base
            else 24) * H
    if own_keys:                        # the prompt's keys/values are its own (saved by attention,
                                        # kept by the cache)
        per_token += a * 2 * kv
    if s.lora_rank:                     # A's r outputs; a frozen W keeps no second copy of its
                                        # input
        ins = [i for i, _ in _projections(c).values()]
        per_token += 4 * s.lora_rank * len(ins) - a * (2 * H + I + q) + (4 * sum(ins) if bf16_base
                else 0)
    per_row = 0 if own_keys else a * 2 * kv * keys + 4 * (tokens // rows) * keys
    return tokens * per_token + rows * per_row


def predict_update_memory(c: ModelConfig, s: UpdateShape) -> dict[str, int]:
    """The components of one update's peak in bytes (module docstring); "peak" is their
    combination."""
    n, n_train = parameter_counts(c, s.lora_rank)
    n_lora = n_train if s.lora_rank else 0
    weights = (n - n_lora) * (s.lora_base_bytes if s.lora_rank else 4) + 4 * n_lora
    # autocast's bf16 copies of float32 weights: the matmuls keep them for the backward, so they
    # count as activations
    casts = 2 * (n - n_lora) if s.bf16 and not (s.lora_rank and s.lora_base_bytes == 2) else 0
    m, P, S = min(s.micro_batch, s.candidates), s.prompt_tokens, s.skill_tokens
    L, H = c.num_hidden_layers, c.hidden_size
    a, kv = 2 if s.bf16 else 4, c.num_key_value_heads * c.head_dim
    prefix = _layer_bytes(c, s, P, 1, P, own_keys=True)
    rows = _layer_bytes(c, s, m * S, m, P + S, own_keys=False)
    if s.grad_checkpointing:
        activations = L * (4 * H * (P + m * S) + a * 2 * kv * P)
        layer_again = 3 * max(prefix, rows) // 2       # one layer recomputed, and the gradients of
                                                       # its tensors
    else:
        activations, layer_again = L * (prefix + rows), max(prefix, rows) // 2
    activations += 4 * H * 4 * (P + m * S) + casts     # final norm, the hidden states the logits
                                                       # are read from
    logits = 4 * 3 * min(s.chunk_tokens, m * S) * c.vocab_size   # a chunk's logits, log-softmax,
                                                                 # their gradient
    grads, optimizer = 4 * n_train, 8 * n_train
    # AdamW's step makes temporaries: of every trained tensor at once (foreach), or of one at a
    # time (a loop)
    proj = _projections(c).values()
    largest = max(s.lora_rank * max(i, o) for i, o in proj) if s.lora_rank else \
        max(c.vocab_size * H, *(i * o for i, o in proj))
    adam_temps = 4 * n_train if s.foreach else 8 * largest
    transient = max(logits, layer_again)
    # sampling the K candidates before the update: a KV cache of K rows of P + S slots in the
    # compute dtype
    kv_cache = L * 2 * kv * s.candidates * (P + S) * (2 if s.bf16 or s.lora_rank
                                                      and s.lora_base_bytes == 2 else 4)
    update = weights + grads + max(activations + transient, optimizer + adam_temps)
    sampling = weights + grads + optimizer + kv_cache + 4 * 2 * s.candidates * c.vocab_size
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "activations": activations,
            "transient": transient, "update peak": update, "sampling KV cache": kv_cache,
            "sampling peak": sampling, "peak": max(update, sampling)}


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
             f"{', gradient checkpointing' if s.grad_checkpointing else ''}", "| part | GiB |",
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
