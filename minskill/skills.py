"""Skills: `Skill` and `SkillSet`, their on-disk formats and prompt rendering (reading them out of LLM
replies: minskill.replies). This module imports nothing else from minskill, so it can be copied alone.

A *skill* is natural-language guidance for an agent. Its on-disk format is the open Agent Skills layout:
a folder whose name is the skill's name, holding `SKILL.md` = YAML front matter + Markdown body:

    ---
    name: count-carefully            1-64 chars of a-z 0-9 -, no leading/trailing/double hyphen,
    description: Use when ...        equal to the folder name; description 1-1024 chars
    metadata:                        optional mapping of string keys to string values
      title: Count carefully
    ---
    Markdown body (at most MAX_BODY_CHARS characters)

(`license`, `compatibility` (<= 500 chars) and `allowed-tools` are accepted as the spec allows; any other
top-level field is an error, as in the spec's reference validator.)

A *skill set* (MASA's skill library) is general skills, task-specific skills per task type and a list of
common mistakes. As a folder:

    DIR/SKILLSET.md                           order of the skills, the common mistakes, other fields
    DIR/general/<name>/SKILL.md
    DIR/task-specific/<type>/<name>/SKILL.md

SKILLSET.md is Markdown: `## General skills` and `## Task-specific skills: <type>` sections listing skill
names in order, `## Common mistakes` as a bullet list, and `## Other fields` as a JSON block. Skill folders
not listed are appended alphabetically, so a skill can be added by dropping its folder in.

MASA's JSON library is read and written too:

    {"general_skills": [{"skill_id", "title", "principle", "when_to_apply", ...}],
     "task_specific_skills": {"<type>": [ ...same... ]},
     "common_mistakes": ["text", or {"description", "how_to_avoid", ...}]}

Mapping (lossless, JSON -> folders -> JSON gives back the same JSON):
    skill_id -> name (slugified; the original is kept in metadata when the slug differs)
    principle -> body;  when_to_apply -> description;  title and any other field -> metadata
    (non-string values are stored as JSON text and listed in metadata `json-fields`; the original
    field list is kept in `masa-fields` unless it is exactly skill_id, title, principle, when_to_apply).
    A description is required, so a skill without when_to_apply gets its title as description.
    An object mistake becomes a `Mistake`: a str (its readable text) that keeps the original fields.

Rendering for a task model's system prompt (`SkillSet.render(task_type, max_tokens)`, and `Skill.render`
as a set of that one skill: the one interface the rollout code uses):
    text = general skills, then the skills of the task's type, then the common mistakes;
    while count_tokens(text) > max_tokens: drop the last skill (or mistake) and say so in the text.
count_tokens defaults to ceil(len(text) / 4), about right for English with BPE tokenizers.

Text written by an LLM is untrusted: names are validated (`validate_name`) or repaired (`slugify`) before
they become paths, sizes are bounded, nothing from it is executed. The YAML reader is a small parser for
the subset SKILL.md uses (key: value scalars, quoted strings, one nested `metadata` mapping, simple `|`
and `>` block scalars); anything else raises SkillFormatError naming the file and line. Files are
written atomically (temp file + os.replace); symbolic links are never followed inside a skill set.

Saving a skill-set folder NAME: it is built in a staging folder `.NAME.tmp-*` beside it (SKILLSET.md last);
then an existing NAME is moved to `.NAME.old-*/set` and the staging folder is renamed to NAME. A process
killed at any point leaves NAME (old or new) complete, or, between the two renames, NAME missing and the old
set complete in `.NAME.old-*/set`: `SkillSet.load` then reads that one, and the next save (or
`recover_save` / `recover_saves`, for a script at its start) moves it back and deletes the staging folders
(so one process at a time saves a given folder).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Skill", "SkillSet", "Mistake", "SkillFormatError", "SkillParseError", "validate_name",
           "validate_task_type", "slugify", "split_front_matter", "parse_mistakes", "approx_tokens",
           "recover_save", "recover_saves", "MAX_NAME_CHARS", "MAX_DESCRIPTION_CHARS", "MAX_BODY_CHARS"]

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
MAX_BODY_CHARS = 20_000
MAX_FILE_BYTES = 256 * 1024          # a SKILL.md or SKILLSET.md larger than this is refused
MAX_JSON_BYTES = 32 * 1024 * 1024    # a MASA .json library larger than this is refused
MAX_SKILLS = 1000                    # per skill set
SPEC_FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
MASA_DEFAULT_FIELDS = ("skill_id", "title", "principle", "when_to_apply")
SKILLSET_FILE = "SKILLSET.md"
GENERAL_DIR = "general"
TASK_DIR = "task-specific"


class SkillFormatError(ValueError):
    """A skill or skill set breaks the format; the message names the file/field (and line)."""


class SkillParseError(ValueError):
    """An LLM reply holds no usable skill (raised by minskill.replies); the message quotes its start."""

    def __init__(self, message: str, reply: str):
        quoted = reply[:300] + ("..." if len(reply) > 300 else "")
        super().__init__(f"{message}; reply was: {quoted!r}")
        self.reply = reply


# --------------------------------------------------------------------------- names

_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_TASK_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def validate_name(name, where: str = "name") -> str:
    """Return `name` if it is a valid skill name (and so a safe folder name), else raise SkillFormatError."""
    if not isinstance(name, str):
        raise SkillFormatError(f"{where}: must be a string, got {type(name).__name__}")
    if not name:
        raise SkillFormatError(f"{where}: is empty")
    if len(name) > MAX_NAME_CHARS:
        raise SkillFormatError(f"{where}: {name[:80]!r} is {len(name)} characters; at most {MAX_NAME_CHARS}")
    if "/" in name or "\\" in name or name.startswith("."):
        raise SkillFormatError(f"{where}: {name!r} looks like a path; a name is only a-z, 0-9 and '-'")
    if name != name.lower():
        raise SkillFormatError(f"{where}: {name!r} has upper-case letters; use a-z, 0-9 and '-'")
    if name.startswith("-") or name.endswith("-"):
        raise SkillFormatError(f"{where}: {name!r} starts or ends with '-'")
    if "--" in name:
        raise SkillFormatError(f"{where}: {name!r} contains a double hyphen '--'")
    if not _NAME.fullmatch(name):
        bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c == "-"))})
        raise SkillFormatError(f"{where}: {name!r} has characters outside a-z, 0-9 and '-': {bad}")
    return name


def slugify(text: str, fallback: str = "skill") -> str:
    """A valid skill name made from any text: ASCII-fold, lower-case, runs of other characters -> '-'."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    slug = slug[:MAX_NAME_CHARS].rstrip("-")
    return slug or fallback


