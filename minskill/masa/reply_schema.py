"""The JSON schema a MASA teacher's reply is asked in (--teacher-json-schema).

A server that serves response_format json_schema (minskill's own, vLLM) writes only what the
schema allows, so a reply asked for in the schema of its reader (minskill/masa/teacher.py's
READER_SCHEMAS) parses. Under --teacher-json-schema auto (the default) or on, each teacher call
asks for it (`SchemaTeacher`); a server that refuses the field (HTTP 400 naming it:
`is_schema_refusal`) is asked again without it; under auto its client is then asked in free text,
read as before, for the rest of the run (said once on stderr); under on the refusal is an error;
off never asks.

Each schema has its reader's shape, every property required and no other (OpenAI's strict mode
asks both), and bounds on its lists (maxItems) and strings (maxLength, scaled by `fitted`) that
let its longest reply close within the teacher's max_tokens.
"""
from __future__ import annotations

import re
import sys
import weakref
from typing import Callable

from minskill.cli import TEACHER_JSON_SCHEMA
from minskill.serve.client import ChatError

# teacher.parse_skillset_reply's bounds, which the skill-set schema keeps (LLM output is untrusted)
MAX_SKILLS = 16              # a rewrite with more skills than this is rejected
MAX_SKILL_CHARS = 6000       # nor one whose skill body is longer

SCHEMA_MODES = TEACHER_JSON_SCHEMA   # --teacher-json-schema: auto, on, off
# a refusal of the field: minskill's server ("'response_format': the model ... cannot constrain"),
# OpenAI's ("Invalid schema for response_format ..."), a server that takes no field it does not know
SCHEMA_REFUSAL = re.compile(r"response_format|json_schema|structured.outputs?\b", re.I)
_REFUSED = weakref.WeakSet()   # teacher clients whose server refused it: free text from then on


def asks_json(teacher, mode: str) -> bool:
    """Whether `teacher` is asked for its replies' JSON schemas under --teacher-json-schema `mode`:
    always when on; when auto (the default), until its server refused one; never when off."""
    if mode not in SCHEMA_MODES:
        raise ValueError(f"--teacher-json-schema must be one of {', '.join(SCHEMA_MODES)}, "
                         f"got {mode!r}")
    return mode == "on" or (mode == "auto" and teacher not in _REFUSED)


def json_schema_format(what: str, schema: Callable[[int], dict] | None, max_tokens: int):
    """The response_format of a step's reply: schema(max_tokens) as OpenAI's json_schema (None: no
    schema)."""
    if schema is None:
        return None
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", f"teacher_{what}")[:64]   # (OpenAI's rule for the name)
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": schema(max_tokens), "strict": True}}


class SchemaTeacher:
    """A teacher asked for its reply in `reply_format` (json_schema_format; None: free text) while
    asks_json(teacher, mode). A refusal of it (is_schema_refusal) is, under auto, said once per
    client on stderr and sent again without it (the client is asked in free text from then on);
    under on, an error naming the flag."""

    def __init__(self, teacher, reply_format: dict | None, mode: str):
        self.teacher, self.reply_format, self.mode = teacher, reply_format, mode

    def chat(self, messages, **kwargs):
        if self.reply_format is None or not asks_json(self.teacher, self.mode):
            return self.teacher.chat(messages, **kwargs)
        try:
            return self.teacher.chat(messages, response_format=self.reply_format, **kwargs)
        except ChatError as error:
            if not is_schema_refusal(error):
                raise
            if self.mode == "on":
                raise ChatError(f"{error.message} (--teacher-json-schema on: the teacher's server "
                                f"must serve response_format json_schema; auto reads its replies "
                                f"as free text)", error.status, error.endpoint) from None
            if self.teacher not in _REFUSED:
                _REFUSED.add(self.teacher)
                print(f"minskill: the teacher's server refused response_format json_schema (HTTP "
                      f"{error.status}: {error.message[:200]}); its replies are read as free text "
                      f"from now on (--teacher-json-schema off: never asked)", file=sys.stderr,
                      flush=True)
            return self.teacher.chat(messages, **kwargs)


def is_schema_refusal(error: ChatError) -> bool:
    """Whether `error` is a server's refusal of response_format: HTTP 400 (or 422, a validating
    framework's) whose message names it (SCHEMA_REFUSAL)."""
    return error.status in (400, 422) and SCHEMA_REFUSAL.search(error.message or "") is not None


# --------------------------------------------------------------------------------------------------
# The schemas (the shapes teacher.py's readers take)

CHARS_PER_TOKEN = 3  # characters a reply token holds, at the least in English prose (about 4 mean)
GAP = 4              # whitespace counted between two tokens of JSON (a newline and an indent)
SHORT = 80           # a string bounded at most this long (a name, a title) keeps its bound: fitted
MIN_TEXT = 40        # the shortest bound `fitted` gives a longer string


