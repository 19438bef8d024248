"""minskill's SKILL.md validation agrees with the Agent Skills reference validator.

`skills-ref` (PyPI; its command is `agentskills validate DIR`) is a test-only reference, like transformers:
minskill never imports it. A corpus of valid and invalid skill folders is generated here (with the forms
public skills use: continued descriptions, nested metadata, LICENSE.txt and other folders, executables),
and the suites' base skills are added to it; for every case, minskill's loader (Skill.load: it validates as
it reads) and skills_ref.validate must say the same (valid or not), except for the cases in DIFFERENCES,
each with the reason (docs/formats.md lists them too). The test also checks that each listed difference is
still a difference, so the list stays true as either side changes; and that what minskill saves of each
skill it loads passes skills-ref and reads back the same."""
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from minskill.skills import MAX_FILE_BYTES, Skill, SkillFormatError

BASE_SKILLS = Path(__file__).resolve().parent.parent / "minskill" / "tasks" / "base_skills"

skills_ref = pytest.importorskip("skills_ref")

DESC = "Use when testing the validators."


def front_matter(name="my-skill", description=DESC, extra="", body="# Title\n\nSteps.\n") -> str:
    lines = ["---"]
    if name is not None:
        lines.append(f"name: {name}")
    if description is not None:
        lines.append(f"description: {description}")
    if extra:
        lines.append(extra)
    return "\n".join(lines + ["---"]) + "\n" + body


def named(name: str, **kwargs):
    """A case whose folder is named as the skill (the usual layout)."""
    return name, front_matter(name=name, **kwargs)


