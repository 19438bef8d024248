"""Skills: SKILL.md round trips, spec violations are rejected with messages naming file and line, untrusted
names never become paths, and what we write means the same to a real YAML reader (skill sets, MASA JSON and
rendering: test_skillsets.py)."""
import pytest

from helpers import make_skill
from minskill.replies import parse_skill
from minskill.skills import MAX_FILE_BYTES, Skill, SkillFormatError, slugify, validate_name
from minskill.skillsets import SkillSet

TRICKY_STRINGS = ["Use when: counting", "- starts like a list", "true", "123", "1.5", "null", "# hash",
                  "ends with colon:", "trailing space ", " leading space", "quote \" and 'single'",
                  "line one\nline two", "tab\there", "ünïcödé ✓ 漢字", "a # comment-like", "{not: flow}",
                  "back\\slash", "emoji 🎉", "'quoted'", "2024-01-01", "yes", "~", "C# is fine",
                  "del\x7fchar", "nbsp\u00a0and\u2028separator"]


# --------------------------------------------------------------------------- SKILL.md

@pytest.mark.parametrize("text", TRICKY_STRINGS)
def test_skill_md_round_trips_any_description_and_metadata(tmp_path, text):
    skill = make_skill(description=text.strip() or "x", metadata={"title": text, "note": text})
    folder = skill.save(tmp_path)
    assert folder == tmp_path / skill.name
    assert Skill.load(folder) == skill
    assert Skill.from_skill_md(skill.to_skill_md()) == skill


@pytest.mark.parametrize("body", ["", "x", "x\n", "\nstarts blank", "ends blank\n\n", "---\nnot front matter",
                                  "a\r\nwindows", "```python\nprint(1)\n```"])
def test_skill_md_keeps_the_body_exactly(tmp_path, body):
    skill = make_skill(body=body)
    assert Skill.load(skill.save(tmp_path)).body == body


def test_skill_md_file_layout(tmp_path):
    skill = make_skill(metadata={"title": "Count carefully", "version": "1.0"}, license="MIT",
                   compatibility="any chat model", allowed_tools="Read")
    text = (skill.save(tmp_path) / "SKILL.md").read_text()
    assert text == ("---\nname: count-carefully\ndescription: Use when a question asks for a count.\n"
                    "license: MIT\ncompatibility: any chat model\nallowed-tools: Read\nmetadata:\n"
                    "  title: Count carefully\n  version: \"1.0\"\n---\n\n# Count carefully\n\nTick items.\n")
    assert Skill.load(tmp_path / "count-carefully") == skill


def test_front_matter_subset_hand_written():
    text = ("---\n# a comment\nname: counting\ndescription: >\n  Use when counting\n  things in lists.\n\n"
            "  Second paragraph.\nlicense: 'it''s MIT'  # trailing comment\ncompatibility: \"tab\\tand \\u00e9\"\n"
            "metadata:\n  title: Counting\n  steps: |\n    1. tick\n    2. count\n  empty:\n  plain: a\n"
            "    continued\n---\nBody\n")
    skill = Skill.from_skill_md(text)
    assert skill.description == "Use when counting things in lists.\nSecond paragraph.\n"
    assert skill.license == "it's MIT"
    assert skill.compatibility == "tab\tand é"
    assert skill.metadata == {"title": "Counting", "steps": "1. tick\n2. count\n", "empty": "", "plain": "a continued"}
    assert skill.body == "Body"
    assert skill.title == "Counting"


def test_block_scalar_chomping():
    head = "---\nname: x\ndescription: d\nmetadata:\n"
    assert Skill.from_skill_md(head + "  a: |-\n    one\n\n---\n").metadata["a"] == "one"
    assert Skill.from_skill_md(head + "  a: |+\n    one\n\n---\n").metadata["a"] == "one\n\n"
    assert Skill.from_skill_md(head + "  a: >-\n    one\n    two\n---\n").metadata["a"] == "one two"


