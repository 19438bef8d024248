"""The MASA teacher: what the search says to it and reads from it.

The search (minskill/masa/search.py) asks a teacher LLM for a failure attribution
(`attribution_messages`, read by `parse_attribution`), then for new general skills
(`general_rewrite_messages`) or a task type's skills (`task_rewrite_messages`), read by
`parse_skillset_reply`; before the search, for the target's strengths and weaknesses
(`strengths_messages`, `parse_strengths`). `one_shot_rewrite` is one whole exchange: the one-call
adaptation of rewrite.py --compare (the DS-Adapter baseline).

One step, `ask_fitting` around `ask_teacher`:

1. The reply is parsed robustly (replies.py: JSON in a fence or inside prose; else the Markdown
   skill format of skillsets.py) and bounded (MAX_SKILLS, MAX_SKILL_CHARS): LLM output is
   untrusted. A reply that does not parse (TeacherReplyError) is asked again, at most `retries`
   times, the teacher told what was wrong; then the step is skipped and logged (`on_skip`).
2. A prompt the teacher's server refuses as too long for its context (a llama.cpp slot of 2,048
   tokens answers a 2,103-token prompt with HTTP 400: that must not end a run) is built again at
   the next trim level and asked again; each builder's `trim` shows fewer of its lists (`trimmed`:
   the history first, then the examples), and past the last level the step is skipped the same way.

       level k of a list of n items shows its first  n >> k  items
       (k = 0: all; none after n.bit_length() levels)

   At trim level 0 (every prompt that fits) the step is ask_teacher's, unchanged.
3. A server that serves response_format json_schema (minskill's own, vLLM) is asked for the reply
   in its reader's schema (READER_SCHEMAS; minskill/masa/reply_schema.py, --teacher-json-schema);
   the rewrite prompts then show that JSON form; elsewhere the reply is free text.
"""


from __future__ import annotations

import itertools
import json
import re
import zlib
from functools import partial
from typing import Any, Callable

from minskill.masa.model_card import ModelCard, as_model_card
from minskill.masa.reply_schema import (MAX_SKILL_CHARS, MAX_SKILLS, SchemaTeacher, asks_json,
                                        attribution_schema, json_schema_format, skillset_schema,
                                        strengths_schema)
from minskill.replies import extract_json, parse_skillset
from minskill.serve.caching import BudgetExhausted
from minskill.serve.client import ChatError
from minskill.skills import Skill, SkillParseError
from minskill.skillsets import SkillSet
from minskill.tasks.base import is_context_refusal


TEACHER_SYSTEM = ("You are a teacher who writes skills for a specific target language model. A "
                  "skill is a short text (procedure, facts, worked example, answer format) that "
                  "the target reads in its system prompt before it works on a task. Write for "
                  "THIS target: its size, context window and weaknesses (see its model card).")
ATTRIBUTION_TASK = "Failure attribution"
GENERAL_REWRITE_TASK = "Rewrite the general skills"
TASK_REWRITE_TASK = "Rewrite the task-specific skills"
ONESHOT_TASK = "Adapt the skill library to the target model"
STRENGTHS_TASK = "Summarise the target model"

ATTRIBUTION_FORMAT = ('{"failure_categories": [{"category": "short name", "count": 2, '
                      '"evidence": ["task id: what went wrong"], '
                      '"suggested_fix": "what a skill should say"}], "summary": "one sentence"}')


# --------------------------------------------------------------------------------------------------
# The one-shot adaptation (rewrite.py --compare's DS-Adapter baseline): one whole exchange;
# the search's are MasaSearch.ask's (search.py)