# case -> (folder name, SKILL.md text); "my-skill" folders unless the case is about the name
CORPUS = {
    # ---- names
    "name: lower-case with hyphens": named("pdf-tools"),
    "name: one character": named("a"),
    "name: digits only": named("123"),
    "name: 64 characters": named("a" * 64),
    "name: 65 characters": named("a" * 65),
    "name: upper case": named("PDF-Tools"),
    "name: leading hyphen": named("-pdf"),
    "name: trailing hyphen": named("pdf-"),
    "name: double hyphen": named("pdf--tools"),
    "name: underscore": named("pdf_tools"),
    "name: dot": named("pdf.tools"),
    "name: YAML-special word": named("yes"),
    "name: empty": ("my-skill", front_matter(name='""')),
    "name: unicode lower-case letters": named("café"),
    "name: CJK letters": named("日本語"),
    "name: non-ASCII digits": named("١٢٣"),
    "name: unicode upper case": named("ÉCOLE"),
    "name: compatibility ligature (NFKC)": named("ﬁle"),
    "name: quoted with spaces around": ("my-skill", front_matter(name='" my-skill "')),
    "name: differs from folder": ("other-folder", front_matter()),
    "name: differs from folder in case": ("My-Skill", front_matter()),
    # ---- descriptions
    "description: 1024 characters": ("my-skill", front_matter(description="d" * 1024)),
    "description: 1025 characters": ("my-skill", front_matter(description="d" * 1025)),
    "description: 1024 non-ASCII characters": ("my-skill", front_matter(description="é" * 1024)),
    "description: empty": ("my-skill", front_matter(description='""')),
    "description: blank": ("my-skill", front_matter(description='"   "')),
    "description: nothing after the colon": ("my-skill", front_matter(description="")),
    "description: block scalar": ("my-skill", front_matter(description="|\n  Line one.\n  Line two.")),
    "description: single-quoted": ("my-skill", front_matter(description="'it''s for tests'")),
    "description: a number": ("my-skill", front_matter(description="12")),
    "description: a comment after it": ("my-skill", front_matter(description="Use for C# code # a comment")),
    "description: an unquoted ': ' inside": ("my-skill", front_matter(description="Use when: testing")),
    "description: a flow list": ("my-skill", front_matter(description="[a, b]")),
    # ---- what public skills write (minskill's old YAML subset refused the first three)
    "description: plain text continued on indented lines": (
        "my-skill", front_matter(description="Use when a task needs the validators,\n  or when testing them.")),
    "description: nothing on its line, text on the indented lines below": (
        "my-skill", front_matter(description="\n  Use when a task needs the validators.\n  Two lines.")),
    "description: double-quoted over two lines": ("my-skill", front_matter(description='"Use when\n  testing."')),
    "description: folded block": ("my-skill", front_matter(description=">-\n  Use when\n  testing.")),
    "description: a YAML anchor": ("my-skill", front_matter(description="&d Use when testing.")),
    "description: a YAML tag": ("my-skill", front_matter(description="!!str Use when testing.")),
    "fields: comment lines and a trailing comment": ("my-skill", front_matter(extra="# about\nlicense: MIT  # SPDX")),
    # ---- fields
    "fields: missing name": ("my-skill", front_matter(name=None)),
    "fields: missing description": ("my-skill", front_matter(description=None)),
    "fields: unknown field": ("my-skill", front_matter(extra="version: 1.0")),
    "fields: upper-case key": ("my-skill", front_matter().replace("name:", "Name:")),
    "fields: duplicate key": ("my-skill", front_matter(extra="name: my-skill")),
    "fields: license": ("my-skill", front_matter(extra="license: Apache-2.0")),
    "fields: license block": ("my-skill", front_matter(extra="license: |\n  MIT\n  see LICENSE")),
    "compatibility: 500 characters": ("my-skill", front_matter(extra="compatibility: " + "c" * 500)),
    "compatibility: 501 characters": ("my-skill", front_matter(extra="compatibility: " + "c" * 501)),
    "compatibility: empty": ("my-skill", front_matter(extra='compatibility: ""')),
    "metadata: string values": ("my-skill", front_matter(extra="metadata:\n  author: me\n  version: \"1.0\"")),
    "metadata: number value": ("my-skill", front_matter(extra="metadata:\n  version: 1")),
    "metadata: number key": ("my-skill", front_matter(extra="metadata:\n  1: one")),
    "metadata: dotted and hyphenated keys": ("my-skill", front_matter(extra="metadata:\n  a.b: x\n  c-d: y")),
    "metadata: a key with a space": ("my-skill", front_matter(extra="metadata:\n  a b: x")),
    "metadata: nothing after the colon": ("my-skill", front_matter(extra="metadata:")),
    "metadata: a scalar": ("my-skill", front_matter(extra="metadata: some text")),
    "metadata: nested mapping": ("my-skill", front_matter(extra="metadata:\n  a:\n    b: c")),
    "metadata: nested three levels": ("my-skill", front_matter(
        extra="metadata:\n  author:\n    name: me\n    links:\n      home: https://example.org\n  version: 1.10")),
    "metadata: a list of mappings": ("my-skill", front_matter(
        extra="metadata:\n  releases:\n    - version: '1.0'\n      date: 2025-01-01\n    - version: '1.1'")),
    "metadata: list value": ("my-skill", front_matter(extra="metadata:\n  tags:\n    - a\n    - b")),
    "metadata: empty flow mapping": ("my-skill", front_matter(extra="metadata: {}")),
    "allowed-tools: a space-delimited string": ("my-skill", front_matter(extra="allowed-tools: Bash(git:*) Read")),
    "allowed-tools: a YAML list": ("my-skill", front_matter(extra="allowed-tools:\n  - Bash\n  - Read")),
    # ---- the file
    "file: no front matter": ("my-skill", "# Just Markdown\n"),
    "file: front matter not closed": ("my-skill", "---\nname: my-skill\ndescription: d\n"),
    "file: empty": ("my-skill", ""),
    "file: CRLF line ends": ("my-skill", front_matter().replace("\n", "\r\n")),
    "file: UTF-8 byte-order mark": ("my-skill", "\ufeff" + front_matter()),
    "file: '---' rules in the body": ("my-skill", front_matter(body="one\n\n---\n\ntwo\n")),
    "body: empty": ("my-skill", front_matter(body="")),
    "body: 25,000 characters (minskill refused over 20,000 before)": ("my-skill", front_matter(body="word " * 5000)),
    "body: 600 lines (over the recommended 500)": ("my-skill", front_matter(body="A line.\n" * 600)),
    "body: over minskill's 256 KiB file bound": ("my-skill", front_matter(body="x" * MAX_FILE_BYTES)),
}

