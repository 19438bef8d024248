"""MASA stage 2: the rewriter's records as SFT chats: the record format, its reader and its
tokenisation.

MASA stage 2 teaches a small LM to map (model card of a target model, input skill set S_in, task
description d) to the skill set S*_F that the stage-1 search found best for that target. One
record (a JSON object of the stage-1 JSONL) becomes one chat:

    system     REWRITER_SYSTEM_PROMPT (what the rewriter does and the reply format)
    user       the model card (JSON of its known fields), the task description, S_in (MASA JSON)
    assistant  S*_F as MASA JSON text: {"general_skills": [...], "task_specific_skills": {...},
               "common_mistakes": [...]}, serialised by `skills_to_text` (json.dumps, indent=1)

`encode_records` tokenises the chats with minskill.sft.encode_chat; the loss, the training loop,
checkpoints and resume are minskill.sft's (rewrite.py train calls minskill.sft.train_sft on these
examples).

Bad data never crashes a run: malformed JSONL lines are reported as `file:line: reason` and skipped;
records longer than max_length are skipped (or truncated, keeping the head) and counted.

This module imports minskill.sft (the chats' tokenisation), minskill.files (the depth limit's
message) and minskill.serve.client (the lone-surrogate check).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

from minskill.files import TOO_DEEP
from minskill.nn.tokenizer import Tokenizer
from minskill.serve.client import lone_surrogate_at
from minskill.sft import Example, encode_chat, end_of_turn_id

REWRITER_SYSTEM_PROMPT = (
    "You are a skill rewriter. You adapt an agent's skill library to one specific target model, "
    "described by its model card, for the given task. Keep what this model can use, drop what it "
    "cannot, and add what its weaknesses call for. Reply with only the rewritten skill set as JSON "
    'with the keys "general_skills", "task_specific_skills" and "common_mistakes".'
)

# A record is one JSON object per line; these fields are required, with these JSON types.
RECORD_FIELDS = {"model_card": dict, "skills_in": dict, "task_description": str, "skills_out": dict}


# ----------------------------------------------------------------------------- records -> chats

def skills_to_text(skillset: dict) -> str:
    """The text form of a MASA JSON skill set, used both as prompt input and as the training
    target."""
    return json.dumps(skillset, ensure_ascii=False, indent=1)


def card_to_text(model_card: dict) -> str:
    """The model card as JSON, leaving out fields with no known value (None, "", "unknown", [],
    {})."""
    known = {k: v for k, v in model_card.items() if v not in (None, "", "unknown", [], {})}
    return json.dumps(known, ensure_ascii=False, indent=1)


def prompt_messages(model_card: dict, skills_in: dict | str, task_description: str) -> list[dict]:
    """System + user messages asking the rewriter to adapt `skills_in` to the model of
    `model_card`."""
    skills = skills_in if isinstance(skills_in, str) else skills_to_text(skills_in)
    user = (f"Target model card:\n{card_to_text(model_card)}\n\n"
            f"Task description:\n{task_description.strip()}\n\n"
            f"Input skill set:\n{skills}")
    return [{"role": "system", "content": REWRITER_SYSTEM_PROMPT},
            {"role": "user", "content": user}]


def record_messages(record: dict) -> tuple[list[dict], str]:
    """(prompt messages, assistant target text) of one SFT record."""
    prompt = prompt_messages(record["model_card"], record["skills_in"], record["task_description"])
    return prompt, skills_to_text(record["skills_out"])


def sft_record_problem(record) -> str | None:
    """None if `record` is a usable SFT record, else a short reason."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for name, kind in RECORD_FIELDS.items():
        if name not in record:
            return f"missing field {name!r}"
        if not isinstance(record[name], kind):
            return f"field {name!r} must be a JSON {'object' if kind is dict else 'string'}, " \
                   f"got {type(record[name]).__name__}"
    if not record["task_description"].strip():
        return "field 'task_description' is empty"
    # a lone surrogate: no tokenizer takes it, so the run would die later
    if (where := lone_surrogate_at(record)) is not None:
        return (f"{where} is not Unicode text (a lone surrogate: a \\ud800-\\udfff escape "
                f"without its pair)")
    return None


def read_records(paths: Iterable[str | os.PathLike], warn: Callable[[str], None] = print
                 ) -> tuple[list[dict], list[str]]:
    """Read SFT records from JSONL files. Returns (records, problems).

    Files are UTF-8 (a byte order mark is allowed); lines end at LF only (JSON text may hold
    U+2028). Every malformed line (not UTF-8, bad JSON, not an object, missing or mistyped field, a
    string with a lone surrogate) is reported through `warn` as "path:line: skipped: reason" and
    skipped. Blank lines are ignored. A missing file is an error."""
    records, problems = [], []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SFT data file not found: {path}")
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
        for line_number, raw in enumerate(data.split(b"\n"), start=1):
            try:
                line = raw.decode("utf-8")  # strict: a replaced byte would train on corrupted text
                if not line.strip():
                    continue
                record = json.loads(line)
            except UnicodeDecodeError as e:
                reason = f"not UTF-8 ({e.reason} at byte {e.start + 1} of the line)"
            except json.JSONDecodeError as e:
                reason = f"invalid JSON ({e.msg} at column {e.colno})"
            except RecursionError:
                reason = TOO_DEEP
            else:
                reason = sft_record_problem(record)
            if reason is not None:
                problems.append(f"{path}:{line_number}: skipped: {reason}")
                warn(problems[-1])
                continue
            records.append(record)
    return records, problems


# ----------------------------------------------------------------------------- records -> examples

def encode_records(tokenizer: Tokenizer, records: list[dict], max_length: int = 4096,
                   too_long: str = "skip") -> tuple[list[Example], dict]:
    """Tokenise records. Returns (examples, counts) with counts {"kept", "truncated",
    "skipped_too_long"}."""
    eot_id = end_of_turn_id(tokenizer)
    examples, counts = [], {"kept": 0, "truncated": 0, "skipped_too_long": 0}
    for record in records:
        prompt, target = record_messages(record)
        example = encode_chat(tokenizer, prompt, target, max_length, too_long, eot_id)
        if example is None:
            counts["skipped_too_long"] += 1
            continue
        counts["kept"] += 1
        counts["truncated"] += int(example.truncated)
        examples.append(example)
    return examples, counts