def one_shot_rewrite(teacher, card: ModelCard, skills: SkillSet, task_description: str, *,
                     retries: int = 2, temperature: float = 0.7, max_tokens: int = 1536,
                     seed: int | None = 0, on_skip: Callable[[dict], None] | None = None,
                     json_schema: str = "auto") -> SkillSet | None:
    """The teacher adapts `skills` to the target from the model card alone, in one call (no
    search). Task types the reply leaves out keep their input skills. None when the reply never
    parsed. `card` may be a ModelCard or a dict (read leniently). `json_schema`:
    --teacher-json-schema (reply_schema.py); the schema asked for holds the general skills and those
    of each of the input's task types."""
    card = as_model_card(card)
    prompt = partial(oneshot_messages, card, skills, task_description)
    new = ask_fitting(ask_teacher, teacher, prompt, parse_skillset_reply, what="one-shot rewrite",
                      retries=retries, temperature=temperature, max_tokens=max_tokens, seed=seed,
                      on_skip=on_skip, json_schema=json_schema,
                      schema=partial(skillset_schema, task_types=sorted(skills.task_specific)))
    if new is None:
        return None
    task_specific = {t: list(v) for t, v in skills.task_specific.items()}
    task_specific.update({t: list(v) for t, v in new.task_specific.items() if v})
    return SkillSet(general=list(new.general) or list(skills.general), task_specific=task_specific,
                    common_mistakes=list(new.common_mistakes) or list(skills.common_mistakes))


# --------------------------------------------------------------------------------------------------
# Prompts: what the teacher is shown (each builder's `trim`: ask_fitting)

def attribution_messages(card: ModelCard, skills: SkillSet, failures: list[dict], reward: float,
                         task_type: str | None = None, trim: int = 0) -> list[dict]:
    """Prompt: a structured failure attribution (JSON) of the target's failed episodes under
    `skills`."""
    scope = f"tasks of type '{task_type}'" if task_type else "the task suite"
    shown = _only_type(skills, task_type) if task_type else skills
    user = (f"## Task: {ATTRIBUTION_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Skills the target used (reward R = {reward:.3f} on {scope})\n"
            f"{_skills_text(shown)}\n\n"
            f"### Failed episodes\n{_failure_text(trimmed(failures, trim))}\n\n"
            "Group the failures into categories, cite evidence from the episodes and suggest for "
            "each a fix that a skill could make. Reply with JSON only, in this form:\n"
            f"{ATTRIBUTION_FORMAT}")
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def _failure_text(failures: list[dict], limit: int = 600) -> str:
    blocks = []
    for f in failures:
        expected = f.get("expected")
        block = [f"- task {f['task_id']} (type {f['task_type']}):",
                 f"  task: {clip_text(f['question'], limit)}",
                 "" if expected is None else f"  expected answer: {clip_text(str(expected), 200)}",
                 f"  episode: {clip_text(f['transcript'], limit)}" if f.get("transcript") else "",
                 f"  target's reply: {clip_text(f['reply'], limit)}",
                 f"  error: {clip_text(f['error'], 200)}" if f.get("error") else ""]
        blocks.append("\n".join(line for line in block if line))   # optional lines left out
    return "\n".join(blocks) or "(no failed episodes)"


def clip_text(text: str, limit: int) -> str:
    """`text` stripped, cut at `limit` characters (then marked " [...]")."""
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


def _skills_text(skills: SkillSet, limit: int = 6000) -> str:
    text = clip_text(skills.to_markdown(), limit) or "(no skills)"
    return text + skills.resource_note()   # (resource files: their names only)


def _only_general(skills: SkillSet) -> SkillSet:
    return SkillSet(general=list(skills.general), task_specific={},
                    common_mistakes=list(skills.common_mistakes))


def _format_help(json_reply: bool = False, task_type: str | None = None) -> str:
    if json_reply:   # the server writes the reply in reply_schema.skillset_schema (asks_json)
        return _json_format_help([task_type] if task_type else [], general=task_type is None)
    example = SkillSet(general=[_EXAMPLE_SKILL], task_specific={}, common_mistakes=[])
    return ("Reply with the skills only, in exactly this format (one block per skill; names are "
            "lower-case letters, digits and single hyphens):\n\n" + example.to_markdown())