# cases where the two validators disagree on purpose -> why (docs/formats.md's "skills-ref" section says the same)
DIFFERENCES = {
    "name: unicode lower-case letters": "minskill names are a-z, 0-9 and '-' only: a name becomes a folder name "
                                        "and a path on every file system, and LLM-written names are checked by "
                                        "the same rule; skills-ref accepts any Unicode letter or digit",
    "name: CJK letters": "as above (Unicode letters)",
    "name: non-ASCII digits": "as above (str.isalnum() is true for Arabic-Indic digits)",
    "name: compatibility ligature (NFKC)": "as above; skills-ref NFKC-normalises name and folder first",
    "name: quoted with spaces around": "skills-ref strips the name before checking it; minskill takes the value "
                                       "as written, and ' my-skill ' is not a folder name",
    "description: an unquoted ': ' inside": "minskill reads a one-line plain value holding ': ' as if quoted, as "
                                            "hand-written and LLM-written SKILL.md files expect; YAML (strictyaml, "
                                            "PyYAML) refuses 'mapping values are not allowed here'. minskill always "
                                            "writes such a value quoted, so what it saves is valid YAML",
    "compatibility: empty": "the spec says 1-500 characters if the field is given; skills-ref checks the maximum only",
    "metadata: a scalar": "the spec's metadata is a mapping; skills-ref does not check the type of metadata",
    "metadata: empty flow mapping": "strictyaml (skills-ref's YAML reader) refuses every flow collection, even "
                                    "'{}'; YAML (PyYAML, minskill's reader) allows them",
    "allowed-tools: a YAML list": "the spec's allowed-tools is one space-delimited string; skills-ref does not "
                                  "check its type",
    "file: UTF-8 byte-order mark": "minskill skips a UTF-8 BOM (Windows editors write one); skills-ref reads "
                                   "it as text before '---' and refuses the file",
    "body: over minskill's 256 KiB file bound": "minskill bounds a SKILL.md at 256 KiB (untrusted files are "
                                                "size-bounded); the spec has no size limit, only the "
                                                "recommendation of < 500 lines / < 5,000 tokens",
}
# folder-level cases (built in the test: a link or a lower-case skill.md cannot be given as text)
FOLDER_DIFFERENCES = {
    "skill.md in lower case": "skills-ref accepts skill.md as well as SKILL.md; the spec and minskill name the "
                              "file SKILL.md",
    "a symbolic link in scripts/": "minskill never follows a link in a skill (it would copy what it points to); "
                                   "skills-ref reads SKILL.md only",
}


