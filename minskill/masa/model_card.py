"""The model card of a target model: what MASA's teacher (and the rewriter) is told about it
(docs/masa.md).

Fields: family, variant, parameter_count, architecture, num_layers, hidden_size,
num_attention_heads, num_kv_heads, context_window, vocab_size, base_or_instruct, alignment_method,
training_data_size, multilingual, strengths, weaknesses. The architectural fields come from a
checkpoint's config.json (`model_card_from_config`, which also estimates the parameter count), and
what no config.json holds of a known model from `KNOWN_MODELS`: `target_model_card(spec)` builds the
card of a spec or checkpoint folder from both, the one builder of every script; strengths and
weaknesses are summarised by the teacher from preliminary rollouts
(minskill.masa.search.summarize_model), so the card a run used, with them, is the run's
model_card.json. A card is JSON on disk (`ModelCard.save` / `load`, strict: an unknown or mistyped
field is an error naming it); other tools' looser cards are read with `as_model_card`.

`load` (and `read_card_file`, which the scripts' --model-card use) also reads MASA's YAML cards: a
mapping of fields, read as SKILL.md front matter is (minskill.skills.parse_front_matter: PyYAML's
safe loader, at most MAX_FILE_BYTES = 256 KiB, checked before parsing). Every YAML value is its
text, so each is converted by its field: the integer fields take digits or a size such as "8B" /
"1.7B" / "135M" (K, M, B, T: 10^3..10^12 -- MASA writes parameter_count so), multilingual takes
true/false/yes/no, null, ~ or nothing is null, and strengths / weaknesses take one string (MASA
writes them as one comma-separated line; it is kept whole) or a YAML list of strings. A file ending
in .yaml / .yml is YAML, .json is JSON, anything else is JSON when it starts with "{". A malformed
card is a ValueError naming the file and the line or field: text that is not UTF-8, an integer of
more than `MAX_CARD_DIGITS` digits, a value nested deeper than a card's, a folder.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any

from minskill.files import read_json, write_json_atomic
from minskill.replies import nested_deeper_than
from minskill.skills import MAX_FILE_BYTES, SkillFormatError, parse_front_matter


@dataclass
class ModelCard:
    """What the teacher is told about the target model (docs/masa.md). Unknown values stay
    None/"unknown"."""
    name: str = ""                          # the model id the target is served under
    family: str = "unknown"                 # e.g. Llama, Qwen2, Qwen3
    variant: str = "unknown"                # e.g. 135M, 8B
    parameter_count: int | None = None
    architecture: str = "unknown"           # e.g. LlamaForCausalLM
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    context_window: int | None = None
    vocab_size: int | None = None
    base_or_instruct: str = "unknown"       # "base" | "instruct" | "unknown"
    alignment_method: str = "unknown"       # e.g. SFT+DPO
    training_data_size: str = "unknown"     # e.g. "2T tokens"
    release_date: str = "unknown"           # e.g. "2025-04" (MASA's cards have it)
    multilingual: bool | None = None
    strengths: list[str] = field(default_factory=list)
    weaknesses: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "model card") -> "ModelCard":
        """Build a card from a dict; raises ValueError naming the bad field and `where` it came
        from."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: must be a JSON object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; known fields: {sorted(known)}")
        card = cls()
        for key, value in data.items():
            setattr(card, key, _check_card_value(key, value, where))
        return card

    def save(self, path) -> None:
        write_json_atomic(path, self.to_json())

    @classmethod
    def load(cls, path) -> "ModelCard":
        """A JSON or YAML card file (see the module docstring); an unknown or mistyped field is an
        error."""
        data, where = read_card_file(path)
        return cls.from_json(data, where=where)

    def to_prompt(self) -> str:
        """The card as short `field: value` lines for a teacher prompt (unknown fields left out)."""
        lines = []
        for key, value in self.to_json().items():
            if value in (None, "", "unknown", []):
                continue
            if isinstance(value, list):
                value = "; ".join(str(v) for v in value)
            lines.append(f"{key}: {value}")
        return "\n".join(lines) or "(nothing known about the target model)"