def _json_format_help(task_types=("<task type>",), general: bool = True) -> str:
    """The MASA JSON library a reply is asked for (reply_schema.skillset_schema's parts), its skill
    written by SkillSet.to_json: the keys SkillSet.from_json reads (skill_id -> name, principle ->
    body, ...)."""
    entry = SkillSet(general=[_EXAMPLE_SKILL]).to_json()["general_skills"][0]
    form = {"general_skills": [entry]} if general else {}
    form.update({"task_specific_skills": {t: [entry] for t in task_types}} if task_types else {})
    form.update({"common_mistakes": ["..."]} if general else {})
    return ('Reply with JSON only, a skill library in this form (each skill: "skill_id", its name, '
            'lower-case letters, digits and single hyphens; "title"; "principle", the text the '
            'target reads; "when_to_apply", when to use it):\n'
            + json.dumps(form, ensure_ascii=False))


# The skill a prompt shows as its example of the reply format (Markdown, or MASA JSON for the
# one-shot rewrite)
_EXAMPLE_SKILL = Skill(name="answer-format",
                       description="How to write the final answer; use for every task.",
                       body="State the final answer on the last line as 'Answer: <answer>'.",
                       metadata={})


def _only_type(skills: SkillSet, task_type: str) -> SkillSet:
    return SkillSet(general=[], common_mistakes=[],
                    task_specific={task_type: list(skills.task_specific.get(task_type, []))})


def general_rewrite_messages(card: ModelCard, skills: SkillSet, reward: float,
                             attribution: dict | None, top_sets: list[tuple[SkillSet, float]],
                             trim: int = 0, json_reply: bool = False) -> list[dict]:
    """Prompt: rewrite the general skills, shown the attribution, the card and the history's top
    sets (by R)."""
    history = "\n\n".join(f"#### Set {i + 1}: R = {r:.3f}\n{_skills_text(_only_general(s), 2000)}"
                          for i, (s, r) in enumerate(trimmed(top_sets, trim))) or "(none yet)"
    user = (f"## Task: {GENERAL_REWRITE_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Current general skills (R = {reward:.3f})\n"
            f"{_skills_text(_only_general(skills))}\n\n"
            f"### Why the current skills failed (attribution)\n"
            f"{json.dumps(attribution or {}, ensure_ascii=False)}\n\n"
            f"### Best skill sets so far\n{history}\n\n"
            "Write improved GENERAL skills (they apply to every task type) that fix these failures "
            f"for this target model. Keep what worked in the best sets. {_format_help(json_reply)}")
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def task_rewrite_messages(card: ModelCard, skills: SkillSet, task_type: str, reward: float,
                          attribution: dict | None, examples: list[str], trim: int = 0,
                          json_reply: bool = False) -> list[dict]:
    """Prompt: rewrite the task-specific skills of one task type (the general skills are shown,
    fixed)."""
    shown_examples = "\n".join(f"- {clip_text(e, 300)}"
                               for e in trimmed(examples, trim)) or "(none)"
    user = (f"## Task: {TASK_REWRITE_TASK} of type '{task_type}'\n\n"
            f"### Model card\n{card.to_prompt()}\n\n"
            f"### General skills (fixed, shown for context)\n"
            f"{_skills_text(_only_general(skills), 3000)}\n\n"
            f"### Current skills for '{task_type}' (R = {reward:.3f})\n"
            f"{_skills_text(_only_type(skills, task_type))}\n\n"
            f"### Example tasks of this type\n{shown_examples}\n\n"
            f"### Why the current skills failed (attribution)\n"
            f"{json.dumps(attribution or {}, ensure_ascii=False)}\n\n"
            f"Write improved skills for tasks of type '{task_type}' only, for this target model. "
            f"{_format_help(json_reply, task_type)}")
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def strengths_messages(card: ModelCard, failures: list[dict], successes: list[dict], stats: str,
                       trim: int = 0) -> list[dict]:
    """Prompt: summarise the target's strengths and weaknesses from preliminary rollouts (JSON
    reply). `trim` (every builder's; ask_fitting): 0 = all; higher, fewer episodes shown
    (`trimmed`), the solved ones first."""
    solved_levels = trim_levels(successes)
    successes = trimmed(successes, trim, failures)
    failures = trimmed(failures, max(0, trim - solved_levels))
    user = (f"## Task: {STRENGTHS_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Preliminary results\n{stats}\n\n"
            f"### Solved episodes\n{_failure_text(successes, 300)}\n\n"
            f"### Failed episodes\n{_failure_text(failures, 300)}\n\n"
            "List the target model's strengths and weaknesses as seen in these episodes. "
            "Reply with JSON only:\n"
            '{"strengths": ["..."], "weaknesses": ["..."]}')
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


