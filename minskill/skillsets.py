"""Skill sets: `SkillSet` (MASA's skill library: general skills, task-specific skills per task
type, common mistakes) as a folder with a SKILLSET.md index, saved so that a killed process never
loses it; MASA's JSON library (mapped losslessly); the prompt text within a token budget, leaving
whole entries out, common mistakes first, the task's own skills last. It imports only
minskill.skills: copy it with skills.py. In full: docs/formats.md, "skillsets.py in full"."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from minskill.files import TOO_DEEP
from minskill.skills import (MAX_DESCRIPTION_CHARS, MAX_FILE_BYTES, MAX_NAME_CHARS, Skill,
                             SkillFormatError,
                             SkillWarning, _atomic_write_text, _child, _cut_to_fit, _read_text,
                             _render_skill, approx_tokens, slugify, validate_name,
                             validate_task_type)

__all__ = ["SkillSet", "Mistake", "parse_mistakes", "recover_save", "recover_saves"]

QUERY_TYPE_SKILLS = "query_type_skills"   # MASA's search libraries' name of task_specific_skills
MAX_JSON_BYTES = 32 * 1024 * 1024    # a MASA .json library larger than this is refused
MAX_SKILLS = 1000                    # per skill set
MAX_SET_RESOURCE_BYTES = 100 * 1024 * 1024   # all skills' resource files together (each skill:
                                             # skills.py)
MASA_DEFAULT_FIELDS = ("skill_id", "title", "principle", "when_to_apply")
SKILLSET_FILE = "SKILLSET.md"
GENERAL_DIR = "general"
TASK_DIR = "task-specific"


# --------------------------------------------------------------------------- common mistakes

class Mistake(str):
    """A common mistake that a MASA JSON library wrote as an object ({"description", "how_to_avoid",
    ...}).

    It *is* its readable text (so it renders and compares like any mistake string) and keeps the
    original fields in `.fields` so that saving it as JSON gives back the same object."""
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
        if value is main or key == "id" or key.endswith(
            "_id") or not isinstance(value, str) or not value.strip():
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
    """Bullet items ('-', '*', '+', '1.') with indented continuation lines and optional value
    comments."""
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
            except (json.JSONDecodeError, RecursionError):   # the visible text is the mistake then
                decoded = None
            candidate = Mistake(decoded) if isinstance(decoded, dict) else decoded
            # the comment wins only while the visible text still says the same (else it was edited)
            if isinstance(candidate, str) and " ".join(candidate.split()) == " ".join(text.split()):
                value = candidate
        if value.strip() or comment is not None:
            mistakes.append(value)
    return mistakes


# --------------------------------------------------------------------------- MASA JSON <-> Skill

_RESERVED_METADATA = ("masa-fields", "json-fields")


def _skill_from_masa(entry, where: str, taken: set[str]) -> Skill:
    if not isinstance(entry, dict):
        raise SkillFormatError(
            f"{where}: a skill must be a JSON object, got {type(entry).__name__}")
    for key in entry:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", key):
            raise SkillFormatError(f"{where}: field name {key!r} must be letters, digits, '_', "
                                   "'.', '-'")
        if key in _RESERVED_METADATA:
            raise SkillFormatError(f"{where}: field name {key!r} is reserved")
    skill_id, title = entry.get("skill_id"), entry.get("title")
    principle, when = entry.get("principle"), entry.get("when_to_apply")
    name_source = next((v for v in (skill_id, title) if isinstance(v, str) and v.strip()), "skill")
    name = slugify(name_source)
    base, k = name, 2
    while name in taken:  # two skills may slug to one folder name; the id is kept below
        suffix = f"-{k}"
        name = base[:MAX_NAME_CHARS - len(suffix)].rstrip("-") + suffix
        k += 1
    taken.add(name)
    body = principle if isinstance(principle, str) else ""
    if len(body.encode("utf-8")) > MAX_FILE_BYTES:   # it must fit in a SKILL.md
        raise SkillFormatError(f"{where}: principle is {len(body.encode('utf-8'))} bytes; at most "
                               f"{MAX_FILE_BYTES}")
    use_when = isinstance(when, str) and when.strip() and len(when) <= MAX_DESCRIPTION_CHARS
    if use_when:
        description = when
    else:
        given = (v for v in (title, when, principle) if isinstance(v, str) and v.strip())
        fallback = next(given, name)
        description = " ".join(fallback.split())[:MAX_DESCRIPTION_CHARS]
    metadata, json_fields = {}, []
    for key, value in entry.items():
        consumed = ((key == "skill_id" and value == name)
                    or (key == "principle" and isinstance(value, str))
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
    masa_fields = meta.get("masa-fields")
    fields = masa_fields.split(",") if masa_fields else list(MASA_DEFAULT_FIELDS)
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

@dataclass
class SkillSet:
    """General skills, task-specific skills per task type, common mistakes (+ other MASA JSON
    fields)."""
    general: list[Skill] = field(default_factory=list)
    task_specific: dict[str, list[Skill]] = field(default_factory=dict)
    common_mistakes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)   # unknown top-level fields of a MASA JSON library

    def skills(self, task_type: str | None = None) -> list[Skill]:
        """General skills, then the skills for `task_type` (all task-specific ones when it is
        None)."""
        if task_type is None:
            return self.general + [s for group in self.task_specific.values() for s in group]
        return self.general + list(self.task_specific.get(task_type, []))

    def __len__(self) -> int:
        return len(self.general) + sum(len(group) for group in self.task_specific.values())

    def validate(self) -> "SkillSet":
        if len(self) > MAX_SKILLS:
            raise SkillFormatError(f"skill set has {len(self)} skills; at most {MAX_SKILLS}")
        groups = [("general", self.general)] + [(f"task-specific[{t!r}]", g)
                                                for t, g in self.task_specific.items()]
        resource_bytes = sum(len(d) for s in self.skills() if isinstance(s, Skill)
                             for d in s.resources.values())
        if resource_bytes > MAX_SET_RESOURCE_BYTES:
            raise SkillFormatError(f"skill set: resource files are {resource_bytes} bytes; at most "
                                   f"{MAX_SET_RESOURCE_BYTES}")
        for task_type in self.task_specific:
            validate_task_type(task_type)
        for label, group in groups:
            if not isinstance(group, list):
                raise SkillFormatError(f"{label}: must be a list of skills")
            seen = set()
            for i, skill in enumerate(group):
                if not isinstance(skill, Skill):
                    raise SkillFormatError(f"{label}[{i}]: expected a Skill, got "
                                           f"{type(skill).__name__}")
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
        """Build from MASA's JSON library (the dict). Unknown top-level fields go to `extra`, and so
        does the list of the three sections that were absent (key "__absent__") and the name the
        task-specific section was read by when it is query_type_skills (key "__section__"), so
        to_json() gives them back."""
        if not isinstance(data, dict):
            raise SkillFormatError(f"{where}: expected a JSON object, got {type(data).__name__}")
        general_raw = data.get("general_skills", [])
        if "task_specific_skills" in data and QUERY_TYPE_SKILLS in data:
            raise SkillFormatError(f"{where}: holds both task_specific_skills and "
                                   f"{QUERY_TYPE_SKILLS} (MASA's search libraries' name for the "
                                   "same section); keep one")
        section = QUERY_TYPE_SKILLS if QUERY_TYPE_SKILLS in data else "task_specific_skills"
        specific_raw = data.get(section, {})
        mistakes_raw = data.get("common_mistakes", [])
        if not isinstance(general_raw, list):
            raise SkillFormatError(f"{where}: general_skills must be a list")
        if not isinstance(specific_raw, dict):
            raise SkillFormatError(f"{where}: {section} must be an object {{type: [skills]}}")
        if not isinstance(mistakes_raw, list):
            raise SkillFormatError(f"{where}: common_mistakes must be a list")
        taken: set[str] = set()
        general = [_skill_from_masa(e, f"{where}: general_skills[{i}]", taken)
                   for i, e in enumerate(general_raw)]
        specific = {}
        for task_type, entries in specific_raw.items():
            validate_task_type(task_type, f"{where}: {section} key")
            if not isinstance(entries, list):
                raise SkillFormatError(f"{where}: {section}[{task_type!r}] must be a list")
            taken = set()
            specific[task_type] = [_skill_from_masa(e, f"{where}: {section}[{task_type!r}][{i}]",
                                                    taken)
                                   for i, e in enumerate(entries)]
        mistakes = []
        for i, m in enumerate(mistakes_raw):
            if isinstance(m, str):
                if m.strip():   # a blank one says nothing, and a Markdown list cannot hold it
                    mistakes.append(m)
            elif isinstance(m, dict):
                mistakes.append(Mistake(m))
            else:
                raise SkillFormatError(f"{where}: common_mistakes[{i}] must be a string or an "
                                       "object")
        extra = {k: v for k, v in data.items()
                 if k not in ("general_skills", section, "common_mistakes")}
        presence = [k for k in ("general_skills", "task_specific_skills", "common_mistakes")
                    if (section if k == "task_specific_skills" else k) not in data]
        if presence:  # remember absent sections so that saving gives back the same JSON
            extra = {**extra, "__absent__": presence}
        if section == QUERY_TYPE_SKILLS:   # written back under the name it was read by
            extra = {**extra, "__section__": section}
        return cls(general, specific, mistakes, extra).validate()

    def to_json(self) -> dict:
        """MASA's JSON library as a dict."""
        absent = set(self.extra.get("__absent__", []))
        out: dict = {}
        if "general_skills" not in absent or self.general:
            out["general_skills"] = [_skill_to_masa(s) for s in self.general]
        if "task_specific_skills" not in absent or self.task_specific:
            out[self.extra.get("__section__", "task_specific_skills")] = {
                t: [_skill_to_masa(s) for s in g] for t, g in self.task_specific.items()}
        if "common_mistakes" not in absent or self.common_mistakes:
            out["common_mistakes"] = [m.fields if isinstance(m, Mistake) else str(m)
                                      for m in self.common_mistakes]
        out.update({k: v for k, v in self.extra.items() if k not in ("__absent__", "__section__")})
        return out

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        self.validate()
        _atomic_write_text(path, json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
        return path

    # ---- folders
    @classmethod
    def load(cls, path: str | Path) -> "SkillSet":
        """A skill-set folder, a skill folder (-> one general skill) or a folder of them (-> general
        skills), or a MASA .json file. No link inside is followed: one there is an error naming
        it."""
        path = Path(path)
        if path.is_file():
            text = _read_text(path, MAX_JSON_BYTES if path.suffix.lower() == ".json"
                              else MAX_FILE_BYTES)
            if path.suffix.lower() == ".json":
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as error:
                    raise SkillFormatError(f"{path}, line {error.lineno}: not valid JSON "
                                           f"({error.msg})") from None
                except RecursionError:
                    raise SkillFormatError(f"{path}: {TOO_DEEP}") from None
                return cls.from_json(data, str(path))
            if path.name == "SKILL.md":
                return cls(general=[Skill.load(path.parent)])
            raise SkillFormatError(f"{path}: expected a skill-set folder, a skill folder or a "
                                   ".json library")
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
        if not any(m.exists() for m in markers):
            visible = [p for p in path.iterdir() if not p.name.startswith(".")]
            if any((p / "SKILL.md").is_file() for p in visible):   # DIR/<name>/SKILL.md
                return cls(general=_load_skill_folders(path)).validate()
            if visible:
                raise SkillFormatError(f"{path}: not a skill set (no {SKILLSET_FILE}, "
                                       f"{GENERAL_DIR}/, {TASK_DIR}/, SKILL.md or <name>/SKILL.md)")
        order = _read_index(path / SKILLSET_FILE) if (path / SKILLSET_FILE).is_file() else None
        general = _load_group(path / GENERAL_DIR, order.general if order else [])
        specific = {}
        task_root = path / TASK_DIR
        types = list(order.task_types) if order else []
        if task_root.is_dir():
            for entry in sorted(task_root.iterdir()):
                # even one to a file or nowhere
                if entry.is_symlink() and not entry.name.startswith("."):
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
        """Write the folder tree. Built beside `path`, then renamed into place (see the module
        docstring); what an earlier killed save left is recovered first. An existing folder is
        replaced only when it is a skill set (holds nothing but SKILLSET.md, general/,
        task-specific/)."""
        path = Path(path)
        self.validate()
        recover_save(path)
        check_replaceable(path)
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
                 "An Agent Skills skill set (written by minskill): one folder per skill under "
                 "general/ and",
                 "task-specific/<type>/. This file keeps their order and the common mistakes.", "",
                 "## General skills", ""]
        lines += [f"- [{s.name}]({GENERAL_DIR}/{s.name}/SKILL.md)"
                  for s in self.general] or ["(none)"]
        for task_type, group in self.task_specific.items():
            lines += ["", f"## Task-specific skills: {task_type}", ""]
            lines += [f"- [{s.name}]({TASK_DIR}/{task_type}/{s.name}/SKILL.md)"
                      for s in group] or ["(none)"]
        lines += ["", "## Common mistakes", ""]
        for mistake in self.common_mistakes:
            lines += _mistake_lines(mistake)
        if not self.common_mistakes:
            lines.append("(none)")
        if self.extra:
            lines += ["", "## Other fields", "", "```json",
                      json.dumps(self.extra, indent=2, ensure_ascii=False), "```"]
        return "\n".join(lines) + "\n"

    # ---- prompts
    def render(self, task_type: str | None = None, max_tokens: int = 1024,
               count_tokens=None) -> str:
        """The text a task model gets in its system prompt (see the module docstring); "" when
        empty."""
        return self.budgeted(task_type, max_tokens, count_tokens)[0]

    def budgeted(self, task_type=None, max_tokens=1024, count_tokens=None) -> tuple[str, dict]:
        """(render's text, how many it left out of general, task_specific and common_mistakes)."""
        count = count_tokens or approx_tokens
        own = self.task_specific.get(task_type, [])   # (none for task_type None)
        entries = ([("general", _render_skill(s)) for s in self.general] +   # (section, text)
                   [("task_specific", _render_skill(s)) for s in own] +
                   [("common_mistakes", "- " + " ".join(m.split())) for m in self.common_mistakes])
        priority = sorted(range(len(entries)), key=lambda i: (entries[i][0] != "task_specific", i))

        def assemble(k: int) -> str:   # the first k entries by priority, in the set's order
            kept = [entries[i] for i in sorted(priority[:k])]
            mistakes = [text for section, text in kept if section == "common_mistakes"]
            parts = [text for section, text in kept if section != "common_mistakes"]
            parts += ["## Common mistakes to avoid", "\n".join(mistakes)] if mistakes else []
            if k < len(entries):
                parts.append(
                    f"({len(entries) - k} more skill(s) left out to fit the token budget.)")
            return "\n\n".join(parts)

        kept, text = len(entries), assemble(len(entries))
        while kept > 1 and count(text) > max_tokens:
            kept, text = kept - 1, assemble(kept - 1)
        if kept == 1 and count(text) > max_tokens:  # even the first skill alone is too long: cut it
            first = entries[priority[0]][1]
            text = _cut_to_fit(first, assemble(1)[len(first):], max_tokens, count)
        left_out = [entries[i][0] for i in priority[kept:]]
        return text, {k: left_out.count(k) for k in ("general", "task_specific", "common_mistakes")}

    def left_out(self, task_types, max_tokens: int = 1024) -> dict[str, dict[str, int]]:
        """{task type: what budgeted left out} for each of `task_types` that leaves any out."""
        counts = {t: self.budgeted(t, max_tokens)[1] for t in dict.fromkeys(task_types)}
        return {t: c for t, c in counts.items() if any(c.values())}

    # ---- resources (skills.py): listed by name in prompts, carried by name after an LLM rewrite
    def resource_note(self) -> str:
        """The prompt lines naming each skill's resource files ("" when no skill has any)."""
        lines = [f"- {label}{s.name}: {', '.join(sorted(s.resources))}"
                 for label, group in [("general/", self.general)] +
                 [(f"task-specific/{t}/", g) for t, g in self.task_specific.items()]
                 for s in group if s.resources]
        return ("\n\nFiles that come with these skills (kept as they are: not shown, not to be "
                "rewritten):\n"
                + "\n".join(lines)) if lines else ""

    def carry_resources(self, source: "SkillSet") -> "SkillSet":
        """This set with each skill lacking resources given those of the skill of the same name and
        group in `source` (an LLM rewrites SKILL.md only; a renamed skill loses them). A new
        SkillSet."""
        def carried(group: list[Skill], old: list[Skill]) -> list[Skill]:
            by_name = {s.name: s.resources for s in old}
            return [s if s.resources or not by_name.get(s.name) else
                    dataclasses.replace(s, resources=dict(by_name[s.name])) for s in group]
        return SkillSet(carried(self.general, source.general),
                        {t: carried(g, source.task_specific.get(t, []))
                         for t, g in self.task_specific.items()},
                        list(self.common_mistakes), dict(self.extra))

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
                raise SkillFormatError(f"{path}, line {number}: expected '- [name](path)', got "
                                       f"{line[:60]!r}")
            # only the name is used; the link target is never trusted as a path
            name = validate_name(match.group(1) or match.group(2), f"{path}, line {number}")
            (index.general if section == "general" else index.task_types[section]).append(name)
    index.mistakes = parse_mistakes(mistake_lines)
    if json_lines:
        try:
            index.extra = json.loads("\n".join(json_lines))
        except json.JSONDecodeError as error:
            raise SkillFormatError(
                f"{path}: 'Other fields' is not valid JSON ({error.msg})") from None
        except RecursionError:
            raise SkillFormatError(f"{path}: 'Other fields' is {TOO_DEEP}") from None
        if not isinstance(index.extra, dict):
            raise SkillFormatError(f"{path}: 'Other fields' must be a JSON object")
    return index