@pytest.mark.parametrize("text, message", [
    ("name: x\n---\n", r"SKILL.md, line 1: SKILL.md must start with a '---' line"),
    ("---\nname: x\ndescription: d\n", r"front matter is not closed"),
    ("---\ndescription: d\n---\n", r"front matter has no 'name'"),
    ("---\nname: x\n---\n", r"front matter has no 'description'"),
    ("---\nname: Count\ndescription: d\n---\n", r"'Count' has upper-case letters"),
    ("---\nname: -count\ndescription: d\n---\n", r"starts or ends with '-'"),
    ("---\nname: count-\ndescription: d\n---\n", r"starts or ends with '-'"),
    ("---\nname: co--unt\ndescription: d\n---\n", r"double hyphen"),
    ("---\nname: co_unt\ndescription: d\n---\n", r"characters outside a-z, 0-9 and '-': \['_'\]"),
    (f"---\nname: {'a' * 65}\ndescription: d\n---\n", r"is 65 characters; at most 64"),
    ("---\nname: x\ndescription: ''\n---\n", r"description is empty"),
    (f"---\nname: x\ndescription: {'d' * 1025}\n---\n", r"description is 1025 characters; at most 1024"),
    (f"---\nname: x\ndescription: d\n---\n{'b' * (MAX_FILE_BYTES + 1)}", r"body is 262145 bytes"),
    ("---\nname: x\ndescription: d\nversion: 1\n---\n", r"unexpected front-matter field\(s\) \['version'\]"),
    ("---\nname: x\ndescription: d\ntags:\n  - a\n---\n", r"unexpected front-matter field\(s\) \['tags'\]"),
    ("---\nname: x\ndescription: [a, b]\n---\n", r"SKILL.md: description must be one text value, not a list"),
    ("---\nname: x\ndescription: \"open\n---\n", r"line 3: not valid YAML: while scanning a quoted scalar, found unexpected end"),
    ("---\nname: x\ndescription: 'open\n---\n", r"line 3: not valid YAML: while scanning a quoted scalar, found unexpected end"),
    ("---\nname: x\n\tdescription: d\n---\n", r"line 3: not valid YAML: .*found character .* that cannot start any token"),
    ("---\nname: x\nname: y\ndescription: d\n---\n", r"line 3: duplicate key 'name'"),
    ("---\nname: x\ndescription: *ref\n---\n", r"line 3: not valid YAML: YAML anchors and aliases"),
    ("---\nname: x\ndescription: d\njust text\n---\n", r"line 4: not valid YAML: while scanning a simple key, could not find expected ':'"),
    ("---\nname: x\ndescription: d\nmetadata: text\n---\n", r"metadata must be an indented mapping"),
    ("---\nname: x\ndescription: a\x7fb\n---\n", r"line 3: not valid YAML: character U\+007F is not allowed"),
    ("---\nname: x\ndescription: d\ncompatibility: ''\n---\n", r"compatibility must be 1-500"),
    ("---\nname: x\ndescription: \"\\q\"\n---\n", r"line 3: not valid YAML: while scanning a double-quoted scalar, found unknown escape character 'q'"),
])
def test_spec_violations_are_rejected_with_clear_messages(text, message):
    with pytest.raises(SkillFormatError, match=message):
        Skill.from_skill_md(text, where="SKILL.md")


def test_name_must_equal_folder_name(tmp_path):
    folder = tmp_path / "other-name"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: count\ndescription: d\n---\n")
    with pytest.raises(SkillFormatError, match=r"other-name/SKILL.md: name 'count' differs from its folder name"):
        Skill.load(folder)
    with pytest.raises(SkillFormatError, match="no SKILL.md"):
        Skill.load(tmp_path)


def test_non_utf8_and_oversized_files_are_refused(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "SKILL.md").write_bytes(b"---\nname: x\ndescription: \xff\n---\n")
    with pytest.raises(SkillFormatError, match="not UTF-8"):
        Skill.load(folder)
    (folder / "SKILL.md").write_text("---\nname: x\ndescription: d\n---\n" + "b" * 300_000)
    with pytest.raises(SkillFormatError, match="bytes; at most"):
        Skill.load(folder)


def test_written_front_matter_means_the_same_to_a_real_yaml_reader():
    yaml = pytest.importorskip("yaml")  # cross-check with yaml.safe_load, which types values (minskill keeps text)
    for text in TRICKY_STRINGS:
        skill = make_skill(description=text, metadata={"title": text, "n": "42"})
        front = skill.to_skill_md().split("---\n")[1]
        expected = {"name": skill.name, "description": text, "metadata": {"title": text, "n": "42"}}
        assert yaml.safe_load(front) == expected


