"""Whole Agent Skills: every file of a skill's folder travels with it (byte for byte, with its exec bit,
bounded, never executed, links refused); long bodies warn instead of failing; prompts name the resources."""
import os
import warnings

import pytest

from minskill import skills as skills_module
from minskill.masa import search as masa, teacher as masa_teacher
from minskill.masa.model_card import ModelCard
from minskill.replies import parse_skillset
from minskill.rollout import skill_text
from minskill.skill_r1.loop import Instance, editor_messages
from minskill.skills import (MAX_FILE_BYTES, MAX_RESOURCE_BYTES, MAX_RESOURCE_DEPTH, MAX_RESOURCE_FILES,
                             ExecutableBytes, Skill, SkillFormatError, SkillWarning)
from minskill.skillsets import SkillSet
from minskill.tasks import Task

# in the form minskill writes (a blank line after the front matter), so that the whole folder compares equal
SKILL_MD = "---\nname: pdf-tools\ndescription: Use when a task involves PDF files.\n---\n\n# PDF tools\n\nRun scripts/extract.py.\n"
RESOURCES = {
    "scripts/extract.py": b"#!/usr/bin/env python3\nimport sys\nopen('RAN', 'w').write('executed')\n",
    "scripts/helpers/util.sh": b"#!/bin/sh\ntouch RAN_SH\n",
    "references/api.md": "# API\n\nUnicode \u00e9\u00e8 and CRLF\r\nkept.\r\n".encode("utf-8"),
    "assets/logo.bin": bytes(range(256)) * 4,
    "assets/empty.txt": b"",
}


