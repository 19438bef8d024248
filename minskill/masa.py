"""MASA stage 1 (Model-Aware Skill Alignment): a teacher LLM evolves a skill library for one target model.

The target F is a frozen model behind an OpenAI-compatible URL; it is described to the teacher by a
*model card* (`ModelCard`: family, size, architecture, context, strengths, weaknesses, ...). The
architectural fields come from a checkpoint's config.json (`model_card_from_config`); strengths and
weaknesses are summarised by the teacher from a few preliminary rollouts kept apart from the search and
from evaluation (`summarize_model`).

Reward of a skill set S on a list of tasks (rollout.summarize computes the means):

    R(S) = SR − λ_nh · NHR          SR  = share of tasks solved
                                    NHR = mean over episodes of (steps answered "Nothing happens.") / steps

Phase 1, general skills, hill climbing (`hill_climb`, driven by `MasaSearch._general_phase`):

    S* = S_0 (base skills), R* = R(S_0) on the search tasks
    for it = 1..I, while fewer than p consecutive iterations failed to improve:
        failures of S*              -> teacher: structured failure attribution A (JSON)   `attribution_messages`
        (S*, A, card, top-5 sets of the whole history by R) -> teacher: new general skills S'
                                                                                   `general_rewrite_messages`
        accept S' (S* <- S', R* <- R(S')) only if R(S') > R*   (strictly; equal or worse is rejected)

Phase 2, task-specific skills, one UCB1 tree per task type t with the general skills of S* fixed
(`MasaSearch._tree_phase`, the tree itself is minskill/ucb.py):

    root = S*'s skills for t; a node's reward = R over N episodes of type t
    select by UCB1(n) = R̄(n) + C · sqrt(ln N(parent) / N(n))   (R̄: mean over n and its descendants)
    expand = failures of the node -> teacher attribution -> teacher rewrite of t's skills -> child
    J iterations; the tree's best node (highest own reward) gives t's skills in the evolved library.
    (A node gets up to `max_children` sibling rewrites before selection descends below it; see ucb.py.)

Both phases stop early once the best R is 1, the maximum (nothing can be strictly better). The evolved
library = the best general skills + each type's best node; its R on the search tasks is `reward_out`.

A teacher reply is parsed robustly (JSON in a fence or inside prose, the skill format of skills.py); a
reply that does not parse is retried (at most `teacher_retries` times, telling the teacher what was
wrong), then the step is skipped and the skip is logged (`ask_teacher`).

Also here: the one-shot teacher adaptation (`one_shot_rewrite`, the "DS-Adapter" baseline), the rewriter's
SFT records (`sft_records`, `merge_sft_runs`, augmentations `augment_noise` / `augment_partial` /
`augment_verbose`), a disk cache of target calls (`CachingClient`, key = sha256 of the model, the exact
messages, the sampling parameters and the seed) and a call budget (`CallBudget`).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import re
import tempfile
import threading
import zlib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from minskill import ucb
from minskill.rollout import read_jsonl, run_rollouts, summarize
from minskill.skills import Skill, SkillParseError, SkillSet, parse_skillset


# ----------------------------------------------------------------------------------------------------------
# Small file helpers

def write_text_atomic(path, text: str) -> None:
    """Write a text file atomically: temp file in the same folder, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes files private (0600); these are ordinary outputs
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def write_jsonl_atomic(path, records) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


# ----------------------------------------------------------------------------------------------------------
# Model card

@dataclass
class ModelCard:
    """What the teacher is told about the target model (DESIGN.md §4). Unknown values stay None/"unknown"."""
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
    multilingual: bool | None = None
    strengths: list[str] = field(default_factory=list)
    weaknesses: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "model card") -> "ModelCard":
        """Build a card from a dict; raises ValueError naming the bad field and `where` it came from."""
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
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"model card {path}: no such file")
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as e:
            raise ValueError(f"model card {path}: not valid JSON ({e})") from None
        return cls.from_json(data, where=f"model card {path}")

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


def as_model_card(card) -> ModelCard:
    """A ModelCard from a ModelCard or a loosely filled dict (other tools' cards): unknown keys are dropped,
    None / "unknown" values become the field's default, a value of the wrong type is an error."""
    if isinstance(card, ModelCard):
        return card
    if not isinstance(card, dict):
        raise ValueError(f"model card must be a ModelCard or a dict, got {type(card).__name__}")
    known = {f.name for f in fields(ModelCard)}
    default = ModelCard().to_json()
    cleaned = {k: v for k, v in card.items() if k in known and v is not None and v != "unknown"}
    return ModelCard.from_json({**default, **cleaned}, where="model card")


_INT_FIELDS = {"parameter_count", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
               "context_window", "vocab_size"}


def _check_card_value(key: str, value, where: str):
    if key in _INT_FIELDS:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"{where}: field {key!r} must be a non-negative integer or null, got {value!r}")
    elif key in ("strengths", "weaknesses"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: field {key!r} must be a list of strings, got {value!r:.200}")
    elif key == "multilingual":
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{where}: field 'multilingual' must be true, false or null, got {value!r}")
    elif not isinstance(value, str):
        raise ValueError(f"{where}: field {key!r} must be a string, got {value!r:.200}")
    return value


_FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "gemma": "Gemma",
             "gemma2": "Gemma2", "gemma3": "Gemma3", "phi3": "Phi-3", "olmo2": "OLMo2"}


def estimate_parameter_count(config: dict) -> int:
    """Parameters of a decoder-only transformer from its HF config (Llama / Qwen2 / Qwen3 layout):

        embeddings V·H (+ V·H for an untied lm_head)
        per layer: q,o  2·H·(n_q·d)  +  k,v  2·H·(n_kv·d)  (+ biases n_q·d + 2·n_kv·d for Qwen2 / attention_bias)
                   + MLP 3·H·I  + 2 RMSNorms 2·H  (+ Qwen3 q/k norms 2·d)
        final norm H
    """
    try:
        V, H, L = config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]
        n_q = config["num_attention_heads"]
        I = config["intermediate_size"]
    except KeyError as e:
        raise ValueError(f"config lacks {e.args[0]!r}, needed to estimate the parameter count") from None
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
    return f"{params / 1e9:.1f}B".replace(".0B", "B") if params >= 1e9 else f"{round(params / 1e6)}M"