def as_model_card(card, where: str = "model card") -> ModelCard:
    """A ModelCard from a ModelCard or a loosely filled dict (other tools' cards): unknown keys are
    dropped, None / "unknown" values become the field's default, a value of the wrong type is an
    error naming `where`."""
    if isinstance(card, ModelCard):
        return card
    if not isinstance(card, dict):
        raise ValueError(f"{where}: must be a ModelCard or a JSON object, got "
                         f"{type(card).__name__}")
    known = {f.name for f in fields(ModelCard)}
    default = ModelCard().to_json()
    cleaned = {k: v for k, v in card.items() if k in known and v is not None and v != "unknown"}
    return ModelCard.from_json({**default, **cleaned}, where=where)


def read_card_file(path, strict: bool = True) -> tuple[dict, str]:
    """(the card's fields as a dict, "model card PATH" for messages) from a JSON or YAML card file;
    a YAML card's values come converted to its fields' types (see the module docstring), an unknown
    YAML key is an error naming its line (strict) or dropped. ModelCard.from_json or as_model_card
    then check the dict."""
    path = Path(path)
    where = f"model card {path}"
    if path.is_dir():
        raise ValueError(f"{where}: is a folder; a model card is a JSON or YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no such file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{where}, line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                         f"offset {e.start})") from None
    is_yaml = path.suffix.lower() in (".yaml", ".yml") or (
        path.suffix.lower() != ".json" and not text.lstrip().startswith("{"))
    if not is_yaml:
        return _json_card(text, where), where
    return _yaml_card(text, where, strict), where


# A card's integers have at most this many digits (no model has 10^18 layers or parameters), which
# also keeps them far from Python's 4,300-digit limit on reading an integer from text, whose error
# names no field.
MAX_CARD_DIGITS = 18
# a field's value nests at most this deep (ModelCard's: a list of strings, 1; other tools' more)
MAX_FIELD_DEPTH = 3


class _LongNumber:
    """A JSON integer of more than MAX_CARD_DIGITS digits, kept as its length so that the field
    check names it."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {self.digits}-digit number"


def _card_int(text: str):
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_CARD_DIGITS else _LongNumber(digits)


def _json_card(text: str, where: str):
    """A JSON card's value; errors name the file (and the field nested too deeply)."""
    try:
        data = json.loads(text, parse_int=_card_int)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{where}: not a model card: JSON nested too deeply to read") from None
    for key, value in (data.items() if isinstance(data, dict) else [("(the card)", data)]):
        if nested_deeper_than(value, MAX_FIELD_DEPTH):   # (its message would overflow the stack)
            raise ValueError(f"{where}: field {str(key)[:100]!r} is nested more than "
                             f"{MAX_FIELD_DEPTH} levels deep; a card's values are text, numbers, "
                             f"true/false or lists of text")
    return data


_TOP_KEY = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*)\s*:")
_NULL = {"", "~", "null", "Null", "NULL"}
_BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMBT])", re.IGNORECASE)
_SIZE_FACTOR = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def _yaml_card(text: str, where: str, strict: bool) -> dict:
    """The YAML mapping of a card as typed fields; errors name the file and line."""
    if len(text.encode("utf-8")) > MAX_FILE_BYTES:
        raise ValueError(f"{where}: {len(text.encode('utf-8'))} bytes; a YAML card is at most "
                         f"{MAX_FILE_BYTES}")
    lines = text.splitlines()
    try:
        raw = parse_front_matter(lines, where, first_line=1)
    except SkillFormatError as error:
        raise ValueError(f"not a model card: {error}") from None
    line_of = {}
    for number, line in enumerate(lines, 1):
        if (match := _TOP_KEY.match(line)) and match.group(1) not in line_of:
            line_of[match.group(1)] = number
    known = {f.name: f for f in fields(ModelCard)}
    card = {}
    for key, value in raw.items():
        at = f"{where}, line {line_of.get(key, '?')}"
        if key not in known:
            if not strict:
                continue
            raise ValueError(f"{at}: unknown field {key!r}; known fields: {sorted(known)}")
        if isinstance(value, list) and key in ("strengths", "weaknesses") \
                and all(isinstance(v, str) for v in value):
            card[key] = [v.strip() for v in value if v.strip()]
            continue
        if not isinstance(value, str):
            raise ValueError(f"{at}: field {key!r} must be one value, not a "
                             f"{'list' if isinstance(value, list) else 'nested mapping'}")
        card[key] = _yaml_value(key, value.strip(), known[key], at)
    return card