def oneshot_messages(card: ModelCard, skills: SkillSet, task_description: str,
                     trim: int = 0) -> list[dict]:
    """Prompt: adapt a whole skill library to the target in one shot (no rollouts; the DS-Adapter
    baseline)."""
    if trim:   # ask_fitting: it shows no history or examples that could be dropped
        raise NothingToTrim("the one-shot prompt has no history or examples to drop")
    user = (f"## Task: {ONESHOT_TASK}\n\n### Model card\n{card.to_prompt()}\n\n"
            f"### Tasks\n{clip_text(task_description, 2000)}\n\n"
            f"### Skill library\n{_skills_text(skills)}\n\n"
            "Rewrite the whole library (general skills and the skills of each task type) so that "
            f"this target model can use it well. {_json_format_help()}")
    return [{"role": "system", "content": TEACHER_SYSTEM}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------------------------------
# Asking: one step, retried while its reply does not parse, sent shorter while its prompt is
# refused as too long

def teacher_seed(seed: int, *parts) -> int:
    """A deterministic per-step seed for teacher sampling (so that a rerun asks the same
    questions)."""
    return zlib.crc32(":".join(str(p) for p in (seed, *parts)).encode()) & 0x7FFFFFFF


def ask_fitting(ask_teacher: Callable[..., Any], teacher, prompt: Callable[..., list[dict]],
                parse: Callable[[str], Any], *, what: str,
                on_skip: Callable[[dict], None] | None = None,
                on_trim: Callable[[dict], None] | None = None, json_schema: str = "auto",
                schema: Callable[[int], dict] | None = None, **kwargs):
    """ask_teacher(teacher, prompt(trim=0), parse, what=, on_skip=, **kwargs): one teacher step (the
    search's ask_teacher, passed in), asked again on prompt(trim=1), (trim=2), ... while the server
    refuses the prompt as too long; `on_trim` gets {"what", "trim", "errors"} once one fits. When
    nothing is left to drop (NothingToTrim) the step is skipped as a reply that does not parse is:
    `on_skip` gets {"what", "attempts", "errors", "last_reply", "reason": "prompt too long"}, and
    None is returned. A budget spent before the retry of a reply that did not parse skips the step
    too ("reason": "budget spent": those replies were paid for), then BudgetExhausted passes on, as
    any other failure does. Each call asks for the reply's JSON schema, schema(max_tokens)
    (default: its reader's, READER_SCHEMAS), as `json_schema` says (reply_schema.SCHEMA_MODES)."""
    schema = (schema or READER_SCHEMAS.get(parse)) if asks_json(teacher, json_schema) else None
    reply_format = json_schema_format(what, schema, kwargs.get("max_tokens", 1024))  # (its default)
    refusals = []
    for trim in itertools.count():
        try:
            messages = prompt(trim=trim)
        except NothingToTrim:
            break
        asked = RecordingTeacher(SchemaTeacher(teacher, reply_format, json_schema))
        try:
            result = ask_teacher(asked, messages, parse, what=what, on_skip=on_skip, **kwargs)
        except ChatError as error:
            if not is_context_refusal(error):
                raise
            chars = sum(len(m["content"]) for m in messages)   # a retry's conversation holds more
            refusals.append(f"trim level {trim} (a prompt of {chars} characters): HTTP 400: "
                            f"{error.message}"[:600])
            continue
        except BudgetExhausted:
            if asked.replies and on_skip is not None:
                on_skip({"what": what, "attempts": len(asked.replies),
                         "last_reply": asked.replies[-1][:1000],
                         "errors": [reply_error(parse, r) for r in asked.replies],
                         "reason": "budget spent"})
            raise
        if refusals and on_trim is not None:
            on_trim({"what": what, "trim": trim, "errors": refusals})
        return result
    if on_skip is not None:
        on_skip({"what": what, "attempts": len(refusals), "errors": refusals, "last_reply": "",
                 "reason": "prompt too long"})
    return None


def trim_levels(items: list) -> int:
    """How many trim levels `items` has before none of it is left (`trimmed` halves it at each)."""
    return len(items).bit_length()


def trimmed(items: list, trim: int, *more: list) -> list:
    """The first of `items` a prompt shows at trim level `trim`: all at 0, half as many (rounded
    down) at each level, none after `trim_levels(items)`. Past that come the levels of the lists in
    `more` (trimmed after it, by the caller); past theirs too, NothingToTrim: nothing is left to
    drop."""
    if trim > trim_levels(items) + sum(map(trim_levels, more)):
        raise NothingToTrim(f"trim level {trim}: nothing left to drop")
    return items[:len(items) >> trim]


class NothingToTrim(Exception):
    """A prompt builder was asked for a trim level past its last: the prompt cannot be made
    shorter."""


def ask_teacher(teacher, messages: list[dict], parse: Callable[[str], Any], *, what: str,
                retries: int = 2, temperature: float = 0.7, max_tokens: int = 1024,
                seed: int | None = None, on_skip: Callable[[dict], None] | None = None):
    """The teacher's reply, parsed; one that does not parse is retried up to `retries` times (shown
    what was wrong), then the step is skipped: `on_skip` gets {"what", "attempts", "errors",
    "last_reply"}, and None is returned."""
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
                {"role": "user", "content": RETRY_PROMPT.format(str(e)[:300])}]
    if on_skip is not None:
        on_skip({"what": what, "attempts": retries + 1, "errors": errors,
                 "last_reply": reply[:1000]})
    return None


