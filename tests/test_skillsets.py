"""Skill sets: folders round trip, MASA JSON -> folders -> JSON is lossless, untrusted index files and links
are refused, rendering respects the token budget, and a save killed at any point loses nothing."""
import json
import os
import shutil
from pathlib import Path

import pytest

from helpers import make_skill, masa_library, render_set
from minskill.skills import MAX_FILE_BYTES, Skill, SkillFormatError
from minskill.skillsets import Mistake, SkillSet, recover_save
from minskill.tasks import load_suite, suite_types

BASE_SKILLS = Path(__file__).resolve().parents[1] / "minskill" / "tasks" / "base_skills"


# --------------------------------------------------------------------------- skill sets and MASA JSON

def test_masa_json_to_folders_to_json_is_lossless(tmp_path):
    library = masa_library()
    skillset = SkillSet.from_json(json.loads(json.dumps(library)))
    folder = skillset.save(tmp_path / "set")
    assert sorted(p.name for p in folder.iterdir()) == ["SKILLSET.md", "general", "task-specific"]
    assert sorted(p.name for p in (folder / "general").iterdir()) == ["etc-passwd", "gen-001", "gen-001-2",
                                                                      "no-id-at-all"]
    again = SkillSet.load(folder)
    assert again.to_json() == library
    assert json.dumps(again.to_json()) == json.dumps(library)  # same key order too
    # and through a .json file
    again.save_json(tmp_path / "library.json")
    assert SkillSet.load(tmp_path / "library.json").to_json() == library
    # the folder form is the Agent Skills layout
    skill = Skill.load(folder / "task-specific" / "pick_and_place" / "pp-001")
    assert skill.description == "put tasks" and skill.body == "Go, take, go, put."
    assert skill.metadata["score"] == "0.5" and skill.metadata["tags"] == '["a", "b"]'


def test_masa_sections_may_be_missing():
    for library in ({"general_skills": []}, {"task_specific_skills": {"a": []}}, {"common_mistakes": ["x"]}, {}):
        assert SkillSet.from_json(library).to_json() == library


def test_mistakes_keep_their_fields_and_read_as_text():
    skillset = SkillSet.from_json(masa_library())
    mistake = skillset.common_mistakes[1]
    assert isinstance(mistake, Mistake) and isinstance(mistake, str)
    assert mistake == ("Looping Why it happens: no memory How to avoid: Try another place --> then report")
    assert mistake.fields["mistake_id"] == "err_001"


def test_edited_mistake_text_wins_over_its_stored_fields(tmp_path):
    folder = SkillSet.from_json(masa_library()).save(tmp_path / "set")
    index = folder / "SKILLSET.md"
    index.write_text(index.read_text().replace("- Looping Why", "- Circling Why"))
    mistakes = SkillSet.load(folder).common_mistakes
    assert mistakes[1].startswith("Circling") and not isinstance(mistakes[1], Mistake)