def _yaml_value(key: str, value: str, spec, at: str):
    """One YAML text value as the type of field `key` (ModelCard field `spec`)."""
    if key in _INT_FIELDS:
        if value in _NULL:
            return None
        number = None
        if re.fullmatch(r"[0-9][0-9_]*", value):
            digits = value.replace("_", "")
            number = int(digits) if len(digits) <= MAX_CARD_DIGITS else _LongNumber(len(digits))
        elif key == "parameter_count" and (size := _SIZE.fullmatch(value)):
            number = int(Decimal(size.group(1)) * _SIZE_FACTOR[size.group(2).upper()])
        if number is not None:
            if not isinstance(number, int) or number >= 10 ** MAX_CARD_DIGITS:
                got = number if isinstance(number, _LongNumber) else repr(value)[:100]
                raise ValueError(f"{at}: field {key!r} must be a whole number of at most "
                                 f"{MAX_CARD_DIGITS} digits, got {got}")
            return number
        shape = "a whole number or a size such as 8B or 135M" if key == "parameter_count" \
            else "a whole number"
        raise ValueError(f"{at}: field {key!r} must be {shape}, got {value!r:.100}")
    if key == "multilingual":
        if value in _NULL:
            return None
        if value.lower() in _BOOLEANS:
            return _BOOLEANS[value.lower()]
        raise ValueError(f"{at}: field 'multilingual' must be true, false or null, got "
                         f"{value!r:.100}")
    if key in ("strengths", "weaknesses"):
        return [] if value in _NULL else [value]
    return spec.default if value in ("~", "null", "Null", "NULL") else value


_INT_FIELDS = {"parameter_count", "num_layers", "hidden_size", "num_attention_heads",
               "num_kv_heads", "context_window", "vocab_size"}


def _check_card_value(key: str, value, where: str):
    if key in _INT_FIELDS:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0
                                  or value >= 10 ** MAX_CARD_DIGITS):
            shown = repr(value) if isinstance(value, _LongNumber) else f"{value!r:.100}"
            raise ValueError(f"{where}: field {key!r} must be a non-negative integer of at most "
                             f"{MAX_CARD_DIGITS} digits, or null, got {shown}")
    elif key in ("strengths", "weaknesses"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: field {key!r} must be a list of strings, got "
                             f"{value!r:.200}")
    elif key == "multilingual":
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{where}: field 'multilingual' must be true, false or null, got "
                             f"{value!r}")
    elif not isinstance(value, str):
        raise ValueError(f"{where}: field {key!r} must be a string, got {value!r:.200}")
    return value


_FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral",
             "gemma": "Gemma", "gemma2": "Gemma2", "gemma3": "Gemma3", "phi3": "Phi-3",
             "olmo2": "OLMo2"}