def validate_task_type(task_type, where: str = "task type") -> str:
    """Task types become folder names too: 1-64 of A-Z a-z 0-9 _ . -, not starting with . or -, no '..'."""
    if not isinstance(task_type, str) or not _TASK_TYPE.fullmatch(task_type) or ".." in task_type:
        raise SkillFormatError(f"{where}: {task_type!r} is not a valid task type (1-64 characters of "
                               f"A-Z, a-z, 0-9, '_', '.', '-', starting with a letter or digit, no '..')")
    return task_type


# --------------------------------------------------------------------------- the YAML subset

_KEY_LINE = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*)\s*:(?:[ \t]+(.*?))?[ \t]*$")
_DQ_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
               "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85",
               "_": "\xa0", "L": "\u2028", "P": "\u2029"}


def _decode_double_quoted(raw: str, where: str) -> tuple[str, str]:
    """Decode a YAML double-quoted scalar starting at raw[0] == '"'; return (value, rest of line)."""
    out, i = [], 1
    while i < len(raw):
        ch = raw[i]
        if ch == '"':
            return "".join(out), raw[i + 1:]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(raw):
            break
        code = raw[i + 1]
        if code in _DQ_ESCAPES:
            out.append(_DQ_ESCAPES[code])
            i += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(code)
        digits = raw[i + 2:i + 2 + width] if width else ""
        if not width or len(digits) != width or not re.fullmatch(r"[0-9A-Fa-f]+", digits):
            raise SkillFormatError(f"{where}: unknown escape '\\{code}' in a double-quoted string")
        point = int(digits, 16)
        i += 2 + width
        if 0xD800 <= point < 0xDC00 and raw[i:i + 2] == "\\u":  # a JSON-style surrogate pair
            low = int(raw[i + 2:i + 6], 16)
            point = 0x10000 + ((point - 0xD800) << 10) + (low - 0xDC00)
            i += 6
        out.append(chr(point))
    raise SkillFormatError(f"{where}: double-quoted string is not closed on its line "
                           f"(multi-line quoted strings are not supported; use a | block)")


def _decode_single_quoted(raw: str, where: str) -> tuple[str, str]:
    out, i = [], 1
    while i < len(raw):
        if raw[i] == "'":
            if raw[i + 1:i + 2] == "'":
                out.append("'")
                i += 2
                continue
            return "".join(out), raw[i + 1:]
        out.append(raw[i])
        i += 1
    raise SkillFormatError(f"{where}: single-quoted string is not closed on its line")


def _inline_scalar(raw: str, where: str) -> str:
    """A scalar written on the key's line: quoted, or plain with an optional ' # comment'."""
    if raw.startswith('"') or raw.startswith("'"):
        value, rest = (_decode_double_quoted if raw[0] == '"' else _decode_single_quoted)(raw, where)
        if rest.strip() and not rest.strip().startswith("#"):
            raise SkillFormatError(f"{where}: unexpected text after the quoted string: {rest.strip()[:40]!r}")
        return value
    if raw[0] in "[{":
        raise SkillFormatError(f"{where}: flow collections ([...] or {{...}}) are not supported")
    if raw[0] in "&*!%@`":
        raise SkillFormatError(f"{where}: YAML anchors, aliases, tags and directives are not supported")
    if raw.startswith("- ") or raw == "-":
        raise SkillFormatError(f"{where}: lists are not supported")
    comment = re.search(r"\s#", raw)
    return (raw[:comment.start()] if comment else raw).strip()


def _block_scalar(header: str, lines: list[str], start: int, parent_indent: int, where: str
                  ) -> tuple[str, int]:
    """A `|` (literal) or `>` (folded) block scalar whose content starts at lines[start]."""
    match = re.fullmatch(r"([|>])([+-]?)\s*(?:#.*)?", header)
    if not match:
        raise SkillFormatError(f"{where}: unsupported block scalar header {header!r} (use |, |-, |+, >, >-, >+)")
    style, chomp = match.groups()
    end, indent, content = start, None, []
    while end < len(lines):
        line = lines[end]
        if line.strip():
            this_indent = len(line) - len(line.lstrip(" "))
            if this_indent <= parent_indent:
                break
            if indent is None:
                indent = this_indent
            if this_indent < indent:
                raise SkillFormatError(f"{where}: block scalar line {end - start + 1} is less indented "
                                       f"than its first line")
            content.append(line[indent:])
        else:
            content.append("")
        end += 1
    while content and content[-1] == "" and chomp != "+":
        content.pop()  # trailing blank lines belong to the block only with the keep indicator '+'
    if style == "|":
        text = "\n".join(content)
    else:  # folded: single newlines become spaces, blank lines become newlines
        paragraphs, current = [], []
        for line in content:
            if line == "":
                paragraphs.append(" ".join(current))
                current = []
            else:
                current.append(line)
        paragraphs.append(" ".join(current))
        text = "\n".join(paragraphs)
    if content and chomp != "-":
        text += "\n"
    return text, end


