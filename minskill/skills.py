"""Skills: one `Skill`, its on-disk format and its prompt text (skill sets, MASA's JSON library and
common mistakes: minskill.skillsets; reading skills out of LLM replies: minskill.replies). This
module imports nothing else from minskill, so it can be copied alone.

A *skill* is an Agent Skills folder: `SKILL.md` = YAML front matter (name, description, optional
metadata) + a Markdown body, and any other files of the folder as resources that travel with it.

Decisions (in full, with the format's limits: docs/formats.md, "skills.py in full"):
1. YAML is read by PyYAML's safe loader, composing nodes only: every scalar is the text written.
2. A SKILL.md is at most MAX_FILE_BYTES; a body over the spec's recommendation loads with a warning.
3. Resources are read and written byte for byte, never shown to an LLM nor run; a symbolic link
   anywhere in the folder is an error naming it.
4. `Skill.render(task_type, max_tokens)`, as `SkillSet.render`, is the one interface the rollout
   code uses; past the budget the text is cut and says so.
5. Text written by an LLM is untrusted: names are validated (`validate_name`) or repaired
   (`slugify`) before they become paths; files are written atomically.
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

import yaml

__all__ = ["Skill", "SkillFormatError", "SkillParseError", "validate_name", "validate_task_type",
           "slugify",
           "split_front_matter", "approx_tokens", "resource_note", "validate_resource_path",
           "SkillWarning",
           "MAX_NAME_CHARS", "MAX_DESCRIPTION_CHARS", "MAX_BODY_CHARS", "MAX_FILE_BYTES",
           "ExecutableBytes",
           "read_yaml", "set_max_resource_files"]

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
MAX_BODY_CHARS = 20_000              # the longest body an LLM may *write* (replies.py); files:
                                     # MAX_FILE_BYTES
MAX_FILE_BYTES = 256 * 1024          # a SKILL.md or SKILLSET.md (or a skill's body) larger than
                                     # this is refused
RECOMMENDED_BODY_LINES = 500         # the spec's recommendation: above it a body loads with a
                                     # warning
RECOMMENDED_BODY_TOKENS = 5000       # ... tokens counted by approx_tokens (chars / 4)
MAX_RESOURCE_FILES = 1000            # per skill: each file of its folder but SKILL.md (one: 1,224)
MAX_RESOURCE_BYTES = 50 * 1024 * 1024   # ... together (public skills: up to 5.5 MB, mostly fonts)
MAX_RESOURCE_DEPTH = 16              # path parts below the skill folder (public skills: up to 6)
MAX_FILES_HINT = "raise the cap with --skill-max-files N"   # (the flag: minskill.cli)
SPEC_FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")


class SkillFormatError(ValueError):
    """A skill or skill set breaks the format; the message names the file/field (and line)."""


class SkillWarning(UserWarning):
    """A skill loads, but not as the spec recommends: a body of 500+ lines or 5,000+ tokens."""


class SkillParseError(ValueError):
    """An LLM reply holds no usable skill (raised by minskill.replies); the message quotes its
    start."""

    def __init__(self, message: str, reply: str):
        quoted = reply[:300] + ("..." if len(reply) > 300 else "")
        super().__init__(f"{message}; reply was: {quoted!r}")
        self.reply = reply


# --------------------------------------------------------------------------- names

_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_TASK_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def validate_name(name, where: str = "name") -> str:
    """Return `name` if it is a valid skill name (and so a safe folder name), else raise
    SkillFormatError."""
    if not isinstance(name, str):
        raise SkillFormatError(f"{where}: must be a string, got {type(name).__name__}")
    if not name:
        raise SkillFormatError(f"{where}: is empty")
    if len(name) > MAX_NAME_CHARS:
        raise SkillFormatError(f"{where}: {name[:80]!r} is {len(name)} characters; at most "
                               f"{MAX_NAME_CHARS}")
    if "/" in name or "\\" in name or name.startswith("."):
        raise SkillFormatError(f"{where}: {name!r} looks like a path; a name is only a-z, 0-9 and "
                               "'-'")
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
    """A valid skill name made from any text: ASCII-fold, lower-case, runs of other characters ->
    '-'."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    slug = slug[:MAX_NAME_CHARS].rstrip("-")
    return slug or fallback