# what a retry adds to the conversation after the teacher's reply that did not parse (its error in
# the braces)
RETRY_PROMPT = ("That reply could not be read: {}\n"
                "Answer again, exactly in the format asked for, and nothing else.")


class RecordingTeacher:
    """A teacher that keeps its replies (ask_fitting: those of a step that a spent budget cut
    short)."""

    def __init__(self, teacher):
        self.teacher, self.replies = teacher, []

    def chat(self, messages, **kwargs):
        result = self.teacher.chat(messages, **kwargs)
        self.replies.append(result.texts[0] if result.texts else "")
        return result


def reply_error(parse: Callable[[str], Any], reply: str) -> str:
    """Why `reply` did not parse (the error ask_teacher recorded for it)."""
    try:
        parse(reply)
    except TeacherReplyError as e:
        return str(e)[:500]
    return ""


# --------------------------------------------------------------------------------------------------
# Reading: the reply's value, or TeacherReplyError saying what was wrong (ask_teacher shows it
# to the teacher on a retry)

def parse_attribution(reply: str) -> dict:
    """{"failure_categories": [{"category", "count", "evidence": [..], "suggested_fix"}],
    "summary"} from a teacher reply (a bare list of categories is accepted too)."""
    data = _json_in(reply)
    data = {"failure_categories": data} if isinstance(data, list) else data
    cats = data.get("failure_categories", data.get("categories"))
    if not isinstance(cats, list):
        raise TeacherReplyError("the attribution has no 'failure_categories' list: "
                                f"{_quote(json.dumps(data))}")
    out = []
    for i, cat in enumerate(cats[:10]):
        cat = {"category": cat} if isinstance(cat, str) else cat
        if not isinstance(cat, dict):
            raise TeacherReplyError(f"failure_categories[{i}] needs a 'category': {cat!r:.200}")
        count = cat.get("count", 0)   # (a category left blank, as a JSON schema allows: "unnamed")
        is_number = isinstance(count, (int, float)) and not isinstance(count, bool)
        out.append({"category": str(cat.get("category", "")).strip()[:200] or "unnamed",
                    "count": int(count) if is_number else 0,
                    "evidence": _strings(cat.get("evidence"), 5),
                    "suggested_fix": str(cat.get("suggested_fix",
                                                 cat.get("fix", ""))).strip()[:1000]})
    return {"failure_categories": out, "summary": str(data.get("summary", "")).strip()[:1000]}