def test_nested_metadata_and_any_text_keys_round_trip_as_yaml_reads_them():
    yaml = pytest.importorskip("yaml")
    metadata = {"author": {"name": "me", "links": {"home": "https://example.org", "tags": ["a", "yes", "1.10"]}},
                "a key: with a colon": "v", "1": "one", "empty": {}, "none": [], "rows": [{"k": "v", "j": "w"}, ["x"]]}
    skill = make_skill(metadata=metadata)
    text = skill.to_skill_md()
    assert Skill.from_skill_md(text) == skill and Skill.from_skill_md(text).to_skill_md() == text
    assert yaml.safe_load(text.split("---\n")[1])["metadata"] == metadata


def test_front_matter_is_read_as_yaml_keeping_every_value_as_its_text():
    """Issue 25: public skills continue a plain description on indented lines and nest metadata; the old
    hand-written reader refused both."""
    text = ("---\n# a comment\nname: my-skill\ndescription:\n  Use when a task needs\n  two lines.\n"
            "license: Complete terms in\n  LICENSE.txt\nmetadata:\n  version: 1.10\n  beta: yes\n  owner:\n"
            "    team:\n      name: docs\n  notes: \"one\n    two\"\n---\nBody.\n")
    skill = Skill.from_skill_md(text)
    assert skill.description == "Use when a task needs two lines." and skill.license == "Complete terms in LICENSE.txt"
    assert skill.metadata == {"version": "1.10", "beta": "yes", "owner": {"team": {"name": "docs"}}, "notes": "one two"}
    assert Skill.from_skill_md(skill.to_skill_md()) == skill
    # the old reader's one leniency stays: a one-line plain value holding ': ' (YAML refuses it)
    assert Skill.from_skill_md("---\nname: x\ndescription: Use when: adding # note\n---\n").description == "Use when: adding"


@pytest.mark.parametrize("front, message", [
    ("description: d\nmetadata:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 20)) + "  " * 20 + "v: x\n",
     r"SKILL.md, line 19: not valid YAML: nested more than 16 levels deep"),
    ("description: d\nmetadata: " + "[" * 100_000 + "\n", r"SKILL.md, line 4: .*nested more than 16 levels"),
    ("description: &a d\nmetadata:\n  b: [*a, *a]\n", r"line 3: not valid YAML: YAML anchors and aliases"),
    ("description: !!python/object:os.system d\n", r"line 3: not valid YAML: YAML tags"),
])
def test_yaml_that_could_blow_up_or_run_code_is_refused_naming_the_file(front, message):
    with pytest.raises(SkillFormatError, match=message):
        Skill.from_skill_md("---\nname: x\n" + front + "---\n", where="SKILL.md")


# --------------------------------------------------------------------------- untrusted names

@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", "a\\b", ".hidden", "..", "", "x" * 65,
                                  "Upper", "with space", "tab\tname", "nul\x00", "ünï", "-x", "x-", "a--b", None, 3])
def test_validate_name_rejects_unsafe_names(name):
    with pytest.raises(SkillFormatError):
        validate_name(name)


@pytest.mark.parametrize("text, slug", [
    ("../x", "x"), ("/etc/passwd", "etc-passwd"), ("C:\\Windows\\system32", "c-windows-system32"),
    ("Ünïcödé Name!", "unicode-name"), ("  --Count -- Carefully--  ", "count-carefully"), ("", "skill"),
    ("!!!", "skill"), ("漢字", "skill"), ("a" * 100, "a" * 64), ("word " * 20, ("word-" * 13)[:64].rstrip("-")),
])
def test_slugify_repairs_names(text, slug):
    assert slugify(text) == slug
    assert validate_name(slugify(text)) == slug


def test_unsafe_names_never_become_paths(tmp_path):
    target = tmp_path / "inside"
    target.mkdir()
    for bad in ("../escaped", "/abs/olute", "a/b"):
        with pytest.raises(SkillFormatError):
            Skill(name=bad, description="d").save(target)
        with pytest.raises(SkillFormatError):
            SkillSet(general=[Skill(name=bad, description="d")]).save(tmp_path / "set")
        with pytest.raises(SkillFormatError):
            SkillSet(task_specific={bad: []}).save(tmp_path / "set")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inside"]
    assert not list(target.iterdir())
    # a name that comes from an LLM reply is slugged
    skill = parse_skill("---\nname: ../../etc/cron.d/evil\ndescription: d\n---\nbody")
    assert skill.name == "etc-cron-d-evil"