def validate_task_type(task_type, where: str = "task type") -> str:
    """Task types become folder names too: 1-64 of A-Z a-z 0-9 _ . -, not starting with . or -, no
    '..'."""
    if not isinstance(task_type, str) or not _TASK_TYPE.fullmatch(task_type) or ".." in task_type:
        raise SkillFormatError(f"{where}: {task_type!r} is not a valid task type (1-64 characters "
                               "of A-Z, a-z, 0-9, '_', '.', '-', starting with a letter or digit, "
                               "no '..')")
    return task_type


# --------------------------------------------------------------------------- YAML (PyYAML's safe
# loader)

MAX_YAML_DEPTH = 16      # mappings and lists nested deeper than this are refused (never a
                         # RecursionError)


class _TextLoader(yaml.SafeLoader):
    """PyYAML's safe loader, used to compose nodes only: no Python object is ever built from the
    text, and every scalar stays the text written (no types: `version: 1.10`, `name: yes` are
    strings, as the spec's reference validator, strictyaml, reads them). Refused as strictyaml
    refuses them: anchors and aliases (so no document grows as it is read) and tags; nesting deeper
    than MAX_YAML_DEPTH."""

    depth = 0

    def compose_node(self, parent, index):
        event, problem = self.peek_event(), None
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            problem = "YAML anchors and aliases (&, *) are not supported"
        elif getattr(event, "tag", None) is not None:
            problem = "YAML tags (!...) are not supported"
        elif self.depth >= MAX_YAML_DEPTH:
            problem = f"nested more than {MAX_YAML_DEPTH} levels deep"
        if problem:
            raise yaml.composer.ComposerError(problem=problem, problem_mark=event.start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _node_data(node, at):
    """A composed node as str / list / dict (keys text, each once)."""
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if isinstance(node, yaml.SequenceNode):
        return [_node_data(item, at) for item in node.value]
    mapping = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise SkillFormatError(f"{at(key_node)}: a key must be text, not a list or mapping")
        if key_node.value in mapping:
            raise SkillFormatError(f"{at(key_node)}: duplicate key {key_node.value[:80]!r}")
        mapping[key_node.value] = _node_data(value_node, at)
    return mapping


def read_yaml(text: str, where: str, first_line: int = 1):
    """The YAML document `text` as str / list / dict of text (see _TextLoader), {} when it is empty.
    Errors name `where` and the line (`first_line` is the number of the text's first line in its
    file)."""
    def at(node_or_mark) -> str:
        mark = getattr(node_or_mark, "start_mark", node_or_mark)
        return f"{where}, line {first_line + mark.line}" if mark is not None else where

    try:
        node = yaml.compose(text, Loader=_TextLoader)
    except yaml.MarkedYAMLError as error:
        problem = ", ".join(filter(None, (error.context, error.problem))) or "not valid YAML"
        hint = (" (quote a value that holds ': ')" if "mapping values are not allowed" in problem
                else "")
        raise SkillFormatError(f"{at(error.context_mark or error.problem_mark)}: not valid YAML: "
                               f"{problem}{hint}") from None
    except yaml.reader.ReaderError as error:           # a character YAML does not allow
        line = first_line + text.count("\n", 0, error.position)
        raise SkillFormatError(f"{where}, line {line}: not valid YAML: character "
                               f"U+{error.character:04X} is not allowed (write it as an escape in "
                               "a double-quoted string)") from None
    except yaml.YAMLError as error:
        raise SkillFormatError(f"{where}: not valid YAML: {error}") from None
    return {} if node is None else _node_data(node, at)


def parse_front_matter(lines: list[str], where: str, first_line: int = 2) -> dict:
    """The front matter of a SKILL.md (the lines between the '---' markers) as a dict (read_yaml). A
    one-line plain value holding ': ' (`description: Use when: ...`), which YAML refuses, is read as
    if quoted."""
    try:
        data = read_yaml("\n".join(lines) + "\n", where, first_line)
    except SkillFormatError as error:
        quoted = _quote_colon_values(lines)
        if quoted == lines:
            raise
        try:
            data = read_yaml("\n".join(quoted) + "\n", where, first_line)
        except SkillFormatError:
            raise error from None                  # the error of the text as written
    if not isinstance(data, dict):
        raise SkillFormatError(f"{where}, line {first_line}: expected 'key: value' lines (a YAML "
                               "mapping), got "
                               f"{'a list' if isinstance(data, list) else 'one value'}")
    return data


_COLON_VALUE = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]*):[ \t]+([^\s\"'|>\[{&*!%@`#].*?: .*?)[ "
                          r"\t]*")


def _quote_colon_values(lines: list[str]) -> list[str]:
    """Top-level one-line plain values that hold ': ' written as quoted scalars (a ' #' comment
    dropped)."""
    out = []
    for i, line in enumerate(lines):
        match = _COLON_VALUE.fullmatch(line)
        continued = i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t") and lines[i + 1].strip()
        if match and not continued:
            value = re.split(r"\s#", match.group(2), maxsplit=1)[0].strip()
            line = f"{match.group(1)}: {_yaml_scalar(value)}"
        out.append(line)
    return out


def _yaml_block(value, indent: int = 0) -> list[str]:
    """The block YAML lines of a non-empty mapping or list of text (read back by read_yaml as
    `value`)."""
    pad, lines = " " * indent, []
    items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
    for key, item in items:
        lead = f"{pad}-" if key is None else f"{pad}{_yaml_scalar(key)}:"
        if isinstance(item, str):
            lines.append(f"{lead} {_yaml_scalar(item)}")
        elif not item:
            lines.append(f"{lead} {'{}' if isinstance(item, dict) else '[]'}")
        else:
            lines.append(lead)
            lines.extend(_yaml_block(item, indent + 2))
    return lines


def _check_yaml_text(value, where: str, depth: int = 1) -> None:
    """`value` is text, or a list / mapping (text keys) of such, nested at most MAX_YAML_DEPTH
    deep."""
    if isinstance(value, str):
        return
    if depth > MAX_YAML_DEPTH or not isinstance(value, (list, dict)):
        raise SkillFormatError(f"{where}: must be text, or lists and mappings of text nested at "
                               f"most {MAX_YAML_DEPTH} deep; got {type(value).__name__}")
    for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
        if isinstance(value, dict) and (not isinstance(key, str) or len(_yaml_scalar(key)) > 1000):
            raise SkillFormatError(f"{where}: key {str(key)[:80]!r} must be text of at most 1,000 "
                                   f"characters as written")
        _check_yaml_text(item, f"{where}[{key!r}]", depth + 1)


_PLAIN_UNSAFE = re.compile(r"^[\s\-?:,\[\]{}#&*!|>'\"%@`]|: "
                           r"|\s#|\s$|[\x00-\x1f\x7f\x85\u2028\u2029]|:$")
_YAML_SPECIAL = re.compile(
    r"(?:~|null|Null|NULL|true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|"
    r"on|On|ON|off|Off|OFF|[-+]?(?:\.inf|\.Inf|\.INF)|\.nan|\.NaN|\.NAN|"
    r"[-+]?[0-9][0-9_.,:eExXoObB+-]*|[-+]?\.[0-9]+)")


def _yaml_scalar(value: str) -> str:
    """A YAML scalar that any YAML reader (and ours) reads back as exactly `value`, as a string."""
    if value and not _PLAIN_UNSAFE.search(value) and not _YAML_SPECIAL.fullmatch(value):
        return value
    encoded = json.dumps(value, ensure_ascii=False)  # JSON strings are valid YAML double-quoted
                                                     # scalars
    # YAML wants non-printable characters escaped; JSON leaves a few of them raw
    return re.sub(r"[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]",
                  lambda m: f"\\u{ord(m.group()):04x}", encoded)


# --------------------------------------------------------------------------- files

def _atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8, newlines as given) to `path` via a temp file in the same folder +
    os.replace.

    minskill.runs has the package's atomic writer; this module keeps its own so that it can be
    copied alone (it imports nothing from minskill)."""
    _atomic_write_bytes(path, text.encode("utf-8"))


def _atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
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
        raise SkillFormatError(
            f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


# --------------------------------------------------------------------------- resources

class ExecutableBytes(bytes):
    """The bytes of a skill's file that is executable: read from a file with an exec bit, saved with
    mode 0o755 (others 0o644). Equal to the same bytes (a Skill's == ignores modes); minskill never
    runs it."""

    __slots__ = ()


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_resource_path(rel, where: str = "resource") -> str:
    """Return `rel` if it is a safe path of a file in a skill folder (any file but SKILL.md), else
    raise."""
    if not isinstance(rel, str):
        raise SkillFormatError(f"{where}: a resource path must be a string, got "
                               f"{type(rel).__name__}")
    parts = rel.split("/")
    if rel == "SKILL.md":
        raise SkillFormatError(f"{where}: 'SKILL.md' is the skill itself, not one of its files")
    if len(parts) > MAX_RESOURCE_DEPTH:
        raise SkillFormatError(f"{where}: {rel[:80]!r} is {len(parts)} folders deep; at most "
                               f"{MAX_RESOURCE_DEPTH}")
    for part in parts:
        if not part or part.startswith(
            ".") or "\\" in part or _CONTROL.search(part) or len(part.encode()) > 255:
            raise SkillFormatError(f"{where}: {rel[:80]!r} has an empty, hidden, '..', over-long "
                                   f"or control-character part {part[:80]!r}")
    return rel


_file_cap: int | None = None   # the cap set_max_resource_files set (None: MAX_RESOURCE_FILES)


def set_max_resource_files(cap: int | None) -> int | None:
    """Let a skill have up to `cap` resource files (None: MAX_RESOURCE_FILES) in this process, as
    the scripts' --skill-max-files does (a public skill the spec's validator accepts has 1,224);
    returns the cap set before, so that a caller can put it back."""
    global _file_cap
    if cap is not None and (not isinstance(cap, int) or cap < 1):
        raise ValueError(f"the resource file cap must be an integer >= 1, got {cap!r}")
    previous, _file_cap = _file_cap, cap
    return previous


def _check_resources(resources, where: str) -> None:
    """Types, paths and the bounds (files, bytes) of a skill's resources; no path is a folder of
    another."""
    if not isinstance(resources, dict):
        raise SkillFormatError(f"{where}: resources must be a mapping of relative paths to bytes")
    if len(resources) > _max_files():
        raise SkillFormatError(f"{where}: {len(resources)} resource files; at most {_max_files()} "
                               f"({MAX_FILES_HINT})")
    total, folders = 0, set()
    for rel, data in resources.items():
        validate_resource_path(rel, f"{where}: resource")
        if not isinstance(data, (bytes, bytearray)):
            raise SkillFormatError(f"{where}: resource {rel!r} must be bytes, got "
                                   f"{type(data).__name__}")
        total += len(data)
        folders.update("/".join(rel.split("/")[:i]) for i in range(1, rel.count("/") + 1))
    if total > MAX_RESOURCE_BYTES:
        raise SkillFormatError(
            f"{where}: resources are {total} bytes; at most {MAX_RESOURCE_BYTES}")
    if clash := sorted(folders & set(resources)):
        raise SkillFormatError(f"{where}: resource {clash[0]!r} is a file and a folder of other "
                               "resources")


def _load_resources(folder: Path) -> dict[str, bytes]:
    """Every file of the skill folder but SKILL.md (sorted; dot-files and dot-folders skipped),
    within the bounds, executables as ExecutableBytes; a symbolic link anywhere is refused, naming
    it."""
    resources, total = {}, 0
    for dirpath, dirnames, filenames in os.walk(folder):   # never follows links (followlinks=False)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in dirnames + sorted(f for f in filenames if not f.startswith(".")):
            path = Path(dirpath) / name
            if path.is_symlink():
                raise SkillFormatError(f"{path}: symbolic links are refused in a skill's files")
            if name in dirnames or path == folder / "SKILL.md":
                continue
            if not path.is_file():
                raise SkillFormatError(f"{path}: not a regular file")
            rel = validate_resource_path(path.relative_to(folder).as_posix(), str(path))
            total += path.stat().st_size
            if len(resources) >= _max_files():
                raise SkillFormatError(f"{folder}: resources exceed {_max_files()} files "
                                       f"(at {rel}; {MAX_FILES_HINT})")
            if total > MAX_RESOURCE_BYTES:
                raise SkillFormatError(f"{folder}: resources exceed {_max_files()} files or "
                                       f"{MAX_RESOURCE_BYTES} bytes (at {rel})")
            data = path.read_bytes()
            resources[rel] = ExecutableBytes(data) if path.stat().st_mode & 0o111 else data
    _check_resources(resources, str(folder))     # (a file that grew since its stat)
    return resources


def _max_files() -> int:
    """The most resource files a skill may have now (set_max_resource_files)."""
    return MAX_RESOURCE_FILES if _file_cap is None else _file_cap


def _save_resources(folder: Path, resources: dict[str, bytes]) -> None:
    """Write each resource below `folder` byte for byte, with its exec bit; no existing link is
    followed."""
    for rel, data in sorted(resources.items()):
        parts = validate_resource_path(rel, f"{folder}: resource").split("/")
        parent = folder
        for part in parts[:-1]:
            parent = parent / part
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                raise SkillFormatError(f"{parent}: exists and is not a folder (a link is never "
                                       "followed)")
            parent.mkdir(exist_ok=True)
        if (parent / parts[-1]).is_symlink():
            raise SkillFormatError(f"{parent / parts[-1]}: is a symbolic link; refusing to write "
                                   "through it")
        _atomic_write_bytes(parent / parts[-1], bytes(data), 0o755
                            if isinstance(data, ExecutableBytes) else 0o644)


def resource_note(resources) -> str:
    """The prompt line that lists a skill's resource files by name ("" without any)."""
    if not resources:
        return ""
    return "Files that come with this skill (kept as they are, not shown): " + ", ".join(
        sorted(resources))