def parse_strengths(reply: str) -> dict:
    """{"strengths": [..], "weaknesses": [..]} from a teacher reply."""
    data = _json_in(reply)
    if not isinstance(data, dict) or not ("strengths" in data or "weaknesses" in data):
        raise TeacherReplyError("expected an object with 'strengths' and 'weaknesses': "
                                f"{_quote(reply)}")
    result = {"strengths": _strings(data.get("strengths"), 8),
              "weaknesses": _strings(data.get("weaknesses"), 8)}
    if not result["strengths"] and not result["weaknesses"]:
        raise TeacherReplyError(f"both 'strengths' and 'weaknesses' are empty: {_quote(reply)}")
    return result


def _json_in(reply: str):
    """The JSON value in a reply (replies.extract_json), or TeacherReplyError quoting the reply."""
    try:
        return extract_json(reply)
    except ValueError as e:   # its reason ("no JSON object in the reply", and why: nested too
        raise TeacherReplyError(f"{e} {_quote(reply)}") from None   # deeply) + the reply


def _strings(value, limit: int = 20) -> list[str]:
    value = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(value, list):
        raise TeacherReplyError(f"expected a list of strings, got {value!r:.200}")
    return [str(v).strip()[:500] for v in value if str(v).strip()][:limit]


def _quote(text: str, limit: int = 300) -> str:
    text = (text or "").strip()
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def parse_skillset_reply(reply: str) -> SkillSet:
    """A skill set from a teacher reply: MASA JSON (general_skills / task_specific_skills) anywhere
    in it, else the Markdown skill format of skillsets.py (`SkillSet.to_markdown`;
    replies.parse_skillset)."""
    try:
        data = extract_json(reply)
    except ValueError:   # no JSON in the reply: the Markdown format
        data = None
    if isinstance(data, dict) and ("general_skills" in data or "task_specific_skills" in data):
        try:
            skills = SkillSet.from_json(data)
        except (ValueError, TypeError, KeyError) as e:
            raise TeacherReplyError(f"the JSON skill library in the reply is malformed: {e}") \
                from None
    elif _SKILL_STRUCTURE.search(reply or ""):   # the asked-for structure (parse_skillset makes a
        try:                                     # skill of any prose)
            skills = parse_skillset(reply)
        except (SkillParseError, ValueError) as e:
            raise TeacherReplyError(str(e)) from None
    else:
        raise TeacherReplyError("no skill in the asked-for format (front matter 'name:' / "
                                f"'description:' or a '#' heading) in the reply {_quote(reply)}")
    every = skills.skills()
    if not every:
        raise TeacherReplyError(f"the reply holds no skill: {_quote(reply)}")
    if len(every) > MAX_SKILLS:
        raise TeacherReplyError(f"the reply holds {len(every)} skills; at most {MAX_SKILLS} are "
                                "allowed")
    long = [s.name for s in every if len(s.body) > MAX_SKILL_CHARS]
    if long:
        raise TeacherReplyError(f"skill(s) {long} longer than {MAX_SKILL_CHARS} characters")
    return skills


class TeacherReplyError(ValueError):
    """A teacher reply that does not have the asked-for shape."""


_SKILL_STRUCTURE = re.compile(r"^---[ \t]*\r?\n\s*(?:name|description)\s*:|^#{1,3}[ \t]+\S", re.M)

# the schema of each reader's reply, by max_tokens (reply_schema.py); a reader not here: free text
READER_SCHEMAS = {parse_attribution: attribution_schema, parse_strengths: strengths_schema,
                  parse_skillset_reply: skillset_schema}