def parse_front_matter(lines: list[str], where: str, first_line: int = 2) -> dict:
    """Parse the YAML subset of a SKILL.md front matter (the lines between the '---' markers):
    `key: value` lines whose values are scalars, or (top level only) a mapping of scalars."""
    def at(index: int) -> str:
        return f"{where}, line {first_line + index}"

    result, i = _parse_mapping(lines, 0, 0, at, nested_allowed=True)
    if i < len(lines):
        raise SkillFormatError(f"{at(i)}: unexpected indentation: {lines[i].strip()[:60]!r}")
    return result


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _parse_mapping(lines: list[str], i: int, indent: int, at, nested_allowed: bool) -> tuple[dict, int]:
    """`key: value` lines at exactly `indent` spaces from lines[i] on; stops at a less-indented line."""
    mapping: dict = {}
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        if "\t" in line[:len(line) - len(line.lstrip())]:
            raise SkillFormatError(f"{at(i)}: tabs are not allowed for indentation in YAML")
        if _indent(line) < indent:
            break
        if _indent(line) > indent:
            if indent:
                raise SkillFormatError(f"{at(i)}: nested mappings deeper than one level are not supported")
            raise SkillFormatError(f"{at(i)}: unexpected indentation: {line.strip()[:60]!r}")
        body = line[indent:]
        if body.startswith("- ") or body == "-":
            raise SkillFormatError(f"{at(i)}: lists are not supported, expected 'key: value'")
        match = _KEY_LINE.fullmatch(body)
        if not match:
            raise SkillFormatError(f"{at(i)}: expected 'key: value', got {body[:60]!r}")
        key, raw = match.group(1), (match.group(2) or "")
        if key in mapping:
            raise SkillFormatError(f"{at(i)}: duplicate key {key!r}")
        i += 1
        if raw and raw[0] in "|>":
            mapping[key], i = _block_scalar(raw, lines, i, indent, at(i - 1))
        elif raw == "{}" and nested_allowed:
            mapping[key] = {}
        elif raw and not raw.startswith("#"):
            value = _inline_scalar(raw, at(i - 1))
            if raw[0] not in "\"'":  # a plain scalar may go on over more-indented lines (joined by spaces)
                while i < len(lines) and lines[i].strip() and _indent(lines[i]) > indent:
                    value += " " + lines[i].strip()
                    i += 1
            mapping[key] = value
        else:  # nothing after the colon: an indented mapping follows, or the value is empty
            following = next((j for j in range(i, len(lines))
                              if lines[j].strip() and not lines[j].lstrip().startswith("#")), None)
            if following is not None and _indent(lines[following]) > indent:
                if not nested_allowed:
                    raise SkillFormatError(f"{at(following)}: nested mappings deeper than one level are "
                                           f"not supported")
                mapping[key], i = _parse_mapping(lines, following, _indent(lines[following]), at, False)
            else:
                mapping[key] = ""
    return mapping, i


_PLAIN_UNSAFE = re.compile(r"^[\s\-?:,\[\]{}#&*!|>'\"%@`]|: |\s#|\s$|[\x00-\x1f\x7f\x85\u2028\u2029]|:$")
_YAML_SPECIAL = re.compile(r"(?:~|null|Null|NULL|true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|"
                           r"on|On|ON|off|Off|OFF|[-+]?(?:\.inf|\.Inf|\.INF)|\.nan|\.NaN|\.NAN|"
                           r"[-+]?[0-9][0-9_.,:eExXoObB+-]*|[-+]?\.[0-9]+)")


def _yaml_scalar(value: str) -> str:
    """A YAML scalar that any YAML reader (and ours) reads back as exactly `value`, as a string."""
    if value and not _PLAIN_UNSAFE.search(value) and not _YAML_SPECIAL.fullmatch(value):
        return value
    encoded = json.dumps(value, ensure_ascii=False)  # JSON strings are valid YAML double-quoted scalars
    # YAML wants non-printable characters escaped; JSON leaves a few of them raw
    return re.sub(r"[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]", lambda m: f"\\u{ord(m.group()):04x}", encoded)


# --------------------------------------------------------------------------- files