def _warn_if_long(body: str, where: str) -> None:
    lines = body.count("\n") + 1 if body else 0
    tokens = approx_tokens(body)
    if lines >= RECOMMENDED_BODY_LINES or tokens >= RECOMMENDED_BODY_TOKENS:
        warnings.warn(f"{where}: body is {lines} lines, ~{tokens} tokens (chars/4); the Agent "
                      f"Skills spec recommends < {RECOMMENDED_BODY_LINES} lines and < "
                      f"{RECOMMENDED_BODY_TOKENS} tokens (move detail to references/)",
                      SkillWarning, stacklevel=3)


# --------------------------------------------------------------------------- Skill

@dataclass
class Skill:
    """One skill: what SKILL.md holds (`metadata` maps text to text, or to lists and mappings of
    text), and the other files of its folder (`resources`: relative path -> bytes; ExecutableBytes
    for an executable)."""
    name: str
    description: str
    body: str = ""
    metadata: dict = field(default_factory=dict)
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: str | None = None
    resources: dict = field(default_factory=dict, repr=False)   # "scripts/x.py" -> bytes (module
                                                                # docstring)

    @property
    def title(self) -> str:
        """metadata['title'], else the body's first heading, else the name in words."""
        if isinstance(self.metadata.get("title"), str) and self.metadata["title"]:
            return self.metadata["title"]
        heading = re.search(r"^#{1,6}\s+(.+?)\s*#*\s*$", self.body, re.M)
        return heading.group(1) if heading else self.name.replace("-", " ").capitalize()

    def validate(self, where: str = "skill") -> "Skill":
        validate_name(self.name, f"{where}: name")
        if not isinstance(self.description, str) or not self.description.strip():
            raise SkillFormatError(f"{where}: description is empty (1-{MAX_DESCRIPTION_CHARS} "
                                   "characters)")
        if len(self.description) > MAX_DESCRIPTION_CHARS:
            raise SkillFormatError(f"{where}: description is {len(self.description)} characters; "
                                   f"at most {MAX_DESCRIPTION_CHARS}")
        if not isinstance(self.body, str):
            raise SkillFormatError(f"{where}: body must be a string")
        if len(self.body.encode("utf-8")) > MAX_FILE_BYTES:
            raise SkillFormatError(f"{where}: body is {len(self.body.encode('utf-8'))} bytes; at "
                                   f"most {MAX_FILE_BYTES} (a SKILL.md is at most that)")
        _check_resources(self.resources, where)
        if not isinstance(self.metadata, dict):
            raise SkillFormatError(f"{where}: metadata must be a mapping of text keys to text (or "
                                   f"lists and mappings of text)")
        _check_yaml_text(self.metadata, f"{where}: metadata")
        for label, value in (("license", self.license), ("compatibility", self.compatibility),
                             ("allowed-tools", self.allowed_tools)):
            if value is not None and not isinstance(value, str):
                raise SkillFormatError(f"{where}: {label} must be a string")
        if self.compatibility is not None and not 1 <= len(
            self.compatibility) <= MAX_COMPATIBILITY_CHARS:
            raise SkillFormatError(f"{where}: compatibility must be 1-{MAX_COMPATIBILITY_CHARS} "
                                   "characters")
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
            lines.extend(_yaml_block(self.metadata, indent=2))
        lines.append("---")
        # a blank line after the front matter and a final newline; the reader removes exactly these
        return "\n".join(lines) + "\n" + ("\n" + self.body + "\n" if self.body else "")

    @classmethod
    def from_skill_md(cls, text: str, where: str = "SKILL.md", folder_name: str
                      | None = None) -> "Skill":
        """Parse SKILL.md text strictly (as the spec's validator does). `folder_name` must equal the
        name."""
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
            raise SkillFormatError(f"{where}: metadata must be an indented mapping of 'key: value' "
                                   "lines")
        for key, value in fields.items():
            if key != "metadata" and not isinstance(value, str):
                raise SkillFormatError(f"{where}: {key} must be one text value, not a "
                                       f"{'list' if isinstance(value, list) else 'mapping'}")
        skill = cls(name=fields["name"], description=fields["description"], body=body,
                    metadata=metadata,
                    license=fields.get("license"), compatibility=fields.get("compatibility"),
                    allowed_tools=fields.get("allowed-tools"))
        skill.validate(where)
        if folder_name is not None and folder_name != skill.name:
            raise SkillFormatError(f"{where}: name {skill.name!r} differs from its folder name "
                                   f"{folder_name!r}")
        _warn_if_long(skill.body, where)
        return skill

    def render(self, task_type: str | None = None, max_tokens: int = 1024,
               count_tokens=None) -> str:
        """The system-prompt text of this skill alone: that of a skill set holding only it
        (`task_type` is unused then; it is there so that a skill and a skill set render alike)."""
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
        """Write parent/<name>/SKILL.md and the resources atomically, file by file; returns the
        skill folder. Files already in the folder that the skill does not hold are left alone."""
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
        raise SkillFormatError(f"{where}, line 1: SKILL.md must start with a '---' line opening "
                               "the front matter")
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
    """A skill's block in a system prompt: `## title`, the description (unless it is the title), the
    body, and the names of its resource files (resource_note), if it has any."""
    description = " ".join(skill.description.split())
    head = f"## {skill.title}" + (f"\n{description}" if description != skill.title else "")
    note = resource_note(skill.resources)
    return head + ("\n\n" + skill.body.strip() if skill.body.strip() else "") + ("\n\n" + note
                                                                                 if note else "")


def _cut_to_fit(text: str, tail: str, max_tokens: int, count) -> str:
    """The longest start of `text`, marked as cut, such that count(start + mark + tail) <=
    max_tokens."""
    note = "\n[cut to fit the token budget]"
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if count(text[:mid] + note + tail) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    return text[:low] + note + tail
