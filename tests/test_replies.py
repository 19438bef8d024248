"""minskill.replies: skills, skill sets and JSON read out of LLM replies (fences, prose, missing front
matter, JSON split over objects)."""
import json

import pytest

from helpers import masa_library, render_set
from minskill.replies import extract_json, parse_skill, parse_skillset
from minskill.skills import MAX_BODY_CHARS, SkillParseError
from minskill.skillsets import SkillSet


def test_parse_skill_with_fences_and_prose():
    reply = ("Sure! Here is the improved skill:\n\n```markdown\n---\nname: count-carefully\n"
             "description: Use when counting.\n---\n# Count\n\nTick each item.\n```\n\nLet me know if you need more!")
    skill = parse_skill(reply)
    assert skill.name == "count-carefully" and skill.description == "Use when counting."
    assert skill.body == "# Count\n\nTick each item."


def test_parse_skill_without_front_matter():
    skill = parse_skill("Okay.\n\n## Counting Carefully!\n\nGo through the list one by one.\n\n"
                        "Let me know if this helps.")
    assert skill.name == "counting-carefully"
    assert skill.description == "Go through the list one by one."
    assert skill.body == "## Counting Carefully!\n\nGo through the list one by one."
    plain = parse_skill("Always write the final answer as a number.")
    assert plain.name == "always-write-the-final-answer-as-a-number" and plain.body.startswith("Always")


def test_parse_skill_repairs_fields():
    reply = ("---\nname: Count Things\ndescription: " + "d " * 600 + "\nversion: 2\n---\nbody")
    skill = parse_skill(reply)
    assert skill.name == "count-things" and len(skill.description) <= 1024
    assert skill.metadata == {"version": "2"}
    fenced = parse_skill("```\n---\nname: x\n---\n# Title\n\nFirst line.\n")  # unclosed fence, no description
    assert (fenced.name, fenced.description) == ("x", "First line.")


@pytest.mark.parametrize("reply, message", [
    ("", "empty reply"),
    ("   \n  ", "empty reply"),
    ("---\nname: x\ndescription: [a\n---\nbody", "front matter could not be read"),
    ("# Title\n\n" + "x" * (MAX_BODY_CHARS + 10), "skill body is"),
])
def test_parse_skill_errors_quote_the_reply(reply, message):
    with pytest.raises(SkillParseError, match=message) as info:
        parse_skill(reply)
    assert repr(reply[:40])[1:-1][:20] in str(info.value) or reply.strip() == ""
    assert len(str(info.value)) < 600  # quoted, but only its start


def test_parse_skillset_round_trips_to_markdown():
    skillset = SkillSet.from_json(masa_library())
    skillset.extra = {}
    for group in [skillset.general] + list(skillset.task_specific.values()):
        for skill in group:
            skill.body = skill.body.strip()
    assert parse_skillset(skillset.to_markdown()) == skillset
    assert parse_skillset(render_set().to_markdown()) == render_set()


def test_parse_skillset_lenient_layouts():
    reply = ("Here you go.\n\n```\n## General Skills\n\n### Answer format\nAlways end with the answer.\n\n"
             "## Task-specific skills for counting\n\n### Tick items\nNumber each matching item.\n\n"
             "## Common mistakes:\n1. Counting the wrong word.\n2. Forgetting the last item.\n```\nThanks!")
    skillset = parse_skillset(reply)
    assert [s.name for s in skillset.general] == ["answer-format"]
    assert [s.name for s in skillset.task_specific["counting"]] == ["tick-items"]
    assert skillset.task_specific["counting"][0].description == "Number each matching item."
    assert skillset.common_mistakes == ["Counting the wrong word.", "Forgetting the last item."]
    as_json = parse_skillset("Result:\n```json\n" + json.dumps(masa_library()) + "\n```")
    assert as_json.to_json() == masa_library()
    loose = parse_skillset("---\nname: only-one\ndescription: d\n---\nbody")
    assert [s.name for s in loose.general] == ["only-one"]


def test_parse_skillset_errors_quote_the_reply():
    with pytest.raises(SkillParseError, match=r"no skills or common mistakes found; reply was: '## General skills"):
        parse_skillset("## General skills\n\n## Common mistakes\n")
    with pytest.raises(SkillParseError, match="does not name its task type"):
        parse_skillset("# Task-specific skills\n\n### A\ntext")
    with pytest.raises(SkillParseError, match="empty reply"):
        parse_skillset("")