def _atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8, newlines as given) to `path` via a temp file in the same folder + os.replace.

    minskill.runs has the package's atomic writer; this module keeps its own so that it can be copied
    alone (it imports nothing from minskill)."""
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(text.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def _read_text(path: Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    if path.is_symlink():
        raise SkillFormatError(f"{path}: symbolic links are not followed")
    size = path.stat().st_size
    if size > max_bytes:
        raise SkillFormatError(f"{path}: {size} bytes; at most {max_bytes}")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SkillFormatError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


# --------------------------------------------------------------------------- Skill

@dataclass
class Skill:
    """One skill: what SKILL.md holds. `metadata` maps strings to strings."""
    name: str
    description: str
    body: str = ""
    metadata: dict = field(default_factory=dict)
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: str | None = None

    @property
    def title(self) -> str:
        """metadata['title'], else the body's first heading, else the name in words."""
        if self.metadata.get("title"):
            return self.metadata["title"]
        heading = re.search(r"^#{1,6}\s+(.+?)\s*#*\s*$", self.body, re.M)
        return heading.group(1) if heading else self.name.replace("-", " ").capitalize()

    def validate(self, where: str = "skill") -> "Skill":
        validate_name(self.name, f"{where}: name")
        if not isinstance(self.description, str) or not self.description.strip():
            raise SkillFormatError(f"{where}: description is empty (1-{MAX_DESCRIPTION_CHARS} characters)")
        if len(self.description) > MAX_DESCRIPTION_CHARS:
            raise SkillFormatError(f"{where}: description is {len(self.description)} characters; "
                                   f"at most {MAX_DESCRIPTION_CHARS}")
        if not isinstance(self.body, str):
            raise SkillFormatError(f"{where}: body must be a string")
        if len(self.body) > MAX_BODY_CHARS:
            raise SkillFormatError(f"{where}: body is {len(self.body)} characters; at most {MAX_BODY_CHARS}")
        if not isinstance(self.metadata, dict):
            raise SkillFormatError(f"{where}: metadata must be a mapping of strings to strings")
        for key, value in self.metadata.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", key):
                raise SkillFormatError(f"{where}: metadata key {key!r} must be letters, digits, '_', '.', '-'")
            if not isinstance(value, str):
                raise SkillFormatError(f"{where}: metadata[{key!r}] must be a string, got {type(value).__name__}")
        for label, value in (("license", self.license), ("compatibility", self.compatibility),
                             ("allowed-tools", self.allowed_tools)):
            if value is not None and not isinstance(value, str):
                raise SkillFormatError(f"{where}: {label} must be a string")
        if self.compatibility is not None and not 1 <= len(self.compatibility) <= MAX_COMPATIBILITY_CHARS:
            raise SkillFormatError(f"{where}: compatibility must be 1-{MAX_COMPATIBILITY_CHARS} characters")
        return self

    # ---- SKILL.md text
    def to_skill_md(self) -> str:
        """The SKILL.md text: front matter, a blank line, the body, a newline."""
        self.validate(f"skill {self.name!r}")
        lines = ["---", f"name: {self.name}", f"description: {_yaml_scalar(self.description)}"]
        for key, value in (("license", self.license), ("compatibility", self.compatibility),
                           ("allowed-tools", self.allowed_tools)):
            if value is not None:
                lines.append(f"{key}: {_yaml_scalar(value)}")
        if self.metadata:
            lines.append("metadata:")
            lines.extend(f"  {key}: {_yaml_scalar(value)}" for key, value in self.metadata.items())
        lines.append("---")
        # a blank line after the front matter and a final newline; the reader removes exactly these
        return "\n".join(lines) + "\n" + ("\n" + self.body + "\n" if self.body else "")

    @classmethod
    def from_skill_md(cls, text: str, where: str = "SKILL.md", folder_name: str | None = None) -> "Skill":
        """Parse SKILL.md text strictly (as the spec's validator does). `folder_name` must equal the name."""
        fields, body = split_front_matter(text, where)
        unknown = [k for k in fields if k not in SPEC_FIELDS]
        if unknown:
            raise SkillFormatError(f"{where}: unexpected front-matter field(s) {unknown}; allowed: "
                                   f"{', '.join(SPEC_FIELDS)} (put other fields under metadata)")
        for key in ("name", "description"):
            if key not in fields:
                raise SkillFormatError(f"{where}: front matter has no '{key}'")
        metadata = fields.get("metadata", {})
        if metadata == "":
            metadata = {}
        if not isinstance(metadata, dict):
            raise SkillFormatError(f"{where}: metadata must be an indented mapping of 'key: value' lines")
        for key, value in fields.items():
            if key != "metadata" and not isinstance(value, str):
                raise SkillFormatError(f"{where}: {key} must be a single value, not a mapping")
        skill = cls(name=fields["name"], description=fields["description"], body=body, metadata=metadata,
                    license=fields.get("license"), compatibility=fields.get("compatibility"),
                    allowed_tools=fields.get("allowed-tools"))
        skill.validate(where)
        if folder_name is not None and folder_name != skill.name:
            raise SkillFormatError(f"{where}: name {skill.name!r} differs from its folder name {folder_name!r}")
        return skill

    def render(self, task_type: str | None = None, max_tokens: int = 1024, count_tokens=None) -> str:
        """The system-prompt text of this skill alone: that of a skill set holding only it."""
        return SkillSet(general=[self]).render(task_type, max_tokens, count_tokens)

    # ---- folders
    @classmethod
    def load(cls, folder: str | Path) -> "Skill":
        """Read `folder`/SKILL.md; the folder's name must be the skill's name."""
        folder = Path(folder)
        path = folder / "SKILL.md"
        if not path.is_file():
            raise SkillFormatError(f"{folder}: no SKILL.md in this skill folder")
        return cls.from_skill_md(_read_text(path), str(path), folder_name=folder.name)

    def save(self, parent: str | Path) -> Path:
        """Write parent/<name>/SKILL.md atomically; returns the skill folder."""
        validate_name(self.name, f"skill {self.name!r}: name")
        folder = _child(Path(parent), self.name)
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(folder / "SKILL.md", self.to_skill_md())
        return folder


def _child(parent: Path, name: str) -> Path:
    """parent/name for a validated name, checked once more to stay inside parent."""
    child = parent / name
    if child.resolve().parent != parent.resolve():
        raise SkillFormatError(f"{name!r} would leave {parent}")
    return child


def split_front_matter(text: str, where: str) -> tuple[dict, str]:
    """(front-matter fields, body) of a SKILL.md text; the body is kept byte for byte."""
    if text.startswith("\ufeff"):
        text = text[1:]
    first_end = text.find("\n")
    first = text if first_end < 0 else text[:first_end]
    if first.rstrip("\r").rstrip() != "---":
        raise SkillFormatError(f"{where}, line 1: SKILL.md must start with a '---' line opening the front matter")
    lines, position, line_number = [], first_end + 1, 1
    while True:
        if first_end < 0 or position > len(text):
            raise SkillFormatError(f"{where}: front matter is not closed by a '---' line")
        end = text.find("\n", position)
        line = text[position:] if end < 0 else text[position:end]
        line_number += 1
        if line.rstrip("\r").rstrip() == "---":
            body = "" if end < 0 else text[end + 1:]
            break
        lines.append(line.rstrip("\r"))
        if end < 0:
            raise SkillFormatError(f"{where}: front matter is not closed by a '---' line")
        position = end + 1
    if body.startswith("\r\n"):
        body = body[2:]
    elif body.startswith("\n"):
        body = body[1:]
    if body.endswith("\r\n"):
        body = body[:-2]
    elif body.endswith("\n"):
        body = body[:-1]
    return parse_front_matter(lines, where, first_line=2), body


# --------------------------------------------------------------------------- common mistakes

class Mistake(str):
    """A common mistake that a MASA JSON library wrote as an object ({"description", "how_to_avoid", ...}).

    It *is* its readable text (so it renders and compares like any mistake string) and keeps the original
    fields in `.fields` so that saving it as JSON gives back the same object."""
    fields: dict

    def __new__(cls, fields: dict):
        text = _mistake_text(fields)
        obj = super().__new__(cls, text)
        obj.fields = dict(fields)
        return obj

    def __reduce__(self):
        return (Mistake, (self.fields,))


