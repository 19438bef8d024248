"""Pull skills and JSON out of an LLM reply: what an editor, a teacher or a rewriter wrote, read
leniently.

LLM replies wrap what was asked for in prose and code fences, forget front matter, or close a JSON
object early. Three readers turn a reply into what the caller asked for, or raise an error that
quotes it:

* `parse_skill(reply)` -> one `Skill`: the fenced block that holds it (``` or ~~~, an unclosed one
  too: a reply cut by max_tokens), else the reply; its front matter when there is one (read as
  SKILL.md is, unknown fields kept as metadata), else a skill derived from the first heading (name =
  slug of the heading, description = the first paragraph of text); closing chatter ("Let me know
  ...", "I hope ...") dropped from the body.
* `parse_skillset(reply)` -> a `SkillSet`: MASA's JSON library when the reply holds one
  (`extract_json`), else the `SkillSet.to_markdown()` layout read leniently: `# General skills`, `#
  Task-specific skills: <type>` and `# Common mistakes` sections (levels 1-3, bold or not), skills
  cut at each front matter (or each level-2/3 heading when there is none), duplicate names numbered,
  a bad task type slugified; a reply of more than skillsets.MAX_SKILLS skills refused before any is
  read.
* `extract_json(reply)` -> the JSON value in a reply (see its docstring): lenient for a prompted LLM
  (the first object or array that decodes, in a fence or in prose), strict for a model trained to
  answer in JSON (the text from its first "{" to its last "}", which may hold several objects in a
  row).

Both skill readers raise `skills.SkillParseError` (quoting the reply) when there is nothing usable;
an LLM's text is untrusted, so names are validated or slugified, sizes bounded as in skills.py, and
JSON nested deeper than `MAX_JSON_DEPTH` is not read (never a RecursionError: a reply's content
never ends a run).
"""
from __future__ import annotations

import json
import re

from minskill.skills import (MAX_BODY_CHARS, MAX_COMPATIBILITY_CHARS, MAX_DESCRIPTION_CHARS,
                             MAX_NAME_CHARS,
                             SPEC_FIELDS, Skill, SkillFormatError, SkillParseError, slugify,
                             split_front_matter,
                             validate_name, validate_task_type)
from minskill.skillsets import MAX_SKILLS, SkillSet, parse_mistakes

__all__ = ["extract_json", "nested_deeper_than", "parse_skill", "parse_skillset", "SkillParseError"]

# --------------------------------------------------------------------------- skills

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*$", re.M)
_SECTION = re.compile(r"^#{1,3}[ \t]*(?:\*\*)?(general[ \t]+skills?|task[- ]specific[ \t]+skills?"
                      r"(?:[ \t]*(?:for|:|-|—|\()[ \t]*(.+?)\)?)?|common[ \t]+mistakes?)"
                      r"(?:\*\*)?[ \t]*:?[ \t]*$", re.I | re.M)
# after a '---' line, the next non-blank line is a name/description key (matched in place: no
# copy of the rest of the text per '---' line)
_OPENS_FRONT_MATTER = re.compile(r"[\r\n]*(?:name|description)\s*:")
_CHATTER = re.compile(r"^(let me know|i hope|hope this|feel free|this skill (?:should|will)|"
                      r"note that this|good luck)", re.I)


def _fenced_blocks(text: str) -> list[str]:
    """Contents of the outermost ``` / ~~~ fenced blocks (a nested fence of the same kind ends
    it)."""
    blocks, open_fence, start = [], None, 0
    for match in _FENCE.finditer(text):
        fence = match.group(1)
        if open_fence is None:
            open_fence, start = fence, match.end() + 1
        elif fence[
            0] == open_fence[
                0] and len(fence) >= len(open_fence) and match.group(0).strip() == fence:
            blocks.append(text[start:match.start()])
            open_fence = None
    if open_fence is not None:  # an unclosed fence (a reply cut by max_tokens): keep the rest
        blocks.append(text[start:])
    return blocks


