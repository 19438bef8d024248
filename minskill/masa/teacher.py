"""Reading the MASA teacher's replies: a failure attribution, a model summary, a skill set.

A teacher is an LLM, and a small one often wraps its answer in prose or a code fence, or writes
something else; the JSON and the skills are pulled out by minskill/replies.py. Each reader here returns
the asked-for value or raises `TeacherReplyError` saying what was wrong, quoting the reply;
minskill.masa.search.ask_teacher shows that message to the teacher on a retry. A skill set is read from MASA
JSON anywhere in the reply, else from the Markdown skill format of skillsets.py, and bounded
(`MAX_SKILLS`, `MAX_SKILL_CHARS`; JSON nested past replies.MAX_JSON_DEPTH is read as no JSON, so a reply of
deep brackets is a TeacherReplyError too, never a RecursionError): LLM output is untrusted.

The JSON schemas of these replies, which a teacher whose server serves response_format json_schema is
asked to write in, are minskill/masa/fitting.py's; elsewhere the readers take free text.
"""
from __future__ import annotations

import json
import re

from minskill.replies import extract_json, parse_skillset
from minskill.skills import SkillParseError
from minskill.skillsets import SkillSet


class TeacherReplyError(ValueError):
    """A teacher reply that does not have the asked-for shape."""


def _quote(text: str, limit: int = 300) -> str:
    text = (text or "").strip()
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _json_in(reply: str):
    """The JSON value in a reply (replies.extract_json), or TeacherReplyError quoting the reply."""
    try:
        return extract_json(reply)
    except ValueError as e:   # its reason ("no JSON object in the reply", and why: nested too deeply) + the reply
        raise TeacherReplyError(f"{e} {_quote(reply)}") from None


def _strings(value, limit: int = 20) -> list[str]:
    value = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(value, list):
        raise TeacherReplyError(f"expected a list of strings, got {value!r:.200}")
    return [str(v).strip()[:500] for v in value if str(v).strip()][:limit]


def parse_attribution(reply: str) -> dict:
    """{"failure_categories": [{"category", "count", "evidence": [..], "suggested_fix"}], "summary"} from
    a teacher reply (a bare list of categories is accepted too)."""
    data = _json_in(reply)
    data = {"failure_categories": data} if isinstance(data, list) else data
    cats = data.get("failure_categories", data.get("categories"))
    if not isinstance(cats, list):
        raise TeacherReplyError(f"the attribution has no 'failure_categories' list: {_quote(json.dumps(data))}")
    out = []
    for i, cat in enumerate(cats[:10]):
        cat = {"category": cat} if isinstance(cat, str) else cat
        if not isinstance(cat, dict):
            raise TeacherReplyError(f"failure_categories[{i}] needs a 'category': {cat!r:.200}")
        count = cat.get("count", 0)   # (a category left blank, as a JSON schema allows: "unnamed")
        out.append({"category": str(cat.get("category", "")).strip()[:200] or "unnamed",
                    "count": int(count) if isinstance(count, (int, float)) and not isinstance(count, bool) else 0,
                    "evidence": _strings(cat.get("evidence"), 5),
                    "suggested_fix": str(cat.get("suggested_fix", cat.get("fix", ""))).strip()[:1000]})
    return {"failure_categories": out, "summary": str(data.get("summary", "")).strip()[:1000]}


def parse_strengths(reply: str) -> dict:
    """{"strengths": [..], "weaknesses": [..]} from a teacher reply."""
    data = _json_in(reply)
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
    """A skill set from a teacher reply: MASA JSON (general_skills / task_specific_skills) anywhere in it, else
    the Markdown skill format of skillsets.py (`SkillSet.to_markdown`; replies.parse_skillset)."""
    try:
        data = extract_json(reply)
    except ValueError:   # no JSON in the reply: the Markdown format
        data = None
    if isinstance(data, dict) and ("general_skills" in data or "task_specific_skills" in data):
        try:
            skills = SkillSet.from_json(data)
        except (ValueError, TypeError, KeyError) as e:
            raise TeacherReplyError(f"the JSON skill library in the reply is malformed: {e}") from None
    elif _SKILL_STRUCTURE.search(reply or ""):   # the asked-for structure (parse_skillset makes a skill of any prose)
        try:
            skills = parse_skillset(reply)
        except (SkillParseError, ValueError) as e:
            raise TeacherReplyError(str(e)) from None
    else:
        raise TeacherReplyError(f"no skill in the asked-for format (front matter 'name:' / 'description:' or a "
                                f"'#' heading) in the reply {_quote(reply)}")
    every = skills.skills()
    if not every:
        raise TeacherReplyError(f"the reply holds no skill: {_quote(reply)}")
    if len(every) > MAX_SKILLS:
        raise TeacherReplyError(f"the reply holds {len(every)} skills; at most {MAX_SKILLS} are allowed")
    long = [s.name for s in every if len(s.body) > MAX_SKILL_CHARS]
    if long:
        raise TeacherReplyError(f"skill(s) {long} longer than {MAX_SKILL_CHARS} characters")
    return skills
