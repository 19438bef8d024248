"""minskill.replies on replies built to cost: a skill set of more skills than a set may hold
is refused before any is parsed, and duplicate names are numbered in work proportional to their
count (operations counted, no timing)."""
import pytest

from minskill import replies
from minskill.replies import parse_skillset
from minskill.skills import Skill, SkillParseError
from minskill.skillsets import MAX_SKILLS


class CountedSkill(Skill):
    """A Skill that counts the names given to it (the renaming loop's steps)."""
    name_sets = 0

    def __setattr__(self, key, value):
        if key == "name":
            CountedSkill.name_sets += 1
        super().__setattr__(key, value)


@pytest.fixture
def parsed(monkeypatch):
    """replies._lenient_skill counted: calls made, each skill built as a CountedSkill."""
    calls = []
    real = replies._lenient_skill

    def counted(piece, reply):
        calls.append(piece)
        if len(calls) > MAX_SKILLS:   # the old code went on to 20,000 (minutes of renaming)
            raise AssertionError(f"parsed {len(calls)} skills, more than a skill set may hold")
        skill = real(piece, reply)
        return CountedSkill(**{f: getattr(skill, f) for f in skill.__dataclass_fields__})

    monkeypatch.setattr(replies, "_lenient_skill", counted)
    CountedSkill.name_sets = 0
    return calls


def test_a_reply_of_20000_headings_is_refused_before_any_skill_is_parsed(parsed):
    with pytest.raises(SkillParseError) as refused:
        parse_skillset("### s\n" * 20_000)
    message = str(refused.value)
    assert f"more than {MAX_SKILLS} skills" in message and "20000 counted" in message
    assert parsed == []


def test_duplicate_names_are_numbered_in_linear_work(parsed):
    """MAX_SKILLS skills all named "s": s, s-2, ..., s-1000, each name given at most twice (once
    when built, once when renamed), not once per earlier duplicate (about 500,000 renames)."""
    skills = parse_skillset("### s\n" * MAX_SKILLS).general
    assert [s.name for s in skills] == ["s"] + [f"s-{k}" for k in range(2, MAX_SKILLS + 1)]
    assert len(parsed) == MAX_SKILLS
    assert CountedSkill.name_sets <= 2 * MAX_SKILLS


def test_numbering_skips_a_name_the_reply_already_used(parsed):
    """The suffix resumes where the name's last duplicate left off, yet never takes a name already
    in the group."""
    skills = parse_skillset("### s\n### s\n### s-3\n### s\n### s\n").general
    assert [s.name for s in skills] == ["s", "s-2", "s-3", "s-4", "s-5"]