def _mistake_text(fields: dict) -> str:
    main = next((fields[k] for k in ("description", "mistake", "text", "title")
                 if isinstance(fields.get(k), str) and fields[k].strip()), None)
    parts = [main] if main else []
    for key, value in fields.items():
        if value is main or key == "id" or key.endswith("_id") or not isinstance(value, str) or not value.strip():
            continue
        parts.append(f"{key.replace('_', ' ').capitalize()}: {value}")
    return " ".join(parts) if parts else json.dumps(fields, ensure_ascii=False)


def _bullet_lines(text: str) -> list[str]:
    lines = text.split("\n")
    return ["- " + lines[0]] + ["  " + line if line else "" for line in lines[1:]]


def _mistake_lines(mistake: str) -> list[str]:
    """A mistake as a Markdown bullet; a JSON comment keeps what the bullet alone would not."""
    lines = _bullet_lines(str(mistake))
    exact = not isinstance(mistake, Mistake) and _bullet_text(lines) == mistake
    if not exact:
        value = mistake.fields if isinstance(mistake, Mistake) else str(mistake)
        encoded = json.dumps(value, ensure_ascii=False).replace("-->", "--\\u003e")
        lines.append(f"  <!-- value: {encoded} -->")
    return lines


def _bullet_text(lines: list[str]) -> str:
    """Inverse of _bullet_lines for the lines of one item."""
    first = re.sub(r"^\s*(?:[-*+]|\d+[.)])\s?", "", lines[0], count=1)
    rest = [line[2:] if line.startswith("  ") else line.strip() for line in lines[1:]]
    return "\n".join([first] + rest).strip()


def parse_mistakes(lines: list[str]) -> list[str]:
    """Bullet items ('-', '*', '+', '1.') with indented continuation lines and optional value comments."""
    items: list[list[str]] = []
    for line in lines:
        if re.match(r"^\s{0,1}(?:[-*+]|\d+[.)])\s+\S", line) or re.fullmatch(r"\s{0,1}[-*+]", line):
            items.append([line])
        elif items and (line.startswith("  ") or not line.strip()):
            items[-1].append(line)
        elif items and line.strip():
            items[-1].append("  " + line.strip())  # an unindented continuation line
    mistakes = []
    for item in items:
        comment = None
        kept = []
        for line in item:
            match = re.fullmatch(r"\s*<!-- value: (.*) -->\s*", line)
            if match:
                comment = match.group(1)
            else:
                kept.append(line)
        while len(kept) > 1 and not kept[-1].strip():
            kept.pop()
        text = _bullet_text(kept)
        value: str = text
        if comment is not None:
            try:
                decoded = json.loads(comment)
            except json.JSONDecodeError:
                decoded = None
            candidate = Mistake(decoded) if isinstance(decoded, dict) else decoded
            # the comment wins only while the visible text still says the same thing (else it was edited)
            if isinstance(candidate, str) and " ".join(candidate.split()) == " ".join(text.split()):
                value = candidate
        if value.strip() or comment is not None:
            mistakes.append(value)
    return mistakes


# --------------------------------------------------------------------------- MASA JSON <-> Skill

_RESERVED_METADATA = ("masa-fields", "json-fields")


def _skill_from_masa(entry, where: str, taken: set[str]) -> Skill:
    if not isinstance(entry, dict):
        raise SkillFormatError(f"{where}: a skill must be a JSON object, got {type(entry).__name__}")
    for key in entry:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", key):
            raise SkillFormatError(f"{where}: field name {key!r} must be letters, digits, '_', '.', '-'")
        if key in _RESERVED_METADATA:
            raise SkillFormatError(f"{where}: field name {key!r} is reserved")
    skill_id, title = entry.get("skill_id"), entry.get("title")
    principle, when = entry.get("principle"), entry.get("when_to_apply")
    name_source = next((v for v in (skill_id, title) if isinstance(v, str) and v.strip()), "skill")
    name = slugify(name_source)
    base, k = name, 2
    while name in taken:  # two skills may slug to the same folder name; the original id is kept below
        suffix = f"-{k}"
        name = base[:MAX_NAME_CHARS - len(suffix)].rstrip("-") + suffix
        k += 1
    taken.add(name)
    body = principle if isinstance(principle, str) else ""
    if len(body) > MAX_BODY_CHARS:
        raise SkillFormatError(f"{where}: principle is {len(body)} characters; at most {MAX_BODY_CHARS}")
    use_when = isinstance(when, str) and when.strip() and len(when) <= MAX_DESCRIPTION_CHARS
    if use_when:
        description = when
    else:
        fallback = next((v for v in (title, when, principle) if isinstance(v, str) and v.strip()), name)
        description = " ".join(fallback.split())[:MAX_DESCRIPTION_CHARS]
    metadata, json_fields = {}, []
    for key, value in entry.items():
        consumed = ((key == "skill_id" and value == name) or (key == "principle" and isinstance(value, str))
                    or (key == "when_to_apply" and use_when))
        if consumed:
            continue
        if isinstance(value, str):
            metadata[key] = value
        else:
            metadata[key] = json.dumps(value, ensure_ascii=False)
            json_fields.append(key)
    if tuple(entry) != MASA_DEFAULT_FIELDS:
        metadata["masa-fields"] = ",".join(entry)
    if json_fields:
        metadata["json-fields"] = ",".join(json_fields)
    return Skill(name=name, description=description, body=body, metadata=metadata).validate(where)


def _skill_to_masa(skill: Skill) -> dict:
    meta = skill.metadata
    fields = meta["masa-fields"].split(",") if meta.get("masa-fields") else list(MASA_DEFAULT_FIELDS)
    json_fields = set(meta.get("json-fields", "").split(",")) - {""}
    out = {}
    for key in fields + [k for k in meta if k not in fields and k not in _RESERVED_METADATA]:
        if key in meta and key not in _RESERVED_METADATA:
            out[key] = json.loads(meta[key]) if key in json_fields else meta[key]
        elif key == "skill_id":
            out[key] = skill.name
        elif key == "title":
            out[key] = skill.title
        elif key == "principle":
            out[key] = skill.body
        elif key == "when_to_apply":
            out[key] = skill.description
    return out