# --------------------------------------------------------------------------- extract_json

def test_extract_json_from_fences_and_prose():
    assert extract_json('Sure!\n```json\n{"a": [1, 2]}\n```\nHope that helps.') == {"a": [1, 2]}
    assert extract_json('Analysis: {"a": 1} and that is {not json}') == {"a": 1}
    assert extract_json('noise {bad json} then {"b": {"c": 3}} end') == {"b": {"c": 3}}
    assert extract_json('Steps [1] and [2]: {"b": 2}', accept=lambda v: isinstance(v, dict)) == {"b": 2}
    assert extract_json("```json\n[1, 2]") == [1, 2]                  # an unclosed fence: a reply cut short
    with pytest.raises(ValueError, match="no JSON object in the reply"):
        extract_json("I think the model is bad at math.")


def test_extract_json_strict_reads_only_the_object_text():
    part1, part2 = {"general_skills": []}, {"common_mistakes": ["x"]}
    assert extract_json("```json\n" + json.dumps(part1) + "\n```", strict=True) == part1
    assert extract_json(json.dumps(part1) + "\n\n" + json.dumps(part2), strict=True) == [part1, part2]
    with pytest.raises(ValueError, match=r"not valid JSON \(.* at line 1 column"):
        extract_json(json.dumps(part1)[:-3], strict=True)                # cut by the token limit
    with pytest.raises(ValueError, match="not valid JSON"):
        extract_json(json.dumps(part1) + " and then " + json.dumps(part2), strict=True)
    with pytest.raises(ValueError, match="no JSON object in the reply"):
        extract_json("---\nname: x\n---\nprose", strict=True)


def test_parse_skillset_finds_the_library_after_other_json():
    reply = 'Scores were [0.2, 0.4]. New set:\n{"general_skills": [], "common_mistakes": ["Guessing."]}'
    assert parse_skillset(reply).common_mistakes == ["Guessing."]


# Replies an LLM may write that nest past what anything asks for: unclosed brackets past Python's stack, and
# closed ones that decode but would overflow the stack later (copy.deepcopy of a checkpoint, json.dumps).
DEEP = {"unclosed [": "[" * 1000, "unclosed {": '{"a": ' * 1000, "long unclosed [": "[" * 100_000,
        "closed, 500 deep": "[" * 500 + "]" * 500,
        "library, 500 deep inside": '{"general_skills": [], "common_mistakes": ["x"], "junk": '
                                    + "[" * 500 + "]" * 500 + "}"}


@pytest.mark.parametrize("reply", list(DEEP.values()), ids=list(DEEP))
def test_deeply_nested_json_is_no_json_never_a_recursion_error(reply):
    """extract_json (both modes) says there is no JSON; parse_skillset reads such a reply as text or refuses it
    with SkillParseError; neither lets a RecursionError out (it ended the run, and --resume again)."""
    for strict in (False, True):
        with pytest.raises(ValueError, match="no JSON object|nested more than 64 levels"):
            extract_json(reply, strict=strict)
    try:
        skills = parse_skillset(reply)
    except SkillParseError:
        return
    assert not any(s.metadata for s in skills.skills()) and skills.extra == {}   # nothing deep was kept


@pytest.mark.parametrize("reply", list(DEEP.values()), ids=list(DEEP))
def test_deep_json_is_refused_alike_under_a_raised_recursion_limit(reply):
    """torch.compile raises the process's recursion limit; an unclosed '{"a": ' * 1000 then failed to decode at
    its end ("Expecting value at column 6001") instead of being refused as too deep: the answer must not depend
    on what the stack allowed the decoder."""
    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        for strict in (False, True):
            with pytest.raises(ValueError, match="no JSON object|nested more than 64 levels"):
                extract_json(reply, strict=strict)
    finally:
        sys.setrecursionlimit(limit)


def test_json_after_deep_prose_is_still_found():
    assert extract_json("[" * 200 + "]" * 200 + ' then {"a": 1}') == {"a": 1}       # deep, closed: skipped
    assert extract_json("[" * 2000 + '\n```json\n{"a": 1}\n```') == {"a": 1}       # a fenced block is read first
    assert json.dumps(extract_json("[" * 64 + "]" * 64)) == "[" * 64 + "]" * 64    # 64 levels: still read