def model_card_from_config(path, **overrides) -> ModelCard:
    """A card with the architectural fields read from a checkpoint's config.json (`path`: the file or the
    checkpoint folder); family, variant and parameter_count are estimated from the config; base/instruct
    is guessed from the folder name. `overrides` set any field (checked like a JSON card)."""
    path = Path(path)
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise FileNotFoundError(f"model card: no config.json at {config_path}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise ValueError(f"model card: {config_path} is not valid JSON ({e})") from None
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
    return ModelCard.from_json({**card.to_json(), **overrides}, where=f"model card from {config_path}")


model_card_from_checkpoint = model_card_from_config  # the name rewrite.py looks for


# ----------------------------------------------------------------------------------------------------------
# Reward

def adjusted_reward(success_rate: float, nhr: float, lam_nh: float) -> float:
    """MASA's adjusted reward R = SR − λ_nh · NHR."""
    return success_rate - lam_nh * nhr


# ----------------------------------------------------------------------------------------------------------
# Target-call cache and call budget

class BudgetExhausted(RuntimeError):
    """The run's --max-calls budget is spent; the search stops and keeps the best so far."""


class CallBudget:
    """Counts model calls (target calls that miss the cache, and teacher calls) against a limit."""

    def __init__(self, max_calls: int | None = None, spent: int = 0):
        if max_calls is not None and max_calls < 0:
            raise ValueError(f"max_calls must be >= 0 or None, got {max_calls}")
        self.max_calls, self.spent = max_calls, spent
        self.refusals = 0  # charges refused so far (a rollout compares it before and after)
        self._lock = threading.Lock()

    @property
    def exhausted(self) -> bool:
        return self.refusals > 0

    def charge(self, calls: int) -> None:
        """Reserve `calls` calls, or raise BudgetExhausted (and count the refusal) when they do not fit."""
        with self._lock:
            if self.max_calls is not None and self.spent + calls > self.max_calls:
                self.refusals += 1
                raise BudgetExhausted(f"call budget spent: {self.spent} of {self.max_calls} calls used, "
                                      f"{calls} more needed")
            self.spent += calls


def request_key(model: str, request: dict) -> str:
    """sha256 of (model, exact messages, sampling parameters, seed): what makes two calls the same call."""
    keyed = {"model": model, "messages": request["messages"], "n": request.get("n", 1),
             "temperature": request.get("temperature", 0.0), "top_p": request.get("top_p", 1.0),
             "max_tokens": request.get("max_tokens", 256), "stop": request.get("stop"),
             "seed": request.get("seed")}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class CachingClient:
    """A ChatClient wrapper with the same `chat` / `chat_many` interface (so rollout.run_rollouts uses it
    unchanged) that answers repeated calls from a JSONL file on disk and charges new calls to a budget.

    cache_path None = no cache (still counts and charges the budget). Each new result is appended as one
    line with a single O_APPEND write, so concurrent appends do not interleave and a crash can only tear
    the last line (dropped on load). `stats`: calls (sent to the model), cache_hits."""

    def __init__(self, inner, cache_path=None, budget: CallBudget | None = None, model: str | None = None):
        self.inner, self.budget = inner, budget or CallBudget()
        self.cache_path = None if cache_path is None else Path(cache_path)
        self._model = model
        self._lock = threading.Lock()
        self._cache: dict[str, dict] = {}
        self.calls = self.cache_hits = 0
        if self.cache_path is not None and self.cache_path.exists():
            for _, record in read_jsonl(self.cache_path):
                if isinstance(record, dict) and "key" in record and "result" in record:
                    self._cache[record["key"]] = record["result"]

    @property
    def model(self) -> str:
        """The target's model name (asked from the server once when none was configured)."""
        if self._model is None:
            self._model = getattr(self.inner, "model", None)
            if self._model is None and hasattr(self.inner, "resolve_model"):
                self._model = self.inner.resolve_model()
            self._model = self._model or "default"
        return self._model

    @property
    def stats(self) -> dict:
        return {"calls": self.calls, "cache_hits": self.cache_hits, "cached_entries": len(self._cache)}

    def _lookup(self, key: str):
        from minskill.client import ChatResult
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self.cache_hits += 1
                return ChatResult(**hit)
        return None

    def _store(self, key: str, result) -> None:
        record = {"texts": list(result.texts), "finish_reasons": list(result.finish_reasons),
                  "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens}
        with self._lock:
            self._cache[key] = record
            if self.cache_path is not None:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                line = (json.dumps({"key": key, "result": record}, ensure_ascii=False) + "\n").encode("utf-8")
                fd = os.open(self.cache_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)

    def chat(self, messages, n=1, temperature=0.0, top_p=1.0, max_tokens=256, stop=None, seed=None):
        return self.chat_many([dict(messages=messages, n=n, temperature=temperature, top_p=top_p,
                                    max_tokens=max_tokens, stop=stop, seed=seed)])[0]

    def chat_many(self, requests: list[dict], return_exceptions=False) -> list:
        caching = self.cache_path is not None
        keys = [request_key(self.model, r) if caching else None for r in requests]
        results: list = [self._lookup(k) if caching else None for k in keys]
        missing = [i for i, r in enumerate(results) if r is None]
        if not missing:
            return results
        try:
            self.budget.charge(len(missing))
        except BudgetExhausted as error:
            if not return_exceptions:
                raise
            for i in missing:
                results[i] = error
            return results
        with self._lock:
            self.calls += len(missing)
        fresh = self.inner.chat_many([requests[i] for i in missing], return_exceptions=return_exceptions)
        for i, result in zip(missing, fresh):
            results[i] = result
            if caching and not isinstance(result, BaseException):
                self._store(keys[i], result)
        return results


# ----------------------------------------------------------------------------------------------------------
# Reading teacher replies

class TeacherReplyError(ValueError):
    """A teacher reply that does not have the asked-for shape."""


def _quote(text: str, limit: int = 300) -> str:
    text = (text or "").strip()
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def extract_json(reply: str):
    """The JSON value in a reply: a ```json fenced block, else the first balanced {...} or [...] that
    decodes (prose around it is ignored). Raises TeacherReplyError quoting the reply."""
    decoder = json.JSONDecoder()
    candidates = [m.group(1) for m in re.finditer(r"```(?:json|JSON)?\s*\n?(.*?)```", reply or "", re.S)]
    candidates.append(reply or "")
    for text in candidates:
        for match in re.finditer(r"[\[{]", text):
            try:
                value, _ = decoder.raw_decode(text, match.start())
            except json.JSONDecodeError:
                continue
            if isinstance(value, (dict, list)):
                return value
    raise TeacherReplyError(f"no JSON object in the reply {_quote(reply)}")


def _strings(value, limit: int = 20) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise TeacherReplyError(f"expected a list of strings, got {value!r:.200}")
    return [str(v).strip()[:500] for v in value if str(v).strip()][:limit]


def parse_attribution(reply: str) -> dict:
    """{"failure_categories": [{"category", "count", "evidence": [..], "suggested_fix"}], "summary"} from
    a teacher reply (a bare list of categories is accepted too)."""
    data = extract_json(reply)
    if isinstance(data, list):
        data = {"failure_categories": data}
    cats = data.get("failure_categories", data.get("categories"))
    if not isinstance(cats, list):
        raise TeacherReplyError(f"the attribution has no 'failure_categories' list: {_quote(json.dumps(data))}")
    out = []
    for i, cat in enumerate(cats[:10]):
        if isinstance(cat, str):
            cat = {"category": cat}
        if not isinstance(cat, dict) or not str(cat.get("category", "")).strip():
            raise TeacherReplyError(f"failure_categories[{i}] needs a 'category': {cat!r:.200}")
        count = cat.get("count", 0)
        out.append({"category": str(cat["category"]).strip()[:200],
                    "count": int(count) if isinstance(count, (int, float)) and not isinstance(count, bool) else 0,
                    "evidence": _strings(cat.get("evidence"), 5),
                    "suggested_fix": str(cat.get("suggested_fix", cat.get("fix", ""))).strip()[:1000]})
    return {"failure_categories": out, "summary": str(data.get("summary", "")).strip()[:1000]}


def parse_strengths(reply: str) -> dict:
    """{"strengths": [..], "weaknesses": [..]} from a teacher reply."""
    data = extract_json(reply)
    if not isinstance(data, dict) or not ("strengths" in data or "weaknesses" in data):
        raise TeacherReplyError(f"expected an object with 'strengths' and 'weaknesses': {_quote(reply)}")
    result = {"strengths": _strings(data.get("strengths"), 8), "weaknesses": _strings(data.get("weaknesses"), 8)}
    if not result["strengths"] and not result["weaknesses"]:
        raise TeacherReplyError(f"both 'strengths' and 'weaknesses' are empty: {_quote(reply)}")
    return result


_SKILL_STRUCTURE = re.compile(r"^---[ \t]*\r?\n\s*(?:name|description)\s*:|^#{1,3}[ \t]+\S", re.M)
MAX_SKILLS = 16              # a rewrite with more skills than this is rejected (LLM output is untrusted)
MAX_SKILL_CHARS = 6000       # nor one whose skill body is longer


def parse_skillset_reply(reply: str) -> SkillSet:
    """A skill set from a teacher reply: MASA JSON (general_skills / task_specific_skills) anywhere in the
    reply, else the Markdown skill format of skills.py (`SkillSet.to_markdown` / `parse_skillset`)."""
    skills = None
    try:
        data = extract_json(reply)
        if isinstance(data, dict) and ("general_skills" in data or "task_specific_skills" in data):
            skills = SkillSet.from_json(data)
    except TeacherReplyError:
        pass
    except (ValueError, TypeError, KeyError) as e:
        raise TeacherReplyError(f"the JSON skill library in the reply is malformed: {e}") from None
    if skills is None:
        # skills.parse_skillset turns any prose into a skill; a rewrite must at least have the asked-for
        # structure (a SKILL.md front matter or a Markdown heading), else it is not a reply to the request
        if not _SKILL_STRUCTURE.search(reply or ""):
            raise TeacherReplyError(f"no skill in the asked-for format (front matter 'name:' / 'description:' "
                                    f"or a '#' heading) in the reply {_quote(reply)}")
        try:
            skills = parse_skillset(reply)
        except (SkillParseError, ValueError) as e:
            raise TeacherReplyError(str(e)) from None
    every = skills.general + [s for group in skills.task_specific.values() for s in group]
    if not every:
        raise TeacherReplyError(f"the reply holds no skill: {_quote(reply)}")
    if len(every) > MAX_SKILLS:
        raise TeacherReplyError(f"the reply holds {len(every)} skills; at most {MAX_SKILLS} are allowed")
    long = [s.name for s in every if len(s.body) > MAX_SKILL_CHARS]
    if long:
        raise TeacherReplyError(f"skill(s) {long} longer than {MAX_SKILL_CHARS} characters")
    return skills


def ask_teacher(teacher, messages: list[dict], parse: Callable[[str], Any], *, what: str, retries: int = 2,
                temperature: float = 0.7, max_tokens: int = 1024, seed: int | None = None,
                on_skip: Callable[[dict], None] | None = None):
    """Ask the teacher and parse its reply. A reply that does not parse is retried up to `retries` times
    (the retry shows the teacher its reply and what was wrong with it); after that the step is skipped:
    `on_skip` gets {"what", "attempts", "errors", "last_reply"} and None is returned."""
    conversation, errors, reply = list(messages), [], ""
    for attempt in range(retries + 1):
        result = teacher.chat(conversation, temperature=temperature, max_tokens=max_tokens,
                              seed=None if seed is None else seed + attempt)
        reply = result.texts[0] if result.texts else ""
        try:
            return parse(reply)
        except TeacherReplyError as e:
            errors.append(str(e)[:500])
            conversation = list(messages) + [
                {"role": "assistant", "content": reply[:4000]},
                {"role": "user", "content": f"That reply could not be read: {str(e)[:300]}\n"
                                            "Answer again, exactly in the format asked for, and nothing else."}]
    if on_skip is not None:
        on_skip({"what": what, "attempts": retries + 1, "errors": errors, "last_reply": reply[:1000]})
    return None


def teacher_seed(seed: int, *parts) -> int:
    """A deterministic per-step seed for teacher sampling (so that a rerun asks the same questions)."""
    return zlib.crc32(":".join(str(p) for p in (seed, *parts)).encode()) & 0x7FFFFFFF


# ----------------------------------------------------------------------------------------------------------
# Teacher prompts

TEACHER_SYSTEM = ("You are a teacher who writes skills for a specific target language model. A skill is a short "
                  "text (procedure, facts, worked example, answer format) that the target reads in its system "
                  "prompt before it works on a task. Write for THIS target: its size, context window and "
                  "weaknesses (see its model card).")

ATTRIBUTION_TASK = "Failure attribution"
GENERAL_REWRITE_TASK = "Rewrite the general skills"
TASK_REWRITE_TASK = "Rewrite the task-specific skills"
ONESHOT_TASK = "Adapt the skill library to the target model"
STRENGTHS_TASK = "Summarise the target model"

ATTRIBUTION_FORMAT = ('{"failure_categories": [{"category": "short name", "count": 2, '
                      '"evidence": ["task id: what went wrong"], "suggested_fix": "what a skill should say"}], '
                      '"summary": "one sentence"}')


def _clip(text: str, limit: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


def _failure_text(failures: list[dict], limit: int = 600) -> str:
    if not failures:
        return "(no failed episodes)"
    blocks = []
    for f in failures:
        block = [f"- task {f['task_id']} (type {f['task_type']}):", f"  task: {_clip(f['question'], limit)}"]
        if f.get("expected") is not None:
            block.append(f"  expected answer: {_clip(str(f['expected']), 200)}")
        if f.get("transcript"):
            block.append(f"  episode: {_clip(f['transcript'], limit)}")
        block.append(f"  target's reply: {_clip(f['reply'], limit)}")
        if f.get("error"):
            block.append(f"  error: {_clip(f['error'], 200)}")
        blocks.append("\n".join(block))
    return "\n".join(blocks)


def _skills_text(skills: SkillSet, limit: int = 6000) -> str:
    return _clip(skills.to_markdown(), limit) or "(no skills)"


def _unique(skills: list[Skill]) -> list[Skill]:
    """The skills with repeated names made distinct (name-2, name-3, ...): a group may not repeat a name."""
    out, taken = [], set()
    for skill in skills:
        name, k = skill.name, 2
        while name in taken:
            name = f"{skill.name[:60].rstrip('-')}-{k}"
            k += 1
        taken.add(name)
        out.append(skill if name == skill.name else replace(skill, name=name))
    return out


def _only_general(skills: SkillSet) -> SkillSet:
    return SkillSet(general=list(skills.general), task_specific={}, common_mistakes=list(skills.common_mistakes))


def _only_type(skills: SkillSet, task_type: str) -> SkillSet:
    return SkillSet(general=[], task_specific={task_type: list(skills.task_specific.get(task_type, []))},
                    common_mistakes=[])


def strengths_messages(card: ModelCard, failures: list[dict], successes: list[dict], stats: str) -> list[dict]:
    """Prompt: summarise the target's strengths and weaknesses from preliminary rollouts (JSON reply)."""
    user = (f"## Task: {STRENGTHS_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Preliminary results\n{stats}\n\n### Solved episodes\n{_failure_text(successes, 300)}\n\n"
            f"### Failed episodes\n{_failure_text(failures, 300)}\n\n"
            "List the target model's strengths and weaknesses as seen in these episodes. Reply with JSON only:\n"
            '{"strengths": ["..."], "weaknesses": ["..."]}')
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def attribution_messages(card: ModelCard, skills: SkillSet, failures: list[dict], reward: float,
                         task_type: str | None = None) -> list[dict]:
    """Prompt: a structured failure attribution (JSON) of the target's failed episodes under `skills`."""
    scope = f"tasks of type '{task_type}'" if task_type else "the task suite"
    shown = _only_type(skills, task_type) if task_type else skills
    user = (f"## Task: {ATTRIBUTION_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Skills the target used (reward R = {reward:.3f} on {scope})\n{_skills_text(shown)}\n\n"
            f"### Failed episodes\n{_failure_text(failures)}\n\n"
            "Group the failures into categories, cite evidence from the episodes and suggest for each a fix "
            f"that a skill could make. Reply with JSON only, in this form:\n{ATTRIBUTION_FORMAT}")
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def _format_help() -> str:
    example = SkillSet(general=[Skill(name="answer-format", description="How to write the final answer; use "
                                      "for every task.", body="State the final answer on the last line as "
                                      "'Answer: <answer>'.", metadata={})], task_specific={}, common_mistakes=[])
    return ("Reply with the skills only, in exactly this format (one block per skill; names are lower-case "
            "letters, digits and single hyphens):\n\n" + example.to_markdown())


def general_rewrite_messages(card: ModelCard, skills: SkillSet, reward: float, attribution: dict | None,
                             top_sets: list[tuple[SkillSet, float]]) -> list[dict]:
    """Prompt: rewrite the general skills, given the current skills, the failure attribution, the model card
    and the top skill sets (by reward) of the whole history."""
    history = "\n\n".join(f"#### Set {i + 1}: R = {r:.3f}\n{_skills_text(_only_general(s), 2000)}"
                          for i, (s, r) in enumerate(top_sets)) or "(none yet)"
    user = (f"## Task: {GENERAL_REWRITE_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Current general skills (R = {reward:.3f})\n{_skills_text(_only_general(skills))}\n\n"
            f"### Why the current skills failed (attribution)\n{json.dumps(attribution or {}, ensure_ascii=False)}\n\n"
            f"### Best skill sets so far\n{history}\n\n"
            "Write improved GENERAL skills (they apply to every task type) that fix these failures for this "
            f"target model. Keep what worked in the best sets. {_format_help()}")
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def task_rewrite_messages(card: ModelCard, skills: SkillSet, task_type: str, reward: float,
                          attribution: dict | None, examples: list[str]) -> list[dict]:
    """Prompt: rewrite the task-specific skills of one task type (the general skills are shown, fixed)."""
    shown_examples = "\n".join(f"- {_clip(e, 300)}" for e in examples) or "(none)"
    user = (f"## Task: {TASK_REWRITE_TASK} of type '{task_type}'\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### General skills (fixed, shown for context)\n{_skills_text(_only_general(skills), 3000)}\n\n"
            f"### Current skills for '{task_type}' (R = {reward:.3f})\n{_skills_text(_only_type(skills, task_type))}\n\n"
            f"### Example tasks of this type\n{shown_examples}\n\n"
            f"### Why the current skills failed (attribution)\n{json.dumps(attribution or {}, ensure_ascii=False)}\n\n"
            f"Write improved skills for tasks of type '{task_type}' only, for this target model. {_format_help()}")
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def oneshot_messages(card: ModelCard, skills: SkillSet, task_description: str) -> list[dict]:
    """Prompt: adapt a whole skill library to the target in one shot (no rollouts; the DS-Adapter baseline)."""
    user = (f"## Task: {ONESHOT_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Tasks\n{_clip(task_description, 2000)}\n\n### Skill library\n{_skills_text(skills)}\n\n"
            "Rewrite the whole library (general skills and the skills of each task type) so that this target "
            "model can use it well. Reply with JSON only: "
            '{"general_skills": [{"name": "...", "description": "...", "body": "..."}], '
            '"task_specific_skills": {"<task type>": [{"name": "...", "description": "...", "body": "..."}]}, '
            '"common_mistakes": ["..."]}')
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def one_shot_rewrite(teacher, card: ModelCard, skills: SkillSet, task_description: str, *, retries: int = 2,
                     temperature: float = 0.7, max_tokens: int = 1536, seed: int | None = 0,
                     on_skip: Callable[[dict], None] | None = None) -> SkillSet | None:
    """The teacher adapts `skills` to the target from the model card alone, in one call (no search). Task
    types the reply leaves out keep their input skills. None when the reply never parsed. `card` may be a
    ModelCard or a dict (read leniently)."""
    card = as_model_card(card)
    new = ask_teacher(teacher, oneshot_messages(card, skills, task_description), parse_skillset_reply,
                      what="one-shot rewrite", retries=retries, temperature=temperature, max_tokens=max_tokens,
                      seed=seed, on_skip=on_skip)
    if new is None:
        return None
    task_specific = {t: list(v) for t, v in skills.task_specific.items()}
    task_specific.update({t: list(v) for t, v in new.task_specific.items() if v})
    return SkillSet(general=list(new.general) or list(skills.general), task_specific=task_specific,
                    common_mistakes=list(new.common_mistakes) or list(skills.common_mistakes))


# ----------------------------------------------------------------------------------------------------------
# Hill climbing (generic: payloads are whatever propose/evaluate understand; MASA uses candidate ids)

@dataclass
class HillClimbState:
    """Progress of a hill climb; JSON-able when the payloads are. `stale` counts consecutive iterations
    without a strict improvement; the climb stops when it reaches `patience`."""
    best: Any = None
    best_reward: float = -math.inf
    iteration: int = 0
    stale: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "HillClimbState":
        return cls(**data)


def hill_climb(state: HillClimbState, propose: Callable[[HillClimbState], Any], evaluate: Callable[[Any], float],
               iterations: int, patience: int,
               on_iteration: Callable[[HillClimbState, Any, float | None, bool], None] | None = None,
               max_reward: float = math.inf) -> HillClimbState:
    """Run the climb from `state` (best already evaluated) until `iterations` are done, `patience`
    consecutive iterations failed to improve, or best_reward reaches `max_reward` (nothing can beat it).

    propose(state) -> a candidate, or None (the teacher's reply was skipped: a non-improving iteration).
    A candidate is accepted only if evaluate(candidate) > state.best_reward (strictly).
    on_iteration(state, candidate, reward, accepted) runs after each iteration (logs, checkpoints)."""
    if iterations < 0 or patience < 1:
        raise ValueError(f"hill_climb: need iterations >= 0 and patience >= 1, got {iterations}, {patience}")
    while state.iteration < iterations and state.stale < patience and state.best_reward < max_reward:
        candidate = propose(state)
        reward = None if candidate is None else float(evaluate(candidate))
        accepted = reward is not None and reward > state.best_reward
        if accepted:
            state.best, state.best_reward, state.stale = candidate, reward, 0
        else:
            state.stale += 1
        state.iteration += 1
        if on_iteration is not None:
            on_iteration(state, candidate, reward, accepted)
    return state


# ----------------------------------------------------------------------------------------------------------
# The search

@dataclass
class MasaConfig:
    lam_nh: float = 0.0            # λ of R = SR − λ·NHR
    iterations: int = 10           # I: hill-climbing iterations on the general skills
    patience: int = 3              # p: stop after this many iterations without a strict improvement
    tree_iterations: int = 10      # J: UCB1 iterations per task type
    episodes: int = 8              # N: episodes (tasks of the type) per tree-node evaluation
    c: float = 1.4                 # UCB1 exploration constant
    max_children: int = 3          # rewrites a tree node gets before the search descends (ucb.select)
    seed: int = 0
    teacher_retries: int = 2
    teacher_temperature: float = 0.7
    teacher_max_tokens: int = 1024
    target_temperature: float = 0.0
    target_max_tokens: int = 256
    max_failures: int = 6          # failed episodes shown to the teacher per attribution
    skill_max_tokens: int = 1024   # token budget of the rendered skills in the target's system prompt

    @classmethod
    def from_json(cls, data: dict) -> "MasaConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def rollouts(target, tasks: list, skills: SkillSet | None, config: MasaConfig, budget: CallBudget | None = None):
    """One greedy (by default) rollout per task under `skills`. Raises BudgetExhausted when the budget refused
    any of the calls (a partly refused rollout is not a measurement); calls answered by the cache are free."""
    refusals = budget.refusals if budget is not None else 0
    trajectories = run_rollouts(target, tasks, skills, n=1, temperature=config.target_temperature,
                                max_tokens=config.target_max_tokens, seed=config.seed,
                                skill_max_tokens=config.skill_max_tokens)
    if budget is not None and budget.refusals > refusals:
        raise BudgetExhausted(f"call budget spent ({budget.spent} of {budget.max_calls} calls)")
    return trajectories


def failure_records(tasks, trajectories, limit: int) -> list[dict]:
    """Up to `limit` failed trajectories as short records for the teacher, taken round-robin over task
    types so that every type is represented."""
    by_id = {t.id: t for t in tasks}
    by_type: dict[str, list] = {}
    for traj in trajectories:
        if not traj.success:
            by_type.setdefault(traj.task_type, []).append(traj)
    chosen, queues = [], [list(v) for _, v in sorted(by_type.items())]
    while len(chosen) < limit and any(queues):
        for queue in queues:
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    return [episode_record(by_id.get(traj.task_id), traj) for traj in chosen]


def episode_record(task, traj) -> dict:
    transcript = ""
    if traj.actions:
        steps = [f"> {a} -> {o}" for a, o in zip(traj.actions, traj.observations[1:])]
        transcript = _clip((traj.observations[0] if traj.observations else "") + "\n" + "\n".join(steps[-8:]), 1500)
    return {"task_id": traj.task_id, "task_type": traj.task_type,
            "question": _clip(getattr(task, "question", "") if task is not None else "", 1500),
            "expected": getattr(task, "answer", None) if task is not None else None,
            "reply": _clip(traj.reply, 800), "transcript": transcript, "error": traj.error,
            "steps": traj.steps, "nothing_happens": traj.nothing_happens}


def _metrics(summary: dict) -> dict:
    keep = ("n", "success_rate", "nhr", "adjusted_reward", "mean_steps", "errors")
    return {**{k: summary[k] for k in keep},
            "per_type": {t: {k: s[k] for k in keep} for t, s in summary["per_type"].items()}}


class MasaSearch:
    """Stage 1 for one target: hill climbing on the general skills, then one UCB1 tree per task type.

    All progress lives in `state` (JSON-able): `candidates` (every skill set evaluated: id, phase,
    task_type, parent, iteration, tree node, skills, reward, metrics, attribution, accepted, failures),
    `general` (the hill climb), `trees` (per type: the ucb tree as a dict, iterations done), `events`
    (skipped teacher replies, budget stop). `checkpoint(state)` is called after every iteration, so a run
    restarted with the saved state continues where it stopped. Model calls go through the given clients
    (CachingClient for the budget and cache); BudgetExhausted propagates to the caller, who keeps the
    last checkpointed state (`last_checkpoint`)."""

    def __init__(self, target, teacher, card: ModelCard, tasks: list, base_skills: SkillSet,
                 config: MasaConfig, state: dict | None = None, log: Callable[[str], None] | None = None,
                 checkpoint: Callable[[dict], None] | None = None, budget: CallBudget | None = None):
        if not tasks:
            raise ValueError("MasaSearch: no search tasks")
        self.target, self.teacher, self.card, self.tasks, self.config = target, teacher, card, tasks, config
        self.base_skills, self.budget = base_skills, budget
        self.log = log or (lambda line: None)
        self._checkpoint_fn = checkpoint
        self.types = sorted({t.type for t in tasks})
        self.state = state if state is not None else {"candidates": [], "general": None, "trees": {},
                                                      "events": [], "phase": "general"}
        self.last_checkpoint = copy.deepcopy(self.state)

    # ---- bookkeeping ------------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        self.last_checkpoint = copy.deepcopy(self.state)
        if self._checkpoint_fn is not None:
            self._checkpoint_fn(self.state)

    def calls(self) -> int:
        return self.budget.spent if self.budget is not None else 0

    def candidate(self, cid: int) -> dict:
        return self.state["candidates"][cid]

    def skills_of(self, cid: int) -> SkillSet:
        return SkillSet.from_json(self.candidate(cid)["skills"])

    def _skip(self, event: dict) -> None:
        event = {"event": "teacher_skip", "phase": self.state["phase"], **event}
        self.state["events"].append(event)
        self.log(f"  teacher reply skipped ({event['what']}): {event['attempts']} attempts did not parse; "
                 f"last error: {event['errors'][-1][:160] if event['errors'] else '?'}")

    def _ask(self, messages, parse, what: str, *seed_parts):
        c = self.config
        return ask_teacher(self.teacher, messages, parse, what=what, retries=c.teacher_retries,
                           temperature=c.teacher_temperature, max_tokens=c.teacher_max_tokens,
                           seed=teacher_seed(c.seed, what, *seed_parts), on_skip=self._skip)

    # ---- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, skills: SkillSet, tasks: list) -> tuple[dict, list[dict]]:
        """Roll the target out on `tasks` under `skills`; (metrics with adjusted_reward R, failure records)."""
        c = self.config
        trajectories = rollouts(self.target, tasks, skills, c, self.budget)
        summary = summarize(trajectories, lam_nh=c.lam_nh)
        metrics = _metrics(summary)
        metrics["adjusted_reward"] = adjusted_reward(summary["success_rate"], summary["nhr"], c.lam_nh)
        return metrics, failure_records(tasks, trajectories, c.max_failures)

    def add_candidate(self, skills: SkillSet, phase: str, parent: int | None, iteration: int,
                      task_type: str | None = None, attribution: dict | None = None) -> int:
        cid = len(self.state["candidates"])
        self.state["candidates"].append({"id": cid, "phase": phase, "task_type": task_type, "parent": parent,
                                         "iteration": iteration, "node": None, "skills": skills.to_json(),
                                         "reward": None, "metrics": None, "attribution": attribution,
                                         "accepted": None, "failures": []})
        return cid

    def evaluate_candidate(self, cid: int, tasks: list) -> float:
        metrics, failures = self.evaluate(self.skills_of(cid), tasks)
        record = self.candidate(cid)
        record.update(reward=metrics["adjusted_reward"], metrics=metrics, failures=failures)
        return record["reward"]

    def type_tasks(self, task_type: str) -> list:
        return [t for t in self.tasks if t.type == task_type][:self.config.episodes]

    # ---- run --------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Both phases, from wherever `state` stands. Raises BudgetExhausted when the budget runs out."""
        if self.state["phase"] == "general":
            self._general_phase()
            self.state["phase"] = "trees"
            self.checkpoint()
        if self.state["phase"] == "trees":
            for task_type in self.types:
                self._tree_phase(task_type)
            self.state["phase"] = "done"
            self.checkpoint()

    def _general_phase(self) -> None:
        c = self.config
        if self.state["general"] is None:
            cid = self.add_candidate(self.base_skills, "base", None, 0)
            reward = self.evaluate_candidate(cid, self.tasks)
            self.candidate(cid)["accepted"] = True
            self.state["general"] = HillClimbState(best=cid, best_reward=reward).to_json()
            self.log(f"[general] base skills: R = {reward:.3f} on {len(self.tasks)} tasks  calls {self.calls()}")
            self.checkpoint()
        climb = HillClimbState.from_json(self.state["general"])

        def propose(climb: HillClimbState):
            best = self.candidate(climb.best)
            it = climb.iteration + 1
            attribution = self._ask(attribution_messages(self.card, self.skills_of(climb.best), best["failures"],
                                                         best["reward"]), parse_attribution, "attribution", it)
            history = sorted((x for x in self.state["candidates"]
                              if x["phase"] in ("base", "general") and x["reward"] is not None),
                             key=lambda x: (-x["reward"], x["id"]))[:5]
            messages = general_rewrite_messages(self.card, self.skills_of(climb.best), best["reward"], attribution,
                                                [(SkillSet.from_json(x["skills"]), x["reward"]) for x in history])
            new = self._ask(messages, parse_skillset_reply, "general rewrite", it)
            if new is None:
                return None
            current = self.skills_of(climb.best)
            general = _unique(new.general or [s for group in new.task_specific.values() for s in group])
            skills = SkillSet(general=general, task_specific=current.task_specific,
                              common_mistakes=new.common_mistakes or current.common_mistakes)
            return self.add_candidate(skills, "general", climb.best, it, attribution=attribution)

        def evaluate(cid: int) -> float:
            return self.evaluate_candidate(cid, self.tasks)

        def on_iteration(climb: HillClimbState, cid, reward, accepted) -> None:
            if cid is not None:
                self.candidate(cid)["accepted"] = accepted
            self.state["general"] = climb.to_json()
            verdict = "skipped" if cid is None else f"R = {reward:.3f} {'accepted' if accepted else 'rejected'}"
            self.log(f"[general] iteration {climb.iteration}/{c.iterations}: candidate {verdict}; "
                     f"best R = {climb.best_reward:.3f}; calls {self.calls()}")
            self.checkpoint()

        hill_climb(climb, propose, evaluate, c.iterations, c.patience, on_iteration, max_reward=1.0)

    def _tree_phase(self, task_type: str) -> None:
        c = self.config
        tree = self.state["trees"].get(task_type)
        tasks = self.type_tasks(task_type)
        best_general = self.state["general"]["best"]
        if tree is None:
            cid = self.add_candidate(self.skills_of(best_general), "tree", best_general, 0, task_type)
            self.candidate(cid)["node"] = "0"
            root = ucb.Node(payload=cid)
            reward = self.evaluate_candidate(cid, tasks)
            root.reward = reward
            ucb.backpropagate(root, reward)
            tree = self.state["trees"][task_type] = {"root": ucb.to_dict(root), "iterations": 0}
            self.log(f"[tree {task_type}] root: R = {reward:.3f} on {len(tasks)} episodes  calls {self.calls()}")
            self.checkpoint()
        root = ucb.from_dict(tree["root"])

        def expand_fn(node: ucb.Node):
            parent = self.candidate(node.payload)
            it = tree["iterations"] + 1
            attribution = self._ask(attribution_messages(self.card, self.skills_of(node.payload), parent["failures"],
                                                         parent["reward"], task_type),
                                    parse_attribution, "attribution", task_type, it)
            examples = [t.question for t in tasks[:3]]
            messages = task_rewrite_messages(self.card, self.skills_of(node.payload), task_type, parent["reward"],
                                             attribution, examples)
            new = self._ask(messages, parse_skillset_reply, "task rewrite", task_type, it)
            if new is None:
                return None
            rewritten = new.task_specific.get(task_type) or _unique(new.general + [
                s for t, group in new.task_specific.items() if t != task_type for s in group])
            current = self.skills_of(node.payload)
            skills = SkillSet(general=current.general, task_specific={**current.task_specific, task_type: rewritten},
                              common_mistakes=current.common_mistakes)
            cid = self.add_candidate(skills, "tree", node.payload, it, task_type, attribution)
            self.candidate(cid)["node"] = f"{node.id}.{len(node.children)}"  # the id ucb.expand will give it
            return cid

        def evaluate_fn(node: ucb.Node) -> float:
            return self.evaluate_candidate(node.payload, tasks)

        def on_iteration(i: int, selected, child, root) -> None:
            tree["iterations"] += 1
            tree["root"] = ucb.to_dict(root)
            best = ucb.best_node(root)
            verdict = "skipped" if child is None else f"R = {child.reward:.3f}"
            self.log(f"[tree {task_type}] iteration {tree['iterations']}/{c.tree_iterations}: expanded node "
                     f"{selected.id}, child {verdict}; best R = {best.reward:.3f}; calls {self.calls()}")
            self.checkpoint()

        while tree["iterations"] < c.tree_iterations and ucb.best_node(root).reward < 1.0:
            # one iteration per call, so that a perfect node ends the tree early (nothing can beat it)
            ucb.search(root, expand_fn, evaluate_fn, 1, c=c.c, max_children=c.max_children,
                       on_iteration=on_iteration)

    # ---- results ----------------------------------------------------------------------------------------
    def best_general(self) -> int:
        return self.state["general"]["best"]

    def best_per_type(self) -> dict[str, int]:
        """Candidate id of the best node of each task type's tree (types without a tree are left out)."""
        out = {}
        for task_type, tree in self.state["trees"].items():
            best = ucb.best_node(ucb.from_dict(tree["root"]))
            if best is not None:
                out[task_type] = best.payload
        return out

    def library(self) -> SkillSet:
        """The evolved library: the best general skills, and each type's skills from its tree's best node."""
        if self.state.get("general") is None:
            return self.base_skills
        best = self.skills_of(self.best_general())
        task_specific = dict(best.task_specific)
        for task_type, cid in self.best_per_type().items():
            task_specific[task_type] = self.skills_of(cid).task_specific.get(task_type, [])
        return SkillSet(general=best.general, task_specific=task_specific, common_mistakes=best.common_mistakes)


def search_log(state: dict) -> list[dict]:
    """The search log: every candidate (reward, parent, phase, tree node, teacher attribution, accepted,
    metrics) in creation order, then the events (teacher skips, budget stop)."""
    out = []
    for x in state.get("candidates", []):
        out.append({"kind": "candidate", **{k: x[k] for k in ("id", "phase", "task_type", "parent", "iteration",
                                                                "node", "reward", "accepted", "attribution",
                                                                "metrics", "skills")}})
    out.extend({"kind": "event", **e} for e in state.get("events", []))
    return out


# ----------------------------------------------------------------------------------------------------------
# Augmentations of a skill set (S_in sources of the rewriter's SFT data)

_SENTENCE = re.compile(r"((?<=[.!?])[ \t]+|\n+)")

FILLER = ["It is important to read every part of the task carefully before doing anything else.",
          "Always keep in mind the overall goal and make sure each step moves toward it.",
          "Take your time, think about the problem in a structured way, and double-check your work.",
          "Remember that clarity and correctness are more important than speed in all situations.",
          "Consider the context of the task and any information that has been provided to you.",
          "When in doubt, go back to the instructions and make sure you follow them closely."]


def _map_bodies(skills: SkillSet, fn: Callable[[str], str]) -> SkillSet:
    return SkillSet(general=[replace(s, body=fn(s.body)) for s in skills.general],
                    task_specific={t: [replace(s, body=fn(s.body)) for s in group]
                                   for t, group in skills.task_specific.items()},
                    common_mistakes=list(skills.common_mistakes))


def augment_noise(skills: SkillSet, rng: random.Random, p: float = 0.3) -> SkillSet:
    """Each sentence of each skill body is, with probability p, perturbed (two adjacent words swapped),
    dropped, or swapped with another sentence of the body."""
    def noisy(body: str) -> str:
        pieces = _SENTENCE.split(body)               # sentence, separator, sentence, ...
        sentences, separators = pieces[0::2], pieces[1::2] + [""]
        out = list(sentences)
        for i in range(len(sentences)):
            if not sentences[i].strip() or rng.random() >= p:
                continue
            kind = rng.choice(("perturb", "drop", "shuffle"))
            if kind == "perturb":
                words = out[i].split()
                if len(words) > 1:
                    j = rng.randrange(len(words) - 1)
                    words[j], words[j + 1] = words[j + 1], words[j]
                out[i] = " ".join(words)
            elif kind == "drop":
                out[i] = ""
            else:
                j = rng.randrange(len(out))
                out[i], out[j] = out[j], out[i]
        text = "".join(s + sep for s, sep in zip(out, separators) if s.strip()).strip()
        return text or body                          # never an empty skill
    return _map_bodies(skills, noisy)


def augment_partial(skills: SkillSet, rng: random.Random, keep: float = 0.6) -> SkillSet:
    """Keep round(keep · n) of the n skills (at least one), chosen at random, in their order."""
    slots = [("general", None, i) for i in range(len(skills.general))]
    slots += [("type", t, i) for t, group in skills.task_specific.items() for i in range(len(group))]
    if not slots:
        return skills
    kept = set(rng.sample(range(len(slots)), max(1, round(keep * len(slots)))))
    chosen = [slots[i] for i in sorted(kept)]
    general = [skills.general[i] for kind, _, i in chosen if kind == "general"]
    task_specific: dict[str, list[Skill]] = {}
    for kind, t, i in chosen:
        if kind == "type":
            task_specific.setdefault(t, []).append(skills.task_specific[t][i])
    return SkillSet(general=general, task_specific=task_specific, common_mistakes=list(skills.common_mistakes))


def augment_verbose(skills: SkillSet, rng: random.Random, sentences: int = 3) -> SkillSet:
    """Pad each skill body with generic filler sentences (they carry no information) at random places."""
    def verbose(body: str) -> str:
        lines = body.split("\n")
        for sentence in rng.sample(FILLER, min(sentences, len(FILLER))):
            lines.insert(rng.randrange(len(lines) + 1), sentence)
        return "\n".join(lines)
    return _map_bodies(skills, verbose)


# ----------------------------------------------------------------------------------------------------------
# Rewriter SFT records

SFT_SOURCES = ("early", "middle", "late", "teacher_oneshot", "noise", "partial", "verbose", "other_backbone")


def sft_record(card: ModelCard, skills_in: SkillSet, task_description: str, skills_out: SkillSet, source: str,
               target_model: str, reward_out: float) -> dict:
    if source not in SFT_SOURCES:
        raise ValueError(f"sft_record: unknown source {source!r}; use one of {SFT_SOURCES}")
    return {"model_card": card.to_json(), "skills_in": skills_in.to_json(), "task_description": task_description,
            "skills_out": skills_out.to_json(), "source": source, "target_model": target_model,
            "reward_out": float(reward_out)}


def sft_records(state: dict, card: ModelCard, task_description: str, best: SkillSet, reward_out: float,
                target_model: str, oneshot: SkillSet | None = None, seed: int = 0, copies: int = 1) -> list[dict]:
    """Records (model card, S_in, task description) -> S_out = `best` (the top-scoring set of the search).

    S_in: one evaluated search intermediate from each third of the search's history (early, middle, late;
    sets equal to the best are left out), the one-shot teacher rewrite when given, and `copies`
    augmentations each of the best set (noise 0.3, partial keep 0.6, verbose)."""
    rng = random.Random(seed)
    best_json = json.dumps(best.to_json(), sort_keys=True)
    intermediates = [x for x in state.get("candidates", []) if x["reward"] is not None
                     and json.dumps(x["skills"], sort_keys=True) != best_json]
    records = []
    if intermediates:
        thirds = [intermediates[i * len(intermediates) // 3:(i + 1) * len(intermediates) // 3] for i in range(3)]
        for source, part in zip(("early", "middle", "late"), thirds):
            if part:
                x = rng.choice(part)
                records.append(sft_record(card, SkillSet.from_json(x["skills"]), task_description, best, source,
                                          target_model, reward_out))
    if oneshot is not None:
        records.append(sft_record(card, oneshot, task_description, best, "teacher_oneshot", target_model, reward_out))
    for _ in range(copies):
        records.append(sft_record(card, augment_noise(best, rng, 0.3), task_description, best, "noise",
                                  target_model, reward_out))
        records.append(sft_record(card, augment_partial(best, rng, 0.6), task_description, best, "partial",
                                  target_model, reward_out))
        records.append(sft_record(card, augment_verbose(best, rng), task_description, best, "verbose",
                                  target_model, reward_out))
    return records


def check_sft_record(record: dict, where: str = "record") -> None:
    """Raise ValueError naming the problem if `record` is not a well-formed rewriter SFT record."""
    need = {"model_card": dict, "skills_in": dict, "task_description": str, "skills_out": dict, "source": str,
            "target_model": str, "reward_out": (int, float)}
    for key, kind in need.items():
        if key not in record:
            raise ValueError(f"{where}: lacks field {key!r}")
        if not isinstance(record[key], kind):
            raise ValueError(f"{where}: field {key!r} has type {type(record[key]).__name__}")
    if record["source"] not in SFT_SOURCES:
        raise ValueError(f"{where}: unknown source {record['source']!r}")
    ModelCard.from_json(record["model_card"], where=f"{where}.model_card")
    for key in ("skills_in", "skills_out"):
        try:
            SkillSet.from_json(record[key])
        except Exception as e:
            raise ValueError(f"{where}.{key}: not a MASA skill library ({e})") from None


def merge_sft_runs(run_dirs: list) -> list[dict]:
    """The SFT records of several evolve_masa.py runs (each folder holds sft.jsonl and run.json), plus, for
    every ordered pair of runs on different target models A != B, a record that adapts B's best set to A
    (source "other_backbone": model card, task description and S_out of A; S_in = B's best)."""
    runs = []
    for folder in map(Path, run_dirs):
        for name in ("sft.jsonl", "run.json"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"merge: {folder} has no {name} (is it an evolve_masa.py output folder?)")
        info = json.loads((folder / "run.json").read_text(encoding="utf-8-sig"))
        runs.append((folder, info, [record for _, record in read_jsonl(folder / "sft.jsonl")]))
    records = [r for _, _, recs in runs for r in recs]
    for a_dir, a, _ in runs:
        for b_dir, b, _ in runs:
            if a["target_model"] == b["target_model"]:
                continue
            records.append(sft_record(ModelCard.from_json(a["model_card"], where=f"{a_dir}/run.json"),
                                      SkillSet.from_json(b["best_skills"]), a["task_description"],
                                      SkillSet.from_json(a["best_skills"]), "other_backbone", a["target_model"],
                                      a["reward_out"]))
    return records


def summarize_model(teacher, card: ModelCard, target, tasks: list, config: MasaConfig,
                    on_skip: Callable[[dict], None] | None = None, skills: SkillSet | None = None,
                    budget: CallBudget | None = None) -> ModelCard:
    """Fill the card's strengths and weaknesses: roll the target out on `tasks` (preliminary tasks, kept
    apart from search and evaluation) and let the teacher summarise what it saw. Unchanged if skipped."""
    trajectories = rollouts(target, tasks, skills, config, budget)
    summary = summarize(trajectories, lam_nh=config.lam_nh)
    stats = "; ".join(f"{t}: {s['success_rate']:.2f} solved of {s['n']}" for t, s in summary["per_type"].items())
    by_id = {t.id: t for t in tasks}
    successes = [episode_record(by_id.get(tr.task_id), tr) for tr in trajectories if tr.success][:3]
    failures = failure_records(tasks, trajectories, config.max_failures)
    result = ask_teacher(teacher, strengths_messages(card, failures, successes, stats), parse_strengths,
                         what="model summary", retries=config.teacher_retries, temperature=config.teacher_temperature,
                         max_tokens=config.teacher_max_tokens, seed=teacher_seed(config.seed, "summary"),
                         on_skip=on_skip)
    if result is None:
        return card
    return replace(card, strengths=result["strengths"] or card.strengths,
                   weaknesses=result["weaknesses"] or card.weaknesses)


def suite_description(tasks: list, name: str) -> str:
    """A short description of a task suite for prompts and SFT records: its types with one example each."""
    types = sorted({t.type for t in tasks})
    lines = [f"Suite '{name}': {'multi-turn' if any(t.multi_turn for t in tasks) else 'single-turn'} tasks of "
             f"{len(types)} type(s): {', '.join(types)}."]
    for task_type in types:
        example = next(t for t in tasks if t.type == task_type)
        lines.append(f"- {task_type}, e.g.: {_clip(example.question, 200)}")
    return "\n".join(lines)