def _front_matter_start(text: str) -> int | None:
    """Offset of a '---' line that opens front matter (the next non-blank line is a name/description
    key)."""
    for match in re.finditer(r"^---[ \t]*\r?$", text, re.M):
        if _OPENS_FRONT_MATTER.match(text, match.end()):
            return match.start()
    return None


def _drop_chatter(body: str) -> str:
    paragraphs = body.rstrip().split("\n\n")
    while len(paragraphs) > 1 and _CHATTER.match(paragraphs[-1].strip()):
        paragraphs.pop()
    return "\n\n".join(paragraphs)


def _lenient_skill(text: str, reply: str) -> Skill:
    """One skill from a fragment: front matter if there is one (repaired), else derived from
    headings."""
    start = _front_matter_start(text)
    fields: dict = {}
    if start is not None:
        try:
            fields, body = split_front_matter(text[start:], "skill in reply")
        except SkillFormatError as error:
            raise SkillParseError(f"front matter could not be read ({error})", reply) from None
    else:
        heading = re.search(r"^#{1,6}[ \t]+\S", text, re.M)
        body = text[heading.start():] if heading else text
    body = _drop_chatter(body.strip("\n"))
    if len(body) > MAX_BODY_CHARS:
        raise SkillParseError(f"skill body is {len(body)} characters; at most {MAX_BODY_CHARS}",
                              reply)
    metadata = fields.get("metadata") if isinstance(fields.get("metadata"), dict) else {}
    metadata = {str(k): str(v) for k, v in metadata.items()
                if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", str(k))}
    for key, value in fields.items():  # unknown fields are kept as metadata, not rejected
        if key not in SPEC_FIELDS and isinstance(value, str):
            metadata[key] = value
    heading = re.search(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", body, re.M)
    # the first paragraph of plain text (heading lines left out) describes the skill when nothing
    # else does
    paragraphs = ["\n".join(line for line in p.split("\n")
                            if not line.lstrip().startswith("#")).strip()
                  for p in re.split(r"\n\s*\n", body)]
    first_text = next((p for p in paragraphs if p), "")
    raw_name = fields.get("name") if isinstance(fields.get("name"), str) else ""
    name_source = raw_name or (heading.group(1) if heading else "") or first_text[:60]
    if not name_source.strip():
        raise SkillParseError("no skill found (no front matter, heading or text)", reply)
    try:
        name = validate_name(raw_name)
    except SkillFormatError:
        name = slugify(name_source)
    description = fields.get("description") if isinstance(fields.get("description"), str) else ""
    if not description.strip():
        description = first_text or (heading.group(1) if heading else name)
    description = " ".join(description.split())
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS - 3].rsplit(" ", 1)[0] + "..."
    skill = Skill(name=name, description=description, body=body, metadata=metadata)
    for attr, key in (("license", "license"), ("compatibility", "compatibility"),
                      ("allowed_tools", "allowed-tools")):
        if isinstance(fields.get(key), str) and fields[key].strip():
            setattr(skill, attr, fields[key][:MAX_COMPATIBILITY_CHARS] if key == "compatibility"
                    else fields[key])
    try:
        return skill.validate("skill in reply")
    except SkillFormatError as error:
        raise SkillParseError(str(error), reply) from None


def _unwrap(reply: str) -> str:
    """The part of a reply that holds the skill(s): a fenced block that has them, else the reply."""
    for block in _fenced_blocks(reply):
        if _front_matter_start(block) is not None or _SECTION.search(block):
            return block
    if _front_matter_start(reply) is None and not _SECTION.search(reply):
        blocks = [b for b in _fenced_blocks(reply) if b.strip()]
        if len(blocks) == 1 and re.search(r"^#{1,6}\s", blocks[0], re.M):
            return blocks[0]
    return reply


def parse_skill(reply: str) -> Skill:
    """One skill from an LLM reply: code fences, missing front matter and prose around it are
    tolerated. Raises SkillParseError (quoting the reply) when there is nothing usable."""
    if not isinstance(reply, str) or not reply.strip():
        raise SkillParseError("empty reply", reply if isinstance(reply, str) else repr(reply))
    return _lenient_skill(_unwrap(reply), reply)


def _split_skills(section: str) -> list[str]:
    """A section's text cut at every '---' line that opens a front matter."""
    starts = [m.start() for m in re.finditer(r"^---[ \t]*\r?$", section, re.M)
              if _OPENS_FRONT_MATTER.match(section, m.end())]
    if not starts:
        # no front matter: one skill per level-2/3 heading, or the whole text as one skill
        heads = [m.start() for m in re.finditer(r"^#{2,3}[ \t]+\S", section, re.M)]
        if not heads:
            return [section] if section.strip() else []
        return [section[a:b] for a, b in zip(heads, heads[1:] + [len(section)])]
    return [section[a:b] for a, b in zip(starts, starts[1:] + [len(section)])]


def _is_skill_library(value) -> bool:
    return isinstance(value, dict) and bool({"general_skills", "task_specific_skills"} & set(value))


def parse_skillset(reply: str) -> SkillSet:
    """A skill set from an LLM reply: the `to_markdown()` layout (leniently) or MASA JSON.
    Raises SkillParseError (quoting the reply) when no skill or mistake is found."""
    if not isinstance(reply, str) or not reply.strip():
        raise SkillParseError("empty reply", reply if isinstance(reply, str) else repr(reply))
    try:
        data = extract_json(reply, accept=_is_skill_library)
    except ValueError:
        data = None  # no MASA JSON: the Markdown layout
    if data is not None:
        try:
            return SkillSet.from_json(data)
        except SkillFormatError as error:
            raise SkillParseError(f"JSON skill library is invalid ({error})", reply) from None
    text = _unwrap(reply)
    sections = list(_SECTION.finditer(text))
    skillset, found = SkillSet(), 0
    chunks = [(None, text[:sections[0].start()] if sections else text)]
    for i, match in enumerate(sections):
        end = sections[i + 1].start() if i + 1 < len(sections) else len(text)
        chunks.append((match, text[match.end():end]))
    for match, chunk in chunks:
        kind = "general" if match is None else match.group(1).lower()
        if match is None and sections and _front_matter_start(chunk) is None:
            continue  # prose before the first section
        if kind.startswith("common"):
            skillset.common_mistakes.extend(parse_mistakes(chunk.split("\n")))
            continue
        if kind.startswith("task"):
            raw_type = (match.group(2) or "").strip().strip("*`").strip()
            if not raw_type:
                raise SkillParseError("a task-specific section does not name its task type", reply)
            try:
                task_type = validate_task_type(raw_type)
            except SkillFormatError:
                task_type = slugify(raw_type, fallback="task").replace("-", "_")
            group = skillset.task_specific.setdefault(task_type, [])
        else:
            group = skillset.general
        pieces = [piece for piece in _split_skills(chunk) if piece.strip()]
        found += len(pieces)
        if found > MAX_SKILLS:   # refused before any is parsed: 20,000 headings cost one reading
            raise SkillParseError(f"the reply holds more than {MAX_SKILLS} skills ({found} "
                                  f"counted so far); a skill set holds at most {MAX_SKILLS}", reply)
        taken, next_suffix = {s.name for s in group}, {}
        for piece in pieces:
            skill = _lenient_skill(piece, reply)
            base = skill.name
            k = next_suffix.get(base, 2)   # where this name's last duplicate left off: linear work
            while skill.name in taken:
                skill.name = f"{base[:MAX_NAME_CHARS - 4]}-{k}"
                k += 1
            next_suffix[base] = k
            taken.add(skill.name)
            group.append(skill)
    if not len(skillset) and not skillset.common_mistakes:
        raise SkillParseError("no skills or common mistakes found", reply)
    try:
        return skillset.validate()
    except SkillFormatError as error:
        raise SkillParseError(str(error), reply) from None


# --------------------------------------------------------------------------- JSON

# A reply's JSON nested deeper than this is not read: what is asked for nests a few levels (a skill
# library: 5), and a deeper value would overflow Python's stack wherever it is later copied or
# written (copy.deepcopy of a checkpoint, json.dumps), killing the run at the same point on every
# --resume.
MAX_JSON_DEPTH = 64

def extract_json(reply: str, accept=None, strict: bool = False):
    """The JSON in an LLM reply. Raises ValueError saying why there is none; a value nested more
    than MAX_JSON_DEPTH levels deep (or past Python's stack) is none, in both modes.

    Lenient (default; a prompted LLM that may wrap its JSON in prose): the contents of each fenced
    block (``` or ~~~), then the whole reply; in each, the first "{" or "[" from which an object or
    an array decodes (and, when `accept` is given, for which accept(value) is true) wins, so prose
    around it and bracketed text that is not JSON are skipped.

    strict=True (a model trained to answer in JSON, whose reply is not to be read into): the text
    from the first "{" to the last "}" must be JSON objects separated only by whitespace; one object
    is returned as it is, several (a small model closes its object early and goes on in a second
    one) as the list of them. A code fence or words around that text are ignored; `accept` is not
    used."""
    reply = reply if isinstance(reply, str) else ""
    if strict:
        return _json_objects(reply)
    decoder, too_deep = json.JSONDecoder(), False
    for text in _fenced_blocks(reply) + [reply]:
        resume_at = 0
        for match in re.finditer(r"[\[{]", text):
            if match.start() < resume_at:
                continue
            try:
                value, end = decoder.raw_decode(text, match.start())
            except json.JSONDecodeError:
                if brackets_deeper_than(text, match.start(), MAX_JSON_DEPTH):
                    too_deep = True   # as below, whatever the stack allowed the decoder
                    break
                continue
            except RecursionError:   # brackets nested past Python's stack: nothing after this start
                                     # decodes
                too_deep = True      # either, and trying each one would cost the stack depth every
                                     # time
                break
            if nested_deeper_than(value, MAX_JSON_DEPTH):
                too_deep, resume_at = True, end   # JSON, but not what was asked for: look after it
                continue
            if isinstance(value, (dict, list)) and (accept is None or accept(value)):
                return value
    raise ValueError("no JSON object in the reply"
                     + (f" (JSON nested more than {MAX_JSON_DEPTH} levels deep is "
                                                        "not read)" if too_deep else ""))


def _json_objects(reply: str):
    start, end = reply.find("{"), reply.rfind("}")
    if start == -1:
        raise ValueError("no JSON object in the reply")
    body = reply[start:end + 1] if end > start else reply[start:]
    decoder, objects, pos = json.JSONDecoder(), [], 0
    try:
        while pos < len(body):
            value, pos = decoder.raw_decode(body, pos)
            objects.append(value)
            pos = len(body) - len(body[pos:].lstrip())
    except json.JSONDecodeError as e:
        if brackets_deeper_than(body, 0, MAX_JSON_DEPTH):   # (how far the decoder got before it
            raise ValueError(                                # failed depends on the stack's limit)
                f"not valid JSON (nested more than {MAX_JSON_DEPTH} levels deep)") from None
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise ValueError(
            f"not valid JSON (nested more than {MAX_JSON_DEPTH} levels deep)") from None
    if any(nested_deeper_than(value, MAX_JSON_DEPTH) for value in objects):
        raise ValueError(f"the JSON is nested more than {MAX_JSON_DEPTH} levels deep")
    return objects[0] if len(objects) == 1 else objects


def brackets_deeper_than(text: str, start: int, limit: int) -> bool:
    """Whether the brackets ([ and {, outside JSON strings) of `text` from `start` nest more than
    `limit` levels deep: what a failed decode says of its input, whatever sys.getrecursionlimit()
    let the decoder reach (torch.compile raises that limit in the process)."""
    depth, in_string, escaped = 0, False, False
    for char in text[start:]:
        if in_string:
            escaped, in_string = (not escaped and char == "\\"), in_string and (
                escaped or char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
            if depth <= 0:
                return False
    return False


def nested_deeper_than(value, limit: int) -> bool:
    """Whether objects and arrays in `value` nest more than `limit` levels deep (counted without
    recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1)
                         for child in (node.values() if isinstance(node, dict) else node))
    return False