def check_replaceable(path: str | Path) -> None:
    """SkillFormatError unless SkillSet.save may replace `path`: absent, or a folder (not a link to
    one) holding nothing but a skill set (SKILLSET.md, general/, task-specific/). So a mistyped
    destination is never wiped."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir() or path.is_symlink():
            raise SkillFormatError(f"{path}: exists and is not a folder")
        foreign = [p.name for p in path.iterdir()
                   if p.name not in (SKILLSET_FILE, GENERAL_DIR, TASK_DIR)]
        if foreign:
            raise SkillFormatError(f"{path}: refusing to replace a folder that is not a skill set "
                                   f"(it holds {sorted(foreign)[:5]})")


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
        raise SkillFormatError(f"{folder}: {SKILLSET_FILE} lists skill(s) {missing} with no "
                               "folder here")
    names = list(dict.fromkeys(order)) + [n for n in found if n not in order]
    return [Skill.load(found[name]) for name in names]


def _load_skill_folders(folder: Path) -> list[Skill]:
    """The skills of a folder of skill folders (module docstring), by name; no link is followed."""
    skills, problems = [], []
    for entry in sorted(p for p in folder.iterdir() if not p.name.startswith(".")):
        try:
            if entry.is_symlink():
                raise SkillFormatError(f"{entry}: symbolic links are not followed")
            if entry.is_dir():
                skills.append(Skill.load(entry))
        except SkillFormatError as error:   # one bad skill does not hide the others
            problems.append(str(error))
    if problems and not skills:
        raise SkillFormatError(problems[0])
    for problem in problems:
        warnings.warn(f"skipped a skill: {problem}", SkillWarning, stacklevel=3)
    return skills


# mkdtemp names: the prefix, then 8 characters of [a-z0-9_]
_STAGING = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-[a-z0-9_]{8}")


def _staging_folders(path: Path) -> dict[str, list[Path]]:
    """The folders SkillSet.save(path) stages in: {"tmp": [new sets being built], "old": [retired
    sets]}."""
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
    # the latest one moved
    return max(sets, key=lambda s: s.parent.stat().st_mtime_ns, default=None)


def recover_save(path: str | Path) -> None:
    """Undo what a killed `SkillSet.save(path)` left: put the retired set back when `path` is
    missing, then delete the staging folders. Every save calls it first; a script may call it at its
    start."""
    path = Path(path)
    retired = _retired_set(path)
    if retired is not None:
        os.replace(retired, path)
    for folders in _staging_folders(path).values():
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def recover_saves(folder: str | Path) -> None:
    """recover_save for every skill set that has staging folders in `folder` (a run folder, at
    start)."""
    folder = Path(folder)
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _STAGING.fullmatch(entry.name)
        if match and entry.is_dir():
            recover_save(folder / match["name"])