def minskill_valid(folder) -> tuple[bool, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # long bodies warn; a warning is not a refusal
            Skill.load(folder)
        return True, ""
    except SkillFormatError as error:
        return False, str(error)


def reference_valid(folder) -> tuple[bool, str]:
    errors = skills_ref.validate(folder)
    return not errors, "; ".join(errors)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    folders = {}
    for i, (case, (folder_name, text)) in enumerate(CORPUS.items()):
        folder = root / f"case{i:03d}" / folder_name
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_bytes(text.encode("utf-8"))
        folders[case] = folder
    base = root / "folder-cases"
    lower = base / "lower" / "my-skill"
    lower.mkdir(parents=True)
    (lower / "skill.md").write_text(front_matter(), encoding="utf-8")
    linked = base / "linked" / "my-skill"
    (linked / "scripts").mkdir(parents=True)
    (linked / "SKILL.md").write_text(front_matter(), encoding="utf-8")
    (linked / "scripts" / "run.py").symlink_to(linked / "SKILL.md")
    resources = base / "resources" / "my-skill"
    (resources / "references").mkdir(parents=True)
    (resources / "SKILL.md").write_text(front_matter(), encoding="utf-8")
    (resources / "references" / "api.md").write_text("# API\n", encoding="utf-8")
    folders.update({"skill.md in lower case": lower, "a symbolic link in scripts/": linked,
                    "resources: a references/ file": resources,
                    "resources: a public skill's layout": public_layout(base / "public" / "pdf-forms")})
    folders.update({f"base skill: {p.parent.relative_to(BASE_SKILLS)}": p.parent
                    for p in sorted(BASE_SKILLS.rglob("SKILL.md"))})
    return folders


PUBLIC_SKILL_MD = """---
name: pdf-forms
description: Fill PDF forms and extract their fields. Use when a task involves a PDF form,
  or when the user asks to fill one in.
license: Proprietary. LICENSE.txt has complete terms
metadata:
  author:
    name: Docs team
    links:
      home: https://example.org/skills
  version: 1.10
  tags:
    - pdf
    - forms
---

# PDF forms

Run `scripts/fill.sh FORM.pdf`; read `forms.md` and `templates/` first; `core/` holds the helpers.
"""
PUBLIC_FILES = {"LICENSE.txt": b"Proprietary.\n", "forms.md": b"# Forms\n", "templates/form.html": b"<form></form>\n",
                "core/__init__.py": b"", "core/fields.py": b"FIELDS = []\n", "requirements.txt": b"pypdf\n",
                "scripts/fill.sh": b"#!/bin/sh\necho fill\n", "scripts/office/schemas/ecma/2006/main.xsd": b"<xs/>\n"}


def public_layout(folder: Path) -> Path:
    """A skill folder shaped as public ones are (anthropics/skills' pdf, docx, slack-gif-creator): a
    description continued on an indented line, nested metadata, files beside SKILL.md, other folders, an
    executable script, a schema six folders down."""
    for rel, data in PUBLIC_FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    (folder / "SKILL.md").write_text(PUBLIC_SKILL_MD, encoding="utf-8")
    (folder / "scripts/fill.sh").chmod(0o755)
    return folder


def test_the_corpus_has_valid_and_invalid_cases_of_each_kind(corpus):
    verdicts = {case: reference_valid(folder)[0] for case, folder in corpus.items()}
    for kind in ("name", "description", "fields", "compatibility", "metadata", "allowed-tools", "file", "body"):
        seen = {verdicts[c] for c in verdicts if c.startswith(kind + ":")}
        assert seen == {True, False} or kind in ("body", "allowed-tools"), (kind, seen)
    assert sum(verdicts.values()) >= 20 and len(verdicts) - sum(verdicts.values()) >= 20


def test_minskill_and_skills_ref_agree_on_every_case_but_the_listed_differences(corpus):
    listed = {**DIFFERENCES, **FOLDER_DIFFERENCES}
    assert set(listed) <= set(corpus), set(listed) - set(corpus)
    disagreements, stale = [], []
    for case, folder in corpus.items():
        (mine, why_mine), (ref, why_ref) = minskill_valid(folder), reference_valid(folder)
        if case in listed and mine == ref:
            stale.append(case)
        elif case not in listed and mine != ref:
            disagreements.append(f"{case}: minskill {'valid' if mine else 'invalid (' + why_mine + ')'}, "
                                 f"skills-ref {'valid' if ref else 'invalid (' + why_ref + ')'}")
    assert not disagreements, "\n".join(disagreements)
    assert not stale, f"listed as differences but the validators now agree: {stale}"


def test_the_differences_go_the_documented_way(corpus):
    """Only the BOM and '{}' are cases minskill accepts and skills-ref refuses, besides the ': ' leniency."""
    minskill_only = {c for c in {**DIFFERENCES, **FOLDER_DIFFERENCES} if minskill_valid(corpus[c])[0]}
    assert minskill_only == {"file: UTF-8 byte-order mark", "metadata: empty flow mapping",
                             "description: an unquoted ': ' inside"}


def test_what_minskill_saves_of_each_skill_it_loads_is_valid_for_skills_ref_and_reads_back_the_same(corpus, tmp_path):
    loaded = 0
    for i, (case, folder) in enumerate(corpus.items()):
        if not minskill_valid(folder)[0]:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            skill = Skill.load(folder)
            saved = skill.save(tmp_path / f"out{i}")
            again = Skill.load(saved)
        assert reference_valid(saved) == (True, ""), case
        assert again == skill and again.to_skill_md() == skill.to_skill_md(), case
        loaded += 1
    assert loaded >= 50


def test_a_public_skills_forms_load_and_its_folder_travels_whole(corpus, tmp_path):
    """Issue 25: minskill refused this folder (continued description, nested metadata) and, once loaded, kept
    scripts/ only: LICENSE.txt, forms.md, templates/, core/, requirements.txt and the exec bit were lost."""
    skill = Skill.load(corpus["resources: a public skill's layout"])
    assert skill.description.endswith("PDF form, or when the user asks to fill one in.")
    assert skill.metadata["author"]["links"] == {"home": "https://example.org/skills"}
    assert skill.metadata["version"] == "1.10" and skill.metadata["tags"] == ["pdf", "forms"]
    saved = skill.save(tmp_path)
    files = {p.relative_to(saved).as_posix(): p.read_bytes() for p in saved.rglob("*") if p.is_file()}
    assert files.pop("SKILL.md") and files == PUBLIC_FILES
    assert [p.relative_to(saved).as_posix() for p in saved.rglob("*") if p.is_file() and os.access(p, os.X_OK)] \
        == ["scripts/fill.sh"]


@pytest.mark.skipif(shutil.which("agentskills") is None, reason="the agentskills command is not installed")
@pytest.mark.parametrize("case, valid", [("name: lower-case with hyphens", True), ("name: double hyphen", False),
                                         ("fields: unknown field", False), ("resources: a public skill's layout", True),
                                         ("metadata: nested three levels", True)])
def test_the_agentskills_command_agrees_on_a_few_cases(corpus, case, valid):
    result = subprocess.run(["agentskills", "validate", str(corpus[case])], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert (result.returncode == 0) == valid == minskill_valid(corpus[case])[0], result.stdout + result.stderr


def test_minskill_never_imports_skills_ref():
    root = Path(__file__).resolve().parent.parent
    sources = [*(root / "minskill").rglob("*.py"), *root.glob("*.py")]
    assert sources and not [p for p in sources if re.search(r"^\s*(?:import|from)\s+skills_ref", p.read_text(
        encoding="utf-8"), re.M)]
