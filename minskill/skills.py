"""Skills: one `Skill`, its on-disk format and its prompt text (skill sets, MASA's JSON library and common
mistakes: minskill.skillsets; reading skills out of LLM replies: minskill.replies). This module imports
nothing else from minskill, so it can be copied alone.

A *skill* is natural-language guidance for an agent. Its on-disk format is the open Agent Skills layout:
a folder whose name is the skill's name, holding `SKILL.md` = YAML front matter + Markdown body:

    ---
    name: count-carefully            1-64 chars of a-z 0-9 -, no leading/trailing/double hyphen,
    description: Use when ...        equal to the folder name; description 1-1024 chars
    metadata:                        optional mapping of string keys to string values
      title: Count carefully
    ---
    Markdown body
    scripts/  references/  assets/   optional resource folders (any files below them)

(`license`, `compatibility` (<= 500 chars) and `allowed-tools` are accepted as the spec allows; any other
top-level field is an error, as in the spec's reference validator.)

Sizes. A SKILL.md file (and a skill's body) is at most MAX_FILE_BYTES = 256 KiB: the only size that
refuses a SKILL.md. The spec *recommends* a body under 500 lines and under 5,000 tokens; a longer body
loads with a `SkillWarning` (warnings.warn), tokens approximated as approx_tokens(body) = ceil(chars/4).

Resources. Files under a skill's `scripts/`, `references/` and `assets/` (`Skill.resources`: relative POSIX
path -> bytes) travel with it: read on load, written back byte for byte on save (file modes are not kept:
minskill never executes them), at most MAX_RESOURCE_FILES = 100 files and MAX_RESOURCE_BYTES = 10 MiB per
skill. A symbolic link anywhere below them is an error naming it; dot-files and dot-folders are skipped
(editor droppings, our own temp files); other entries beside SKILL.md are not kept (a warning names them).
Prompts list the resources by name (`resource_note`); no LLM ever rewrites them, and none of their bytes
is ever shown to one or run. A resource path is validated (`validate_resource_path`) before it becomes a
file name: its first part is one of the three folders, no part is empty, '.', '..', hidden or over 255
bytes, at most MAX_RESOURCE_DEPTH = 8 parts; a skill set bounds all its resources at 100 MiB (skillsets.py).

Rendering for a task model's system prompt (`Skill.render(task_type, max_tokens)`, as `SkillSet.render`:
the one interface the rollout code uses): the skill as a set of that one skill, i.e. `## title`, the
description, the body and the resource_note line (when it has resources); when count_tokens(text) > max_tokens the text is cut and says so. count_tokens
defaults to `approx_tokens`, ceil(len(text) / 4), about right for English with BPE tokenizers.

Text written by an LLM is untrusted: names are validated (`validate_name`) or repaired (`slugify`) before
they become paths, sizes are bounded, nothing from it is executed. The YAML reader is a small parser for
the subset SKILL.md uses (key: value scalars, quoted strings, one nested `metadata` mapping, simple `|`
and `>` block scalars); anything else raises SkillFormatError naming the file and line. Files are
written atomically (temp file + os.replace); a SKILL.md that is a symbolic link is never read.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import unicodedata
import warnings
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Skill", "SkillFormatError", "SkillParseError", "validate_name", "validate_task_type", "slugify",
           "split_front_matter", "approx_tokens", "resource_note", "validate_resource_path", "SkillWarning",
           "MAX_NAME_CHARS", "MAX_DESCRIPTION_CHARS", "MAX_BODY_CHARS", "MAX_FILE_BYTES", "RESOURCE_DIRS"]

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
MAX_BODY_CHARS = 20_000              # the longest body an LLM may *write* (replies.py); files: MAX_FILE_BYTES
MAX_FILE_BYTES = 256 * 1024          # a SKILL.md or SKILLSET.md (or a skill's body) larger than this is refused
RECOMMENDED_BODY_LINES = 500         # the spec's recommendation: above it a body loads with a warning
RECOMMENDED_BODY_TOKENS = 5000       # ... tokens counted by approx_tokens (chars / 4)
RESOURCE_DIRS = ("scripts", "references", "assets")
MAX_RESOURCE_FILES = 100             # per skill, the three folders together
MAX_RESOURCE_BYTES = 10 * 1024 * 1024
MAX_RESOURCE_DEPTH = 8               # path parts below the skill folder
SPEC_FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")


class SkillFormatError(ValueError):
    """A skill or skill set breaks the format; the message names the file/field (and line)."""


class SkillWarning(UserWarning):
    """A skill loads, but not as the spec recommends: a body of 500+ lines or 5,000+ tokens, or files beside
    SKILL.md that a skill does not carry."""


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
    _atomic_write_bytes(path, text.encode("utf-8"))


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
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


# --------------------------------------------------------------------------- resources

def validate_resource_path(rel, where: str = "resource") -> str:
    """Return `rel` if it is a safe resource path (`scripts/...`, `references/...`, `assets/...`), else raise."""
    if not isinstance(rel, str):
        raise SkillFormatError(f"{where}: a resource path must be a string, got {type(rel).__name__}")
    parts = rel.split("/")
    if parts[0] not in RESOURCE_DIRS or len(parts) < 2:
        raise SkillFormatError(f"{where}: {rel[:80]!r} is not a file under {', '.join(RESOURCE_DIRS)}")
    if len(parts) > MAX_RESOURCE_DEPTH:
        raise SkillFormatError(f"{where}: {rel[:80]!r} is {len(parts)} folders deep; at most {MAX_RESOURCE_DEPTH}")
    for part in parts:
        if not part or part.startswith(".") or "\\" in part or "\0" in part or len(part.encode()) > 255:
            raise SkillFormatError(f"{where}: {rel[:80]!r} has an empty, hidden, '..' or over-long part {part!r}")
    return rel


def _check_resources(resources, where: str) -> None:
    """Types, paths and the bounds (files, bytes) of a skill's resources."""
    if not isinstance(resources, dict):
        raise SkillFormatError(f"{where}: resources must be a mapping of relative paths to bytes")
    if len(resources) > MAX_RESOURCE_FILES:
        raise SkillFormatError(f"{where}: {len(resources)} resource files; at most {MAX_RESOURCE_FILES}")
    total = 0
    for rel, data in resources.items():
        validate_resource_path(rel, f"{where}: resource")
        if not isinstance(data, (bytes, bytearray)):
            raise SkillFormatError(f"{where}: resource {rel!r} must be bytes, got {type(data).__name__}")
        total += len(data)
    if total > MAX_RESOURCE_BYTES:
        raise SkillFormatError(f"{where}: resources are {total} bytes; at most {MAX_RESOURCE_BYTES}")