def estimate_parameter_count(config: dict) -> int:
    """Parameters of a decoder-only transformer from its HF config (Llama / Qwen2 / Qwen3 layout):

        embeddings V·H (+ V·H for an untied lm_head)
        per layer: q,o  2·H·(n_q·d)  +  k,v  2·H·(n_kv·d)
                   (+ biases n_q·d + 2·n_kv·d for Qwen2 / attention_bias)
                   + MLP 3·H·I  + 2 RMSNorms 2·H  (+ Qwen3 q/k norms 2·d)
        final norm H
    """
    try:
        V, H, L = config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]
        n_q = config["num_attention_heads"]
        I = config["intermediate_size"]
    except KeyError as e:
        raise ValueError(f"config lacks {e.args[0]!r}, needed to estimate the parameter "
                         f"count") from None
    n_kv = config.get("num_key_value_heads") or n_q
    d = config.get("head_dim") or H // n_q
    model_type = config.get("model_type", "")
    per_layer = 2 * H * n_q * d + 2 * H * n_kv * d + 3 * H * I + 2 * H
    if config.get("attention_bias") or model_type == "qwen2":
        per_layer += n_q * d + 2 * n_kv * d
    if model_type == "qwen3":
        per_layer += 2 * d
    tied = config.get("tie_word_embeddings", False)
    return V * H * (1 if tied else 2) + L * per_layer + H


def _size_label(params: int) -> str:
    if params >= 1e9:
        return f"{params / 1e9:.1f}B".replace(".0B", "B")
    return f"{round(params / 1e6)}M"


def model_card_from_config(path, **overrides) -> ModelCard:
    """A card with the architectural fields read from a checkpoint's config.json (`path`: the file
    or the checkpoint folder); family, variant and parameter_count are estimated from the config;
    base/instruct is guessed from the folder name. `overrides` set any field (checked like a JSON
    card)."""
    path = Path(path)
    config_path = path / "config.json" if path.is_dir() else path
    config = read_json(config_path, f"model card: {config_path}",
                       missing=f"model card: no config.json at {config_path}")
    if not isinstance(config, dict):
        raise ValueError(f"model card: {config_path} must hold a JSON object")
    model_type = str(config.get("model_type", "unknown"))
    params = estimate_parameter_count(config)
    folder_name = (config_path.parent.name + " " + str(config.get("_name_or_path", ""))).lower()
    instruct = any(word in folder_name for word in ("instruct", "chat", "-it"))
    card = ModelCard(
        name=config_path.parent.name,
        family=_FAMILIES.get(model_type, model_type),
        variant=_size_label(params),
        parameter_count=params,
        architecture=(config.get("architectures") or [model_type])[0],
        num_layers=config.get("num_hidden_layers"),
        hidden_size=config.get("hidden_size"),
        num_attention_heads=config.get("num_attention_heads"),
        num_kv_heads=config.get("num_key_value_heads") or config.get("num_attention_heads"),
        context_window=config.get("max_position_embeddings"),
        vocab_size=config.get("vocab_size"),
        base_or_instruct="instruct" if instruct else "unknown")
    return ModelCard.from_json({**card.to_json(), **overrides},
                               where=f"model card from {config_path}")


# What a known model's own card says and no config.json holds, by model spec: SmolLM2-135M-Instruct,
# the embedded default (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct: "trained on 2 trillion
# tokens", "SFT ... then DPO using UltraFeedback", English).
KNOWN_MODELS = {"smollm2-135m": dict(family="SmolLM2", variant="135M-Instruct",
                                     base_or_instruct="instruct", alignment_method="SFT + DPO",
                                     training_data_size="2T tokens", multilingual=False)}


def target_model_card(spec, name: str | None = None) -> ModelCard:
    """The card of a target given as a model spec (smollm2-135m) or a checkpoint folder, before the
    teacher adds strengths and weaknesses: its config.json's fields (model_card_from_config) and
    what KNOWN_MODELS says of a known spec; named `name`, else the spec's last path part. The one
    builder of evolve_masa.py's card (--target-checkpoint, the embedded target), rewrite.py apply's
    --model-card SPEC and minskill.measure.transfer's embedded targets, so that the rewriter is
    given at apply the card its SFT records were built with."""
    from minskill.nn.weights import resolve_model  # (torch: imported only when a card is built)
    spec = str(spec)
    return model_card_from_config(resolve_model(spec), name=name or Path(spec).name,
                                  **KNOWN_MODELS.get(spec, {}))