def test_folder_order_and_dropped_in_skills(tmp_path):
    skillset = SkillSet(general=[make_skill("zeta"), make_skill("alpha")],
                        task_specific={"counting": [make_skill("b"), make_skill("a")]},
                        common_mistakes=["one", "two"])
    folder = skillset.save(tmp_path / "set")
    assert SkillSet.load(folder) == skillset
    make_skill("middle").save(folder / "general")  # a skill dropped in without SKILLSET.md knowing it
    assert [s.name for s in SkillSet.load(folder).general] == ["zeta", "alpha", "middle"]
    # saving again replaces the old tree
    SkillSet(general=[make_skill("only")]).save(folder)
    assert [p.name for p in (folder / "general").iterdir()] == ["only"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_index_listing_a_missing_skill_is_an_error(tmp_path):
    folder = SkillSet(general=[make_skill("kept"), make_skill("lost")]).save(tmp_path / "set")
    shutil.rmtree(folder / "general" / "lost")
    with pytest.raises(SkillFormatError, match=r"lists skill\(s\) \['lost'\] with no folder"):
        SkillSet.load(folder)


def test_load_single_skill_folder_and_errors(tmp_path):
    folder = make_skill().save(tmp_path)
    assert SkillSet.load(folder).general == [make_skill()]
    assert SkillSet.load(folder / "SKILL.md").general == [make_skill()]
    with pytest.raises(FileNotFoundError):
        SkillSet.load(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{\n  oops")
    with pytest.raises(SkillFormatError, match=r"bad.json, line 2: not valid JSON"):
        SkillSet.load(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(SkillFormatError, match="expected a JSON object"):
        SkillSet.load(tmp_path / "list.json")
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("hi")
    with pytest.raises(SkillFormatError, match="not a skill set"):
        SkillSet.load(stranger)


@pytest.mark.parametrize("library, message", [
    ({"general_skills": {}}, "general_skills must be a list"),
    ({"general_skills": ["text"]}, r"general_skills\[0\]: a skill must be a JSON object"),
    ({"task_specific_skills": []}, "task_specific_skills must be an object"),
    ({"task_specific_skills": {"../x": []}}, r"'../x' is not a valid task type"),
    ({"task_specific_skills": {"a": {}}}, r"task_specific_skills\['a'\] must be a list"),
    ({"common_mistakes": [1]}, r"common_mistakes\[0\] must be a string or an object"),
    ({"general_skills": [{"title": "t", "principle": "p" * (MAX_FILE_BYTES + 1)}]}, "principle is 262145 bytes"),
    ({"general_skills": [{"title": "t", "bad key": "v"}]}, "field name 'bad key'"),
])
def test_bad_masa_json_is_rejected(library, message):
    with pytest.raises(SkillFormatError, match=message):
        SkillSet.from_json(library)


# --------------------------------------------------------------------------- untrusted index files and links

def test_index_file_cannot_smuggle_paths(tmp_path):
    folder = SkillSet(general=[make_skill("ok")]).save(tmp_path / "set")
    index = folder / "SKILLSET.md"
    index.write_text(index.read_text().replace("- [ok](general/ok/SKILL.md)", "- [../../outside](general/ok/SKILL.md)"))
    with pytest.raises(SkillFormatError, match="looks like a path"):
        SkillSet.load(folder)
    index.write_text(index.read_text().replace("- [../../outside](general/ok/SKILL.md)", "- [ok](../../../etc)\n")
                     .replace("## General skills", "## Task-specific skills: ../up\n\n## General skills"))
    with pytest.raises(SkillFormatError, match="not a valid task type"):
        SkillSet.load(folder)


def test_symlinked_skill_folders_are_not_followed(tmp_path):
    outside = make_skill("outside").save(tmp_path)
    folder = SkillSet(general=[make_skill("ok")]).save(tmp_path / "set")
    os.symlink(outside, folder / "general" / "outside")
    with pytest.raises(SkillFormatError, match="symbolic links are not followed"):
        SkillSet.load(folder)


def test_save_refuses_to_replace_a_foreign_folder(tmp_path):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "important.txt").write_text("keep me")
    with pytest.raises(SkillFormatError, match="refusing to replace a folder that is not a skill set"):
        SkillSet(general=[make_skill()]).save(tmp_path / "project")
    assert (tmp_path / "project" / "important.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(SkillFormatError, match="is not a folder"):
        SkillSet().save(tmp_path / "file")


# --------------------------------------------------------------------------- rendering


def test_render_general_first_then_the_task_type():
    text = render_set().render("counting")
    assert text.startswith("## G one\nGeneral one.\n\nBody G1.\n\n## G two\n")
    order = [text.index(s) for s in ("Body G1.", "Body G2.", "Body C1.", "## Common mistakes to avoid",
                                     "- Mistake A.\n- Mistake B.")]
    assert order == sorted(order)
    assert "Body L1." not in text
    general_only = render_set().render()
    assert "Body C1." not in general_only and "Body L1." not in general_only and "Body G2." in general_only
    assert SkillSet().render("counting") == ""


def test_render_exact_text():
    skillset = SkillSet(general=[Skill(name="answer-format", description="Use always.", body="End with the answer.",
                                       metadata={"title": "Answer format"})])
    assert skillset.render() == "## Answer format\nUse always.\n\nEnd with the answer."


def test_render_drops_whole_skills_last_first_and_says_so():
    skillset = render_set()
    words = lambda text: len(text.split())  # noqa: E731 - a custom token counter
    full = skillset.render("counting", max_tokens=10_000, count_tokens=words)
    budget = words(full) - 1
    cut = skillset.render("counting", max_tokens=budget, count_tokens=words)
    assert words(cut) <= budget and "left out to fit the token budget" in cut
    assert "Body G1." in cut and "Mistake B." not in cut
    tiny = skillset.render("counting", max_tokens=20, count_tokens=words)
    # the task's own skill is the last to go (issue 42): general skills and mistakes are left out before it
    assert "Body C1." in tiny and "Body G1." not in tiny and "(4 more skill(s) left out" in tiny
    # even the first skill is too long: it is cut, and the text says so
    long = SkillSet(general=[make_skill("long", body="word " * 500)])
    text = long.render(max_tokens=50)
    assert len(text) <= 200 and "[cut to fit the token budget]" in text


def test_a_skill_renders_as_a_set_of_that_one_skill():
    words = lambda text: len(text.split())  # noqa: E731 - a custom token counter
    for skill in (make_skill(), make_skill("long", body="word " * 500), make_skill("plain", description="Plain", body="")):
        for budget in (10_000, 50, 5):
            for count in (None, words):
                assert (skill.render("counting", max_tokens=budget, count_tokens=count)
                        == SkillSet(general=[skill]).render("counting", max_tokens=budget, count_tokens=count))


def test_masa_s_search_libraries_query_type_skills_are_the_task_specific_section(tmp_path):
    """MASA's released search libraries name the section query_type_skills: read as task-specific skills (they
    were kept as an unknown field, never shown), saved back under that name; both sections at once is refused."""
    skill = {"skill_id": "cmp_001", "title": "Both", "principle": "Search both.", "when_to_apply": "Which of two."}
    data = {"general_skills": [], "query_type_skills": {"comparison": [skill]}, "common_mistakes": []}
    skillset = SkillSet.from_json(json.loads(json.dumps(data)))
    assert [s.name for s in skillset.task_specific["comparison"]] == ["cmp-001"]
    assert "Search both." in skillset.render("comparison")
    assert SkillSet.load(skillset.save(tmp_path / "set")).to_json() == data
    with pytest.raises(SkillFormatError, match="both task_specific_skills and query_type_skills"):
        SkillSet.from_json({**data, "task_specific_skills": {}})
    with pytest.raises(SkillFormatError, match=r"query_type_skills\['comparison'\] must be a list"):
        SkillSet.from_json({"query_type_skills": {"comparison": {}}})


# --------------------------------------------------------------------------- the shipped base skills

@pytest.mark.parametrize("suite", ["qa", "household", "webwalk", "webshop", "searchqa"])
def test_base_skill_sets_load_and_cover_every_task_type(suite):
    skillset = SkillSet.load(BASE_SKILLS / suite)
    assert skillset.general
    types = {t.type for t in load_suite(suite, n=len(suite_types(suite)))}
    assert set(skillset.task_specific) == types
    for task_type in types:
        text = skillset.render(task_type)
        assert text and len(text) < 4 * 1024


# --------------------------------------------------------------------------- links and interrupted saves

@pytest.mark.parametrize("link", ["general", "task-specific", "task-specific/counting", "task-specific/dangling",
                                  "general-dangling"])
def test_symlinked_group_folders_are_refused(tmp_path, link):
    """general/, task-specific/ and each per-type folder are folders of the set, never links out of it."""
    outside = SkillSet(general=[make_skill("outside")], task_specific={"counting": [make_skill("outside")]})
    outside.save(tmp_path / "outside")
    folder = SkillSet(general=[make_skill("ok")], task_specific={"counting": [make_skill("ok")]}).save(tmp_path / "set")
    target = folder / link.replace("-dangling", "")
    if target.exists():
        shutil.rmtree(target)
    os.symlink(tmp_path / "outside" / ("nowhere" if "dangling" in link else link), target)
    with pytest.raises(SkillFormatError, match=f"{target}: symbolic links are not followed"):
        SkillSet.load(folder)


class Killed(BaseException):
    """The process dies here: nothing after it (no `finally`, no `except`) touches the disk."""


def _save_killed_after(skills, path, n) -> bool:
    """Run skills.save(path), dying before its (n+1)-th disk change; True if it died."""
    calls = [0]

    def mortal(real):
        def call(*args, **kwargs):
            calls[0] += 1
            if calls[0] > n:
                raise Killed
            return real(*args, **kwargs)
        return call

    with pytest.MonkeyPatch.context() as patch:
        for name in ("replace", "rename", "mkdir", "rmdir", "unlink", "open"):
            patch.setattr(os, name, mortal(getattr(os, name)))
        try:
            skills.save(path)
        except Killed:
            return True
    return False


def _staging_left(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("had_old", [True, False])
def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_set(tmp_path, had_old):
    old = SkillSet(general=[make_skill("old-one"), make_skill("old-two")], task_specific={"counting": [make_skill("c")]},
                   common_mistakes=["old mistake"])
    new = SkillSet(general=[make_skill("new-one")], task_specific={"lookup": [make_skill("l")]}, common_mistakes=["new"])
    newer = SkillSet(general=[make_skill("newer")])
    allowed = [new.to_json()] + ([old.to_json()] if had_old else [])
    n, missing_seen = 0, False
    while True:
        parent = tmp_path / str(n)
        parent.mkdir()
        if had_old:
            old.save(parent / "lib")
        if not _save_killed_after(new, parent / "lib", n):
            break                                     # n is past the last disk change: the save completed
        n += 1
        missing_seen |= not (parent / "lib").exists()
        # the next load finds one set complete, whatever was on disk when the process died
        try:
            assert SkillSet.load(parent / "lib").to_json() in allowed
        except FileNotFoundError:
            assert not had_old                        # nothing had been saved there yet
        # the next save recovers, replaces, and leaves no staging behind
        newer.save(parent / "lib")
        assert SkillSet.load(parent / "lib").to_json() == newer.to_json()
        assert _staging_left(parent) == []
    assert n > 5 and (missing_seen or not had_old)    # some kill did hit between the two renames


def test_a_save_killed_while_recovering_still_leaves_a_complete_set(tmp_path):
    """Kill a save between its renames (the target is missing), then kill the next save at every point."""
    old, new, newer = (SkillSet(general=[make_skill(name)]) for name in ("old", "new", "newer"))
    m = 0
    while True:
        parent = tmp_path / str(m)
        parent.mkdir()
        old.save(parent / "lib")
        n = 0
        while _save_killed_after(new, parent / "lib", n) and (parent / "lib").exists():
            shutil.rmtree(parent)
            parent.mkdir()
            old.save(parent / "lib")
            n += 1
        assert not (parent / "lib").exists()          # died between the two renames
        if not _save_killed_after(newer, parent / "lib", m):
            break
        m += 1
        assert SkillSet.load(parent / "lib").to_json() in (old.to_json(), newer.to_json())
        newer.save(parent / "lib")
        assert _staging_left(parent) == [] and SkillSet.load(parent / "lib").to_json() == newer.to_json()
    assert m > 3


def test_recover_save_cleans_staging_and_leaves_other_entries(tmp_path):
    SkillSet(general=[make_skill("a")]).save(tmp_path / "lib")
    for name in (".lib.tmp-abcd1234", ".lib.old-abcd1234", ".other.tmp-abcd1234", ".lib.tmp-keep"):
        (tmp_path / name).mkdir()
    recover_save(tmp_path / "lib")
    assert _staging_left(tmp_path) == [".lib.tmp-keep", ".other.tmp-abcd1234"]
    assert SkillSet.load(tmp_path / "lib").general[0].name == "a"