# --------------------------------------------------------------------------- SkillSet

def approx_tokens(text: str) -> int:
    """About one token per four characters of English text."""
    return (len(text) + 3) // 4


@dataclass
class SkillSet:
    """General skills, task-specific skills per task type, common mistakes (+ other MASA JSON fields)."""
    general: list[Skill] = field(default_factory=list)
    task_specific: dict[str, list[Skill]] = field(default_factory=dict)
    common_mistakes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)   # unknown top-level fields of a MASA JSON library

    def skills(self, task_type: str | None = None) -> list[Skill]:
        """General skills, then the skills for `task_type` (all task-specific ones when it is None)."""
        if task_type is None:
            return self.general + [s for group in self.task_specific.values() for s in group]
        return self.general + list(self.task_specific.get(task_type, []))

    def __len__(self) -> int:
        return len(self.general) + sum(len(group) for group in self.task_specific.values())

    def validate(self) -> "SkillSet":
        if len(self) > MAX_SKILLS:
            raise SkillFormatError(f"skill set has {len(self)} skills; at most {MAX_SKILLS}")
        groups = [("general", self.general)] + [(f"task-specific[{t!r}]", g) for t, g in self.task_specific.items()]
        for task_type in self.task_specific:
            validate_task_type(task_type)
        for label, group in groups:
            if not isinstance(group, list):
                raise SkillFormatError(f"{label}: must be a list of skills")
            seen = set()
            for i, skill in enumerate(group):
                if not isinstance(skill, Skill):
                    raise SkillFormatError(f"{label}[{i}]: expected a Skill, got {type(skill).__name__}")
                skill.validate(f"{label}[{i}] ({skill.name!r})")
                if skill.name in seen:
                    raise SkillFormatError(f"{label}: two skills are named {skill.name!r}")
                seen.add(skill.name)
        for i, mistake in enumerate(self.common_mistakes):
            if not isinstance(mistake, str):
                raise SkillFormatError(f"common_mistakes[{i}]: must be a string")
            if len(mistake) > MAX_DESCRIPTION_CHARS * 4:
                raise SkillFormatError(f"common_mistakes[{i}]: {len(mistake)} characters; at most "
                                       f"{MAX_DESCRIPTION_CHARS * 4}")
        return self

    # ---- MASA JSON
    @classmethod
    def from_json(cls, data: dict, where: str = "skill library") -> "SkillSet":
        """Build from MASA's JSON library (the dict). Unknown top-level fields go to `extra`, and so does
        the list of the three sections that were absent (key "__absent__"), so to_json() gives them back."""
        if not isinstance(data, dict):
            raise SkillFormatError(f"{where}: expected a JSON object, got {type(data).__name__}")
        general_raw = data.get("general_skills", [])
        specific_raw = data.get("task_specific_skills", {})
        mistakes_raw = data.get("common_mistakes", [])
        if not isinstance(general_raw, list):
            raise SkillFormatError(f"{where}: general_skills must be a list")
        if not isinstance(specific_raw, dict):
            raise SkillFormatError(f"{where}: task_specific_skills must be an object {{type: [skills]}}")
        if not isinstance(mistakes_raw, list):
            raise SkillFormatError(f"{where}: common_mistakes must be a list")
        taken: set[str] = set()
        general = [_skill_from_masa(e, f"{where}: general_skills[{i}]", taken) for i, e in enumerate(general_raw)]
        specific = {}
        for task_type, entries in specific_raw.items():
            validate_task_type(task_type, f"{where}: task_specific_skills key")
            if not isinstance(entries, list):
                raise SkillFormatError(f"{where}: task_specific_skills[{task_type!r}] must be a list")
            taken = set()
            specific[task_type] = [_skill_from_masa(e, f"{where}: task_specific_skills[{task_type!r}][{i}]", taken)
                                   for i, e in enumerate(entries)]
        mistakes = []
        for i, m in enumerate(mistakes_raw):
            if isinstance(m, str):
                mistakes.append(m)
            elif isinstance(m, dict):
                mistakes.append(Mistake(m))
            else:
                raise SkillFormatError(f"{where}: common_mistakes[{i}] must be a string or an object")
        extra = {k: v for k, v in data.items()
                 if k not in ("general_skills", "task_specific_skills", "common_mistakes")}
        presence = [k for k in ("general_skills", "task_specific_skills", "common_mistakes") if k not in data]
        if presence:  # remember absent sections so that saving gives back the same JSON
            extra = {**extra, "__absent__": presence}
        return cls(general, specific, mistakes, extra).validate()

    def to_json(self) -> dict:
        """MASA's JSON library as a dict."""
        absent = set(self.extra.get("__absent__", []))
        out: dict = {}
        if "general_skills" not in absent or self.general:
            out["general_skills"] = [_skill_to_masa(s) for s in self.general]
        if "task_specific_skills" not in absent or self.task_specific:
            out["task_specific_skills"] = {t: [_skill_to_masa(s) for s in g] for t, g in self.task_specific.items()}
        if "common_mistakes" not in absent or self.common_mistakes:
            out["common_mistakes"] = [m.fields if isinstance(m, Mistake) else str(m) for m in self.common_mistakes]
        out.update({k: v for k, v in self.extra.items() if k != "__absent__"})
        return out

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        self.validate()
        _atomic_write_text(path, json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
        return path

    # ---- folders
    @classmethod
    def load(cls, path: str | Path) -> "SkillSet":
        """A skill-set folder, a single skill folder (-> one general skill), or a MASA .json file. No link
        inside a skill set is followed: a symbolic link there is an error naming it."""
        path = Path(path)
        if path.is_file():
            text = _read_text(path, MAX_JSON_BYTES if path.suffix.lower() == ".json" else MAX_FILE_BYTES)
            if path.suffix.lower() == ".json":
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as error:
                    raise SkillFormatError(f"{path}, line {error.lineno}: not valid JSON ({error.msg})") from None
                return cls.from_json(data, str(path))
            if path.name == "SKILL.md":
                return cls(general=[Skill.load(path.parent)])
            raise SkillFormatError(f"{path}: expected a skill-set folder, a skill folder or a .json library")
        if not path.is_dir():
            retired = _retired_set(path)
            if retired is None:
                raise FileNotFoundError(f"skill set not found: {path}")
            return cls.load(retired)  # a save was killed between its renames: this is still the set
        if (path / "SKILL.md").is_file():
            return cls(general=[Skill.load(path)])
        for group in (path / GENERAL_DIR, path / TASK_DIR):  # (per-type folders: below)
            if group.is_symlink():
                raise SkillFormatError(f"{group}: symbolic links are not followed")
        markers = [path / SKILLSET_FILE, path / GENERAL_DIR, path / TASK_DIR]
        if not any(m.exists() for m in markers) and any(not p.name.startswith(".") for p in path.iterdir()):
            raise SkillFormatError(f"{path}: not a skill set (no {SKILLSET_FILE}, {GENERAL_DIR}/, "
                                   f"{TASK_DIR}/ or SKILL.md)")
        order = _read_index(path / SKILLSET_FILE) if (path / SKILLSET_FILE).is_file() else None
        general = _load_group(path / GENERAL_DIR, order.general if order else [])
        specific = {}
        task_root = path / TASK_DIR
        types = list(order.task_types) if order else []
        if task_root.is_dir():
            for entry in sorted(task_root.iterdir()):
                if entry.is_symlink() and not entry.name.startswith("."):  # even one to a file or nowhere
                    raise SkillFormatError(f"{entry}: symbolic links are not followed")
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                validate_task_type(entry.name, str(entry))
                if entry.name not in types:
                    types.append(entry.name)
        for task_type in types:
            listed = order.task_types.get(task_type, []) if order else []
            specific[task_type] = _load_group(task_root / task_type, listed)
        mistakes = order.mistakes if order else []
        extra = order.extra if order else {}
        return cls(general, specific, mistakes, extra).validate()

    def save(self, path: str | Path) -> Path:
        """Write the folder tree. Built beside `path`, then renamed into place (see the module docstring);
        what an earlier killed save left is recovered first. An existing folder is replaced only when it
        is a skill set (holds nothing but SKILLSET.md, general/, task-specific/)."""
        path = Path(path)
        self.validate()
        recover_save(path)
        if path.exists():
            if not path.is_dir() or path.is_symlink():
                raise SkillFormatError(f"{path}: exists and is not a folder")
            foreign = [p.name for p in path.iterdir() if p.name not in (SKILLSET_FILE, GENERAL_DIR, TASK_DIR)]
            if foreign:
                raise SkillFormatError(f"{path}: refusing to replace a folder that is not a skill set "
                                       f"(it holds {sorted(foreign)[:5]})")
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            os.chmod(staging, 0o755)
            general_dir = staging / GENERAL_DIR
            general_dir.mkdir()
            for skill in self.general:
                skill.save(general_dir)
            task_root = staging / TASK_DIR
            task_root.mkdir()
            for task_type, group in self.task_specific.items():
                folder = _child(task_root, validate_task_type(task_type))
                folder.mkdir()
                for skill in group:
                    skill.save(folder)
            _atomic_write_text(staging / SKILLSET_FILE, self._index_text())
            if path.exists():
                retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
                os.replace(path, retired / "set")
                try:
                    os.replace(staging, path)
                except BaseException:
                    os.replace(retired / "set", path)
                    raise
                shutil.rmtree(retired, ignore_errors=True)
            else:
                os.replace(staging, path)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return path

    def _index_text(self) -> str:
        lines = ["# Skill set", "",
                 "An Agent Skills skill set (written by minskill): one folder per skill under general/ and",
                 "task-specific/<type>/. This file keeps their order and the common mistakes.", "",
                 "## General skills", ""]
        lines += [f"- [{s.name}]({GENERAL_DIR}/{s.name}/SKILL.md)" for s in self.general] or ["(none)"]
        for task_type, group in self.task_specific.items():
            lines += ["", f"## Task-specific skills: {task_type}", ""]
            lines += [f"- [{s.name}]({TASK_DIR}/{task_type}/{s.name}/SKILL.md)" for s in group] or ["(none)"]
        lines += ["", "## Common mistakes", ""]
        for mistake in self.common_mistakes:
            lines += _mistake_lines(mistake)
        if not self.common_mistakes:
            lines.append("(none)")
        if self.extra:
            lines += ["", "## Other fields", "", "```json", json.dumps(self.extra, indent=2, ensure_ascii=False), "```"]
        return "\n".join(lines) + "\n"

    # ---- prompts
    def render(self, task_type: str | None = None, max_tokens: int = 1024, count_tokens=None) -> str:
        """The text a task model gets in its system prompt (see the module docstring); "" when empty."""
        count = count_tokens or approx_tokens
        entries: list[tuple[str, str]] = []   # (section heading, text)
        for skill in self.general:
            entries.append(("", _render_skill(skill)))
        for skill in self.task_specific.get(task_type, []) if task_type is not None else []:
            entries.append(("", _render_skill(skill)))
        for mistake in self.common_mistakes:
            entries.append(("## Common mistakes to avoid", "- " + " ".join(str(mistake).split())))
        kept = len(entries)

        def assemble(k: int) -> str:
            parts, heading = [], None
            for section, text in entries[:k]:
                if section and section == heading:  # items of one list: one per line
                    parts[-1] += "\n" + text
                    continue
                if section:
                    parts.append(section)
                    heading = section
                parts.append(text)
            if k < len(entries):
                parts.append(f"({len(entries) - k} more skill(s) left out to fit the token budget.)")
            return "\n\n".join(parts)

        text = assemble(kept)
        while kept > 1 and count(text) > max_tokens:
            kept -= 1
            text = assemble(kept)
        if kept == 1 and count(text) > max_tokens:  # even the first skill alone is too long: cut it
            first, note = entries[0][1], "\n[cut to fit the token budget]"
            low, high = 0, len(first)
            while low < high:
                mid = (low + high + 1) // 2
                if count(first[:mid] + note + assemble(1)[len(first):]) <= max_tokens:
                    low = mid
                else:
                    high = mid - 1
            text = first[:low] + note + assemble(1)[len(first):]
        return text

    # ---- the text an LLM edits
    def to_markdown(self) -> str:
        """One Markdown document: sections of SKILL.md blocks, then the common mistakes.
        `parse_skillset(to_markdown())` gives back this skill set."""
        parts = ["# General skills", ""]
        for skill in self.general:
            parts += [skill.to_skill_md().rstrip("\n"), ""]
        for task_type, group in self.task_specific.items():
            parts += [f"# Task-specific skills: {task_type}", ""]
            for skill in group:
                parts += [skill.to_skill_md().rstrip("\n"), ""]
        parts += ["# Common mistakes", ""]
        for mistake in self.common_mistakes:
            parts += _mistake_lines(mistake)
        return "\n".join(parts).rstrip("\n") + "\n"


def _render_skill(skill: Skill) -> str:
    description = " ".join(skill.description.split())
    head = f"## {skill.title}" + (f"\n{description}" if description != skill.title else "")
    return head + ("\n\n" + skill.body.strip() if skill.body.strip() else "")


class _Index:
    def __init__(self):
        self.general: list[str] = []
        self.task_types: dict[str, list[str]] = {}
        self.mistakes: list[str] = []
        self.extra: dict = {}


def _read_index(path: Path) -> _Index:
    """Read SKILLSET.md: skill order per section, common mistakes, other fields."""
    text = _read_text(path)
    index, section, mistake_lines, json_lines, in_json = _Index(), None, [], [], False
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        heading = re.fullmatch(r"##\s+(.+?)\s*", line)
        if heading and not in_json:
            title = heading.group(1)
            typed = re.fullmatch(r"Task-specific skills:\s*(.+)", title)
            if title == "General skills":
                section = "general"
            elif typed:
                section = validate_task_type(typed.group(1), f"{path}, line {number}")
                index.task_types.setdefault(section, [])
            elif title == "Common mistakes":
                section = "mistakes"
            elif title == "Other fields":
                section = "extra"
            else:
                raise SkillFormatError(f"{path}, line {number}: unknown section {title!r}")
            continue
        if section == "mistakes":
            if line.strip() != "(none)":
                mistake_lines.append(line)
        elif section == "extra":
            if line.strip().startswith("```"):
                in_json = not in_json
            elif in_json:
                json_lines.append(line)
        elif section is not None and line.strip() and line.strip() != "(none)":
            match = re.fullmatch(r"\s*[-*]\s+(?:\[([^\]]*)\]\([^)]*\)|(\S+))\s*", line)
            if not match:
                raise SkillFormatError(f"{path}, line {number}: expected '- [name](path)', got {line[:60]!r}")
            # only the name is used; the link target is never trusted as a path
            name = validate_name(match.group(1) or match.group(2), f"{path}, line {number}")
            (index.general if section == "general" else index.task_types[section]).append(name)
    index.mistakes = parse_mistakes(mistake_lines)
    if json_lines:
        try:
            index.extra = json.loads("\n".join(json_lines))
        except json.JSONDecodeError as error:
            raise SkillFormatError(f"{path}: 'Other fields' is not valid JSON ({error.msg})") from None
        if not isinstance(index.extra, dict):
            raise SkillFormatError(f"{path}: 'Other fields' must be a JSON object")
    return index


def _load_group(folder: Path, order: list[str]) -> list[Skill]:
    found = {}
    if folder.is_dir():
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_symlink():
                raise SkillFormatError(f"{entry}: symbolic links are not followed")
            if entry.is_dir():
                validate_name(entry.name, f"{entry}: folder name")
                found[entry.name] = entry
    missing = [name for name in order if name not in found]
    if missing:
        raise SkillFormatError(f"{folder}: {SKILLSET_FILE} lists skill(s) {missing} with no folder here")
    names = list(dict.fromkeys(order)) + [n for n in found if n not in order]
    return [Skill.load(found[name]) for name in names]


# mkdtemp names: the prefix, then 8 characters of [a-z0-9_]
_STAGING = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-[a-z0-9_]{8}")


def _staging_folders(path: Path) -> dict[str, list[Path]]:
    """The folders SkillSet.save(path) stages in: {"tmp": [new sets being built], "old": [retired sets]}."""
    found: dict[str, list[Path]] = {"tmp": [], "old": []}
    if path.parent.is_dir():
        for entry in path.parent.iterdir():
            match = _STAGING.fullmatch(entry.name)
            if match and match["name"] == path.name and entry.is_dir() and not entry.is_symlink():
                found[match["kind"]].append(entry)
    return found


def _retired_set(path: Path) -> Path | None:
    """The set a killed save moved aside and had not yet replaced (`path` is missing), or None."""
    if os.path.lexists(path):
        return None
    sets = [old / "set" for old in _staging_folders(path)["old"] if (old / "set").is_dir()]
    return max(sets, key=lambda s: s.parent.stat().st_mtime_ns, default=None)  # the latest one moved


def recover_save(path: str | Path) -> None:
    """Undo what a killed `SkillSet.save(path)` left: put the retired set back when `path` is missing,
    then delete the staging folders. Every save calls it first; a script may call it at its start."""
    path = Path(path)
    retired = _retired_set(path)
    if retired is not None:
        os.replace(retired, path)
    for folders in _staging_folders(path).values():
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def recover_saves(folder: str | Path) -> None:
    """recover_save for every skill set that has staging folders in `folder` (a run folder, at start)."""
    folder = Path(folder)
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _STAGING.fullmatch(entry.name)
        if match and entry.is_dir():
            recover_save(folder / match["name"])
