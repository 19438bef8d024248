"""minskill's SKILL.md validation agrees with the Agent Skills reference validator.

`skills-ref` (PyPI; its command is `agentskills validate DIR`) is a test-only reference, like transformers:
minskill never imports it. A corpus of valid and invalid skill folders is generated here; for every case,
minskill's loader (Skill.load: it validates as it reads) and skills_ref.validate must say the same (valid or
not), except for the cases in DIFFERENCES, each with the reason. The test also checks that each listed
difference is still a difference, so the list stays true as either side changes."""
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from minskill.skills import MAX_FILE_BYTES, Skill, SkillFormatError

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

# cases where the two validators disagree on purpose -> why (the README's "skills-ref" section says the same)
DIFFERENCES = {
    "name: unicode lower-case letters": "minskill names are a-z, 0-9 and '-' only: a name becomes a folder name "
                                        "and a path on every file system, and LLM-written names are checked by "
                                        "the same rule; skills-ref accepts any Unicode letter or digit",
    "name: CJK letters": "as above (Unicode letters)",
    "name: non-ASCII digits": "as above (str.isalnum() is true for Arabic-Indic digits)",
    "name: compatibility ligature (NFKC)": "as above; skills-ref NFKC-normalises name and folder first",
    "name: quoted with spaces around": "skills-ref strips the name before checking it; minskill takes the value "
                                       "as written, and ' my-skill ' is not a folder name",
    "description: an unquoted ': ' inside": "minskill's reader takes a plain scalar to the end of its line, as "
                                            "hand-written SKILL.md files expect; YAML (strictyaml, PyYAML) refuses "
                                            "'mapping values are not allowed here'. minskill always writes such a "
                                            "value quoted, so what it saves is valid YAML",
    "compatibility: empty": "the spec says 1-500 characters if the field is given; skills-ref checks the maximum only",
    "metadata: a key with a space": "minskill's small YAML reader/writer takes keys of letters, digits, '_', '.' "
                                    "and '-' (they are written unquoted); YAML allows any string key",
    "metadata: a scalar": "the spec's metadata is a mapping of strings to strings; skills-ref does not check the "
                          "type of metadata",
    "metadata: nested mapping": "as above: values must be strings (skills-ref turns any value into str())",
    "metadata: list value": "as above",
    "metadata: empty flow mapping": "strictyaml (skills-ref's YAML reader) refuses every flow collection, even "
                                    "'{}'; YAML allows it, and minskill reads '{}' as an empty mapping",
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
                    "resources: a references/ file": resources})
    return folders


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


def test_what_minskill_saves_from_a_lenient_file_is_valid_for_skills_ref(corpus, tmp_path):
    for case in ("description: an unquoted ': ' inside", "metadata: empty flow mapping", "file: UTF-8 byte-order mark",
                 "description: block scalar", "metadata: number key"):
        saved = Skill.load(corpus[case]).save(tmp_path / f"out{abs(hash(case))}")
        assert reference_valid(saved) == (True, ""), case


@pytest.mark.skipif(shutil.which("agentskills") is None, reason="the agentskills command is not installed")
@pytest.mark.parametrize("case, valid", [("name: lower-case with hyphens", True), ("name: double hyphen", False),
                                         ("fields: unknown field", False)])
def test_the_agentskills_command_agrees_on_a_few_cases(corpus, case, valid):
    result = subprocess.run(["agentskills", "validate", str(corpus[case])], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert (result.returncode == 0) == valid == minskill_valid(corpus[case])[0], result.stdout + result.stderr


def test_minskill_never_imports_skills_ref():
    root = Path(__file__).resolve().parent.parent
    sources = [*(root / "minskill").rglob("*.py"), *root.glob("*.py")]
    assert sources and not [p for p in sources if re.search(r"^\s*(?:import|from)\s+skills_ref", p.read_text(
        encoding="utf-8"), re.M)]
