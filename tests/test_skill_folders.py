"""Users' skill folders load (issue 42, point 5): `--skills DIR` where DIR holds skill folders
(DIR/<name>/SKILL.md, the layout of a public skills repository's skills/ and of ~/.claude/skills)
is a skill set of general skills, one bad skill there is skipped with a warning saying why, and a
skill that the reference validator accepts with more than 1,000 files loads once --skill-max-files
raises the cap (a clear error naming that flag until then)."""
import warnings

import pytest

import evolve_masa
from minskill import rollout
from minskill.skills import (MAX_RESOURCE_FILES, Skill, SkillFormatError, SkillWarning,
                             set_max_resource_files)
from minskill.skillsets import SkillSet


def write_skill(parent, name, description="Use when testing skill folders.",
                body="# Title\n\nSteps.\n", files=None):
    folder = parent / name
    folder.mkdir(parents=True)
    front = f"---\nname: {name}\ndescription: {description}\n---\n\n"
    (folder / "SKILL.md").write_text(front + body)
    for rel, data in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def users_skills(root):
    """A folder as a skills repository's skills/ is: skill folders, a README, a .git."""
    root.mkdir()
    write_skill(root, "pdf", body="# PDF\n\nRun scripts/extract.py.\n",
                files={"scripts/extract.py": b"print(1)\n"})
    write_skill(root, "brand-guidelines", files={"LICENSE.txt": b"terms\n"})
    write_skill(root, "doc-coauthoring")
    (root / "README.md").write_text("# Skills\n")
    (root / ".git").mkdir()
    return root


@pytest.fixture
def default_file_cap():
    """The file cap is process-wide (--skill-max-files sets it when parsed): put it back after."""
    previous = set_max_resource_files(None)
    yield
    set_max_resource_files(previous)


def test_a_folder_of_skill_folders_loads_as_general_skills(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # nothing skipped, nothing to warn about
        skills = SkillSet.load(users_skills(tmp_path / "skills"))
    assert [s.name for s in skills.general] == ["brand-guidelines", "doc-coauthoring", "pdf"]
    assert skills.task_specific == {} and skills.common_mistakes == []
    assert skills.general[2].resources == {"scripts/extract.py": b"print(1)\n"}
    assert "Run scripts/extract.py." in skills.render("anything")
    # saved as a skill-set folder, it reads back the same (resources too)
    again = SkillSet.load(skills.save(tmp_path / "as-set"))
    assert again == skills


def test_the_rollout_command_s_skills_flag_reads_such_a_folder(tmp_path):
    skills = rollout.load_skills(str(users_skills(tmp_path / "skills")), "qa")
    assert isinstance(skills, SkillSet) and len(skills) == 3
    text = rollout.skill_text(skills, "counting")
    assert "## PDF\nUse when testing skill folders.\n\n# PDF\n\nRun scripts/extract.py." in text
    assert "kept as they are, not shown): scripts/extract.py" in text and "print(1)" not in text


def test_one_skill_that_does_not_load_is_skipped_with_a_warning_saying_why(tmp_path):
    """One public repository's skills/ holds a skill whose description is over the spec's 1,024
    characters (the reference validator refuses it too): the other skills still load."""
    root = users_skills(tmp_path / "skills")
    write_skill(root, "claude-api", description="x" * 1068)
    (root / "notes").mkdir()                                       # a folder that is no skill
    (root / "linked").symlink_to(root / "pdf", target_is_directory=True)
    with pytest.warns(SkillWarning) as caught:
        skills = SkillSet.load(root)
    assert [s.name for s in skills.general] == ["brand-guidelines", "doc-coauthoring", "pdf"]
    said = "\n".join(str(w.message) for w in caught)
    assert "claude-api/SKILL.md: description is 1068 characters; at most 1024" in said
    assert "notes: no SKILL.md" in said and "linked: symbolic links are not followed" in said


def test_a_folder_where_no_skill_loads_is_an_error_naming_the_problem(tmp_path):
    root = tmp_path / "skills"
    root.mkdir()
    write_skill(root, "wrong-name").rename(root / "other-name")     # name differs from its folder
    with pytest.raises(SkillFormatError,
                       match=r"other-name/SKILL.md: name 'wrong-name' differs from its folder"):
        SkillSet.load(root)
    stranger = tmp_path / "stranger"
    (stranger / "sub").mkdir(parents=True)
    (stranger / "notes.txt").write_text("hi")
    with pytest.raises(SkillFormatError, match=r"not a skill set .*<name>/SKILL.md"):
        SkillSet.load(stranger)


# ------------------------------------------------------------------------------------- the file cap

def big_skill(parent, files: int = 1224):
    """A skill with `files` resource files (one public skill has 1,224), each a line of text."""
    parts = {f"references/part-{i:04d}.md": b"text\n" for i in range(files)}
    return write_skill(parent, "many-files", files=parts)


def test_the_reference_validator_accepts_a_skill_with_more_than_1000_files(tmp_path):
    skills_ref = pytest.importorskip("skills_ref")
    assert skills_ref.validate(big_skill(tmp_path)) == []


def test_more_files_than_the_cap_is_an_error_naming_the_flag(tmp_path, default_file_cap, capsys):
    folder = big_skill(tmp_path / "skills")
    with pytest.raises(SkillFormatError,
                       match=rf"exceed {MAX_RESOURCE_FILES} files .*--skill-max-files"):
        SkillSet.load(folder)
    with pytest.raises(SystemExit) as stopped:         # refused before any model loads
        rollout.main(["--suite", "qa", "--skills", str(folder), "--out", str(tmp_path / "run")])
    assert stopped.value.code == 2
    assert "raise the cap with --skill-max-files N" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    too_many = Skill(name="x", description="d", resources={f"r/{i}": b"" for i in range(1224)})
    with pytest.raises(SkillFormatError,
                       match=r"1224 resource files; at most 1000 \(raise the cap with "):
        too_many.validate()


def test_skill_max_files_raises_the_cap_and_the_skill_round_trips(tmp_path, default_file_cap):
    folder = big_skill(tmp_path / "skills")
    args = rollout._parser().parse_args(["--suite", "qa", "--skills", str(folder),
                                         "--skill-max-files", "2000"])
    assert args.skill_max_files == 2000
    skills = rollout.load_skills(args.skills, args.suite)
    assert len(skills.general[0].resources) == 1224
    saved = skills.save(tmp_path / "out")
    assert len(SkillSet.load(saved).general[0].resources) == 1224


def test_every_script_with_a_task_model_takes_the_flag_and_refuses_a_bad_value(default_file_cap,
                                                                                capsys):
    args = evolve_masa.build_parser().parse_args(["--skill-max-files", "1500"])
    assert args.skill_max_files == 1500
    for value in ("0", "many", "-3"):
        with pytest.raises(SystemExit):
            rollout._parser().parse_args(["--suite", "qa", "--skill-max-files", value])
        assert "--skill-max-files must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="integer >= 1"):
        set_max_resource_files(0)