def _load_resources(folder: Path) -> dict[str, bytes]:
    """The files under folder/scripts, references, assets (sorted), within the bounds; links refused."""
    resources, total = {}, 0
    for top in RESOURCE_DIRS:
        root = folder / top
        if root.is_symlink():
            raise SkillFormatError(f"{root}: symbolic links are refused in a skill's resources")
        if not root.exists():
            continue
        if not root.is_dir():
            raise SkillFormatError(f"{root}: expected a folder (a skill's {top}/ holds files)")
        for dirpath, dirnames, filenames in os.walk(root):   # never follows links (followlinks=False)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in dirnames + sorted(f for f in filenames if not f.startswith(".")):
                path = Path(dirpath) / name
                if path.is_symlink():
                    raise SkillFormatError(f"{path}: symbolic links are refused in a skill's resources")
                if name in dirnames:
                    continue
                if not path.is_file():
                    raise SkillFormatError(f"{path}: not a regular file")
                rel = validate_resource_path(path.relative_to(folder).as_posix(), str(path))
                total += path.stat().st_size
                if len(resources) >= MAX_RESOURCE_FILES or total > MAX_RESOURCE_BYTES:
                    raise SkillFormatError(f"{folder}: resources exceed {MAX_RESOURCE_FILES} files or "
                                           f"{MAX_RESOURCE_BYTES} bytes (at {rel})")
                resources[rel] = path.read_bytes()
    others = sorted(p.name for p in folder.iterdir()
                    if p.name != "SKILL.md" and p.name not in RESOURCE_DIRS and not p.name.startswith("."))
    if others:
        warnings.warn(f"{folder}: {others[:5]} not kept: a skill carries SKILL.md, scripts/, references/ "
                      f"and assets/ only", SkillWarning, stacklevel=3)
    return resources