def attribution_schema(max_tokens: int) -> dict:
    """What parse_attribution reads: failure categories (name, count, evidence, fix), a summary."""
    category = _object(category=_text(60), count={"type": "integer", "minimum": 0, "maximum": 999},
                       evidence=_list(_text(200), 2), suggested_fix=_text(400))
    categories = _list(category, _items(max_tokens, 192, 5), 1)
    return fitted(_object(failure_categories=categories, summary=_text(300)), max_tokens)


def strengths_schema(max_tokens: int) -> dict:
    """What parse_strengths reads: the target's strengths and weaknesses, one of each at least."""
    return fitted(_object(strengths=_list(_text(200), 4, 1), weaknesses=_list(_text(200), 4, 1)),
                  max_tokens)


def skillset_schema(max_tokens: int, task_types=(), general: bool = True) -> dict:
    """What parse_skillset_reply reads as MASA JSON (SkillSet.from_json's keys): the general skills
    and common mistakes when `general`, the skills of each of `task_types` in task_specific_skills;
    a skill at least in each list, MAX_SKILLS in all. Of the types, the first whose shortest reply
    (empty skills) takes at most half of max_tokens (one at the least): a server that constrains the
    reply can then close it, its bytes fitting at a token each."""
    types = list(task_types)[:MAX_SKILLS - general]
    while len(types) > 1 - general and \
            shortest_reply(_skillset(max_tokens, types, general)) > max_tokens // 2:
        types.pop()
    return fitted(_skillset(max_tokens, types, general), max_tokens)


def _skillset(max_tokens: int, types: list, general: bool) -> dict:
    lists = int(general) + len(types)
    skill = _object(skill_id=_text(48), title=_text(60), principle=_text(MAX_SKILL_CHARS // 4),
                    when_to_apply=_text(300))
    per_list = min(_items(max_tokens // max(1, lists), 192, 6), MAX_SKILLS // max(1, lists))
    skills = _list(skill, per_list, 1)   # (the lists share the reply's tokens)
    parts = {"general_skills": skills} if general else {}
    if types:
        parts["task_specific_skills"] = _object(**{t: skills for t in types})
    if general:
        parts["common_mistakes"] = _list(_text(200), 3)
    return _object(**parts)


def _text(max_length: int) -> dict:
    return {"type": "string", "maxLength": max_length}


def _list(items: dict, max_items: int, min_items: int = 0) -> dict:
    return {"type": "array", "items": items, "minItems": min_items, "maxItems": max_items}


def _object(**properties) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def _items(max_tokens: int, tokens_each: int, most: int) -> int:
    """The items of about `tokens_each` tokens a reply of max_tokens holds (1 to `most`)."""
    return max(1, min(most, max_tokens // tokens_each))


def fitted(schema: dict, max_tokens: int) -> dict:
    """`schema` with the bounds of its longer strings (over SHORT) scaled down alike, to MIN_TEXT at
    the least, so that its longest reply is at most max_tokens * CHARS_PER_TOKEN characters where
    MIN_TEXT allows it: the rest (keys, names, list sizes) keeps its size, the texts share the room.

        longest(scale) <= fixed + scale * texts    fixed: the texts at MIN_TEXT; texts: their bounds
    """
    fixed = longest_reply(schema, lambda n: n if n <= SHORT else MIN_TEXT)
    bare = longest_reply(schema, lambda n: 0)   # the reply with every string empty
    texts = longest_reply(schema, lambda n: n if n > SHORT else 0) - bare
    scale = min(1.0, max(0, max_tokens * CHARS_PER_TOKEN - fixed) / max(1, texts))
    return _scaled(schema, lambda n: n if n <= SHORT else max(MIN_TEXT, int(n * scale)))


def longest_reply(schema: dict, length=lambda n: n) -> int:
    """Characters of the longest reply a schema of this module allows (GAP between its tokens), a
    string of maxLength n counted as length(n) characters."""
    kind = schema["type"]
    if kind == "string":
        return 2 + length(schema["maxLength"])
    if kind == "integer":
        return len(str(schema["maximum"]))
    if kind == "array":
        return 2 + schema["maxItems"] * (longest_reply(schema["items"], length) + 1 + GAP)
    return 2 + sum(len(key) + 3 + GAP + longest_reply(value, length)
                   for key, value in schema["properties"].items())


def shortest_reply(schema: dict) -> int:
    """Characters of the shortest reply a schema of this module allows: strings empty, lists at
    minItems, no whitespace."""
    kind = schema["type"]
    if kind in ("string", "integer"):
        return 2 if kind == "string" else 1
    if kind == "array":
        return 2 + schema["minItems"] * (shortest_reply(schema["items"]) + 1)
    return 2 + sum(len(key) + 3 + shortest_reply(value)
                   for key, value in schema["properties"].items())


def _scaled(schema: dict, length) -> dict:
    if schema["type"] == "string":
        return {**schema, "maxLength": length(schema["maxLength"])}
    if schema["type"] == "array":
        return {**schema, "items": _scaled(schema["items"], length)}
    if schema["type"] == "object":
        properties = schema["properties"]
        return {**schema, "properties": {k: _scaled(v, length) for k, v in properties.items()}}
    return schema