def make_skill_folder(parent, name="pdf-tools", files=RESOURCES, skill_md=SKILL_MD):
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(skill_md.replace("pdf-tools", name), encoding="utf-8")
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def tree_bytes(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- round trip

def test_a_skill_folder_with_resources_round_trips_byte_for_byte(tmp_path):
    source = make_skill_folder(tmp_path / "in")
    skill = Skill.load(source)
    assert skill.resources == RESOURCES
    saved = skill.save(tmp_path / "out")
    assert tree_bytes(saved) == tree_bytes(source)          # SKILL.md and every resource, byte for byte
    assert Skill.load(saved) == skill


def test_a_skill_set_carries_resources_of_general_and_task_skills(tmp_path):
    general = Skill.load(make_skill_folder(tmp_path / "src"))
    typed = Skill(name="lookup", description="Use for lookups.", body="Read references/table.md.",
                  resources={"references/table.md": b"| a | b |\n"})
    skill_set = SkillSet(general=[general], task_specific={"lookup": [typed]}, common_mistakes=["m"])
    folder = skill_set.save(tmp_path / "set")
    assert (folder / "general/pdf-tools/assets/logo.bin").read_bytes() == RESOURCES["assets/logo.bin"]
    assert (folder / "task-specific/lookup/lookup/references/table.md").read_bytes() == b"| a | b |\n"
    again = SkillSet.load(folder)
    assert again == skill_set
    assert tree_bytes(again.save(tmp_path / "set2")) == tree_bytes(folder)


def test_resources_are_never_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    skill = Skill.load(make_skill_folder(tmp_path / "in"))
    skill.save(tmp_path / "out")
    SkillSet(general=[skill]).render("any")
    assert not (tmp_path / "RAN").exists() and not (tmp_path / "RAN_SH").exists()
    assert not os.access(tmp_path / "out/pdf-tools/scripts/extract.py", os.X_OK)   # it was not executable


def test_every_file_of_the_folder_travels_but_dot_files(tmp_path):
    """Issue 25: a LICENSE.txt, a file beside SKILL.md and a folder the body names (not scripts/,
    references/ or assets/) were dropped with a warning; now the whole folder travels."""
    files = {"scripts/a.py": b"x", "LICENSE.txt": b"MIT", "forms.md": b"# Forms", "core/lib/util.py": b"u = 1\n",
             "templates/page.html": b"<p>", "skill.md": b"a second file of that name"}
    folder = make_skill_folder(tmp_path / "in", files={**files, ".hidden": b"h", ".git/config": b"[core]"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # nothing is left out, so nothing warns
        skill = Skill.load(folder)
    assert skill.resources == files
    saved = skill.save(tmp_path / "out")
    assert tree_bytes(saved) == {k: v for k, v in tree_bytes(folder).items() if not k.startswith(".")}


def test_executable_files_keep_their_exec_bit(tmp_path):
    folder = make_skill_folder(tmp_path / "in", files={"scripts/run.sh": b"#!/bin/sh\n", "bin/tool": b"#!/bin/sh\n",
                                                        "scripts/data.txt": b"d"})
    (folder / "scripts/run.sh").chmod(0o755)
    (folder / "bin/tool").chmod(0o700)
    skill = Skill.load(folder)
    assert {rel for rel, data in skill.resources.items() if isinstance(data, ExecutableBytes)} == {"scripts/run.sh",
                                                                                                  "bin/tool"}
    for saved in (skill.save(tmp_path / "out"), SkillSet(general=[skill]).save(tmp_path / "set") / "general/pdf-tools",
                  Skill.load(tmp_path / "out/pdf-tools").save(tmp_path / "again")):
        modes = {rel: (saved / rel).stat().st_mode & 0o777 for rel in skill.resources}
        assert modes == {"scripts/run.sh": 0o755, "bin/tool": 0o755, "scripts/data.txt": 0o644}, saved
    rewritten = parse_skillset(SkillSet(general=[skill]).to_markdown()).carry_resources(SkillSet(general=[skill]))
    assert isinstance(rewritten.general[0].resources["scripts/run.sh"], ExecutableBytes)   # an LLM rewrite keeps it


# ---------------------------------------------------------------------------------------------- bounds

def test_documented_bounds():
    assert (MAX_RESOURCE_FILES, MAX_RESOURCE_BYTES, MAX_RESOURCE_DEPTH, MAX_FILE_BYTES) == (
        1000, 50 * 1024 * 1024, 16, 256 * 1024)


def test_too_many_resource_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(skills_module, "MAX_RESOURCE_FILES", 20)
    files = {f"references/r{i:03d}.md": b"x" for i in range(20 + 1)}
    with pytest.raises(SkillFormatError, match=r"pdf-tools: resources exceed 20 files"):
        Skill.load(make_skill_folder(tmp_path, files=files))
    ok = {f"references/r{i:03d}.md": b"x" for i in range(20)}
    assert len(Skill.load(make_skill_folder(tmp_path / "ok", files=ok)).resources) == 20
    with pytest.raises(SkillFormatError, match=r"21 resource files; at most 20"):
        Skill(name="x", description="d", resources={**ok, "assets/one-more": b""}).validate()


def test_too_many_resource_bytes_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(skills_module, "MAX_RESOURCE_BYTES", 1000)
    with pytest.raises(SkillFormatError, match=r"exceed \d+ files or 1000 bytes \(at assets/big\.bin\)"):
        Skill.load(make_skill_folder(tmp_path, files={"assets/a.bin": b"a" * 600, "assets/big.bin": b"b" * 600}))
    with pytest.raises(SkillFormatError, match=r"resources are 1001 bytes; at most 1000"):
        Skill(name="x", description="d", resources={"assets/a": b"a" * 1001}).save(tmp_path / "out")


def test_a_skill_md_over_the_file_size_bound_is_refused(tmp_path):
    folder = make_skill_folder(tmp_path, files={}, skill_md=SKILL_MD + "x" * MAX_FILE_BYTES)
    with pytest.raises(SkillFormatError, match=r"SKILL\.md: \d+ bytes; at most 262144"):
        Skill.load(folder)


# ---------------------------------------------------------------------------------------------- links and paths

@pytest.mark.parametrize("where", ["scripts/link.py", "references", "assets/sub/inner", "LICENSE.txt", "docs/inner"])
def test_symbolic_links_are_refused_naming_the_path(tmp_path, where):
    folder = make_skill_folder(tmp_path, files={"scripts/real.py": b"x", "assets/sub/file": b"y"})
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret").write_text("secret")
    link = folder / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target / "secret" if where.endswith(".py") else target)
    with pytest.raises(SkillFormatError, match=rf"{link}: symbolic links are refused"):
        Skill.load(folder)


def test_saving_never_writes_through_an_existing_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    parent = tmp_path / "out"
    (parent / "x").mkdir(parents=True)
    (parent / "x" / "scripts").symlink_to(outside)
    with pytest.raises(SkillFormatError, match=r"scripts: exists and is not a folder"):
        Skill(name="x", description="d", resources={"scripts/a.py": b"x"}).save(parent)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("rel", ["../escape", "scripts/../../escape", "..", "./x", "SKILL.md", "scripts/.hidden",
                                 ".git/config", "/etc/passwd", "scripts//a", "scripts/a\\..\\b", "a\nb", "nul\x00",
                                 "assets/" + "a/" * 16 + "f"])
def test_resource_paths_are_validated_before_they_become_files(tmp_path, rel):
    skill = Skill(name="x", description="d", resources={rel: b"data"})
    with pytest.raises(SkillFormatError, match=r"resource"):
        skill.save(tmp_path)
    assert not (tmp_path / "escape").exists()


def test_a_resource_cannot_be_a_file_and_a_folder_of_others(tmp_path):
    with pytest.raises(SkillFormatError, match=r"resource 'scripts' is a file and a folder"):
        Skill(name="x", description="d", resources={"scripts": b"a", "scripts/run.sh": b"b"}).save(tmp_path)


# ---------------------------------------------------------------------------------------------- long bodies

def test_a_long_body_warns_but_loads(tmp_path):
    long_lines = SKILL_MD + "line\n" * 600
    with pytest.warns(SkillWarning, match=r"body is 60\d lines.*recommends < 500 lines"):
        assert len(Skill.load(make_skill_folder(tmp_path / "a", files={}, skill_md=long_lines)).body) > 3000
    many_tokens = SKILL_MD + "word " * 5000     # 25,000 characters, once refused at 20,000
    with pytest.warns(SkillWarning, match=r"~\d+ tokens"):
        Skill.load(make_skill_folder(tmp_path / "b", files={}, skill_md=many_tokens))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Skill.load(make_skill_folder(tmp_path / "c", files={}))   # a short body: no warning


# ---------------------------------------------------------------------------------------------- prompts

def _library(tmp_path):
    skill = Skill.load(make_skill_folder(tmp_path / "src"))
    return SkillSet(general=[skill], task_specific={"math": [Skill(name="add", description="Adding.",
                                                                    resources={"assets/table.csv": b"1,2\n"})]})


def test_the_task_model_prompt_lists_resources_by_name_only(tmp_path):
    text = skill_text(_library(tmp_path), "math")
    assert "scripts/extract.py" in text and "references/api.md" in text and "assets/table.csv" in text
    assert "open('RAN'" not in text and "# API" not in text     # names, never contents
    assert "scripts/extract.py" in Skill.load(tmp_path / "src" / "pdf-tools").render()


def test_the_skill_r1_editor_sees_the_resource_names(tmp_path):
    tasks = [Task(id="t1", type="math", question="1+1?", answer="2", verifier="exact")]
    messages = editor_messages(Instance("i", "math", tasks), skill_text(_library(tmp_path), "math"), 0.5, [],
                               lambda m: sum(len(x["content"]) for x in m) // 4, context_tokens=100_000)
    assert "scripts/helpers/util.sh" in messages[-1]["content"]


def test_the_masa_teacher_prompts_list_resources_and_a_rewrite_keeps_them(tmp_path):
    library, card = _library(tmp_path), ModelCard(name="t")
    prompts = [masa_teacher.attribution_messages(card, library, [], 0.5),
               masa_teacher.attribution_messages(card, library, [], 0.5, "math"),
               masa_teacher.general_rewrite_messages(card, library, 0.5, None, [(library, 0.5)]),
               masa_teacher.task_rewrite_messages(card, library, "math", 0.5, None, ["1+1?"]),
               masa_teacher.oneshot_messages(card, library, "maths")]
    for messages, expected in zip(prompts, ["scripts/extract.py", "assets/table.csv", "scripts/extract.py",
                                            "assets/table.csv", "references/api.md"]):
        user = messages[-1]["content"]
        assert expected in user and "kept as they are" in user and "open('RAN'" not in user
    rewritten = parse_skillset(library.to_markdown().replace("Run scripts/extract.py.", "Run it."))
    assert all(not s.resources for s in rewritten.skills())           # the teacher writes SKILL.md only ...
    carried = rewritten.carry_resources(library)                      # ... the resources come back by name
    assert carried.general[0].body.endswith("Run it.") and carried.general[0].resources == RESOURCES
    assert carried.task_specific["math"][0].resources == {"assets/table.csv": b"1,2\n"}
    renamed = parse_skillset(library.to_markdown().replace("name: pdf-tools", "name: pdf-kit"))
    assert renamed.carry_resources(library).general[0].resources == {}


def test_masa_search_candidates_keep_the_base_resources_in_prompts_and_after_resume(tmp_path):
    base, card = _library(tmp_path), ModelCard(name="t")
    tasks = [Task(id="t1", type="math", question="1+1?", answer="2", verifier="exact")]
    search = masa.MasaSearch(None, None, card, tasks, base, masa.MasaConfig())
    root = search.add_candidate(base, "base")
    reply = parse_skillset(base.to_markdown().replace("Run scripts/extract.py.", "Run it."))   # SKILL.md only
    child = search.add_candidate(reply, "general", parent=root, iteration=1)
    assert child.skills.general[0].body.endswith("Run it.") and child.skills.general[0].resources == RESOURCES
    # the teacher's next rewrite and the task model's prompt both name the files of the candidate being edited
    user = masa_teacher.general_rewrite_messages(card, child.skills, 0.5, None,
                                                 [(child.skills, 0.5)])[-1]["content"]
    assert "scripts/helpers/util.sh" in user                  # general skills only: the general rewrite
    task_prompt = masa_teacher.task_rewrite_messages(card, child.skills, "math", 0.5, None, ["1+1?"])
    assert "assets/table.csv" in task_prompt[-1]["content"]
    assert "references/api.md" in skill_text(child.skills, "math")
    # state.json holds MASA JSON (no resources): a resumed search gives the candidates the same files back
    resumed = masa.MasaSearch(None, None, card, tasks, base, masa.MasaConfig(), state=search.to_json())
    for before, after in zip(search.candidates, resumed.candidates):
        assert [s.resources for s in after.skills.skills()] == [s.resources for s in before.skills.skills()]
        assert masa_teacher._skills_text(after.skills) == masa_teacher._skills_text(before.skills)
    assert "resources" not in str(search.to_json())