def _save_resources(folder: Path, resources: dict[str, bytes]) -> None:
    """Write each resource below `folder` byte for byte; no existing link on the way is followed."""
    for rel, data in sorted(resources.items()):
        parts = validate_resource_path(rel, f"{folder}: resource").split("/")
        parent = folder
        for part in parts[:-1]:
            parent = parent / part
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                raise SkillFormatError(f"{parent}: exists and is not a folder (a link is never followed)")
            parent.mkdir(exist_ok=True)
        if (parent / parts[-1]).is_symlink():
            raise SkillFormatError(f"{parent / parts[-1]}: is a symbolic link; refusing to write through it")
        _atomic_write_bytes(parent / parts[-1], bytes(data))


def resource_note(resources) -> str:
    """The prompt line that lists a skill's resource files by name ("" without any)."""
    if not resources:
        return ""
    return "Files that come with this skill (kept as they are, not shown): " + ", ".join(sorted(resources))


def _warn_if_long(body: str, where: str) -> None:
    lines = body.count("\n") + 1 if body else 0
    tokens = approx_tokens(body)
    if lines >= RECOMMENDED_BODY_LINES or tokens >= RECOMMENDED_BODY_TOKENS:
        warnings.warn(f"{where}: body is {lines} lines, ~{tokens} tokens (chars/4); the Agent Skills spec "
                      f"recommends < {RECOMMENDED_BODY_LINES} lines and < {RECOMMENDED_BODY_TOKENS} tokens "
                      f"(move detail to references/)", SkillWarning, stacklevel=3)


# --------------------------------------------------------------------------- Skill

@dataclass
class Skill:
    """One skill: what SKILL.md holds (`metadata` maps strings to strings), and its resource files."""
    name: str
    description: str
    body: str = ""
    metadata: dict = field(default_factory=dict)
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: str | None = None
    resources: dict = field(default_factory=dict, repr=False)   # "scripts/x.py" -> bytes (module docstring)

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
        if len(self.body.encode("utf-8")) > MAX_FILE_BYTES:
            raise SkillFormatError(f"{where}: body is {len(self.body.encode('utf-8'))} bytes; at most "
                                   f"{MAX_FILE_BYTES} (a SKILL.md is at most that)")
        _check_resources(self.resources, where)
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
        _warn_if_long(skill.body, where)
        return skill

    def render(self, task_type: str | None = None, max_tokens: int = 1024, count_tokens=None) -> str:
        """The system-prompt text of this skill alone: that of a skill set holding only it (`task_type` is
        unused then; it is there so that a skill and a skill set render alike)."""
        count = count_tokens or approx_tokens
        text = _render_skill(self)
        return text if count(text) <= max_tokens else _cut_to_fit(text, "", max_tokens, count)

    # ---- folders
    @classmethod
    def load(cls, folder: str | Path) -> "Skill":
        """Read `folder`/SKILL.md and its resources; the folder's name must be the skill's name."""
        folder = Path(folder)
        path = folder / "SKILL.md"
        if not path.is_file():
            raise SkillFormatError(f"{folder}: no SKILL.md in this skill folder")
        skill = cls.from_skill_md(_read_text(path), str(path), folder_name=folder.name)
        skill.resources = _load_resources(folder)
        return skill

    def save(self, parent: str | Path) -> Path:
        """Write parent/<name>/SKILL.md and the resources atomically, file by file; returns the skill folder.
        Files already in the folder that the skill does not hold are left alone."""
        validate_name(self.name, f"skill {self.name!r}: name")
        folder = _child(Path(parent), self.name)
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(folder / "SKILL.md", self.to_skill_md())
        _save_resources(folder, self.resources)
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


# --------------------------------------------------------------------------- prompt text

def approx_tokens(text: str) -> int:
    """About one token per four characters of English text."""
    return (len(text) + 3) // 4


def _render_skill(skill: Skill) -> str:
    """A skill's block in a system prompt: `## title`, the description (unless it is the title), the body,
    and the names of its resource files (resource_note), if it has any."""
    description = " ".join(skill.description.split())
    head = f"## {skill.title}" + (f"\n{description}" if description != skill.title else "")
    note = resource_note(skill.resources)
    return head + ("\n\n" + skill.body.strip() if skill.body.strip() else "") + ("\n\n" + note if note else "")


def _cut_to_fit(text: str, tail: str, max_tokens: int, count) -> str:
    """The longest start of `text`, marked as cut, such that count(start + mark + tail) <= max_tokens."""
    note = "\n[cut to fit the token budget]"
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if count(text[:mid] + note + tail) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    return text[:low] + note + tail
