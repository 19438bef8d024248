"""A task's own skills are shown (issue 42, point 6): under the token budget of a skill set's
prompt, the skills of the task's type are the last to be left out (general skills used to fill the
budget first, so a library with many general skills showed a task none of its type's skills,
silently); what is left out is counted (SkillSet.budgeted, SkillSet.left_out), said once on the
console and kept in the run's summary.json."""
import json

import pytest

from helpers import make_skill, render_set
from minskill import rollout
from minskill.rollout import load_trajectories
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet
from minskill.tasks import suite_types

QA_TYPES = suite_types("qa")


def many_general_skills(n_general: int = 40, per_type: int = 3) -> SkillSet:
    """A library as MASA's search writes them: many general skills (about 80 tokens each: 40 of them
    are three times the default budget), a few skills for each qa task type, two mistakes."""
    filler = "Check the question once more before answering. " * 6
    general = [make_skill(f"general-{i:02d}", description=f"General skill {i}.",
                          body=f"GENERAL-{i:02d} {filler}") for i in range(n_general)]
    task_specific = {t: [make_skill(f"{t}-{j}", description=f"For {t} questions.",
                                    body=f"OWN-{t}-{j}: do it so.") for j in range(per_type)]
                     for t in QA_TYPES}
    return SkillSet(general=general, task_specific=task_specific,
                    common_mistakes=["Guessing.", "Rushing."])


def own_shown(skills: SkillSet, task_type: str, max_tokens: int = 1024) -> int:
    text = skills.render(task_type, max_tokens)
    return sum(f"OWN-{task_type}-{j}:" in text for j in range(len(skills.task_specific[task_type])))


def test_at_the_default_budget_every_task_type_sees_its_own_skills():
    skills = many_general_skills()
    # before: the general skills alone overflow the budget, so "general first, drop the last" showed
    # every type none of its own skills (0 of 12 here)
    assert skills.budgeted(None, 1024)[1]["general"] > 0
    assert {t: own_shown(skills, t) for t in QA_TYPES} == {t: 3 for t in QA_TYPES}   # now 12 of 12
    for task_type in QA_TYPES:
        text, left_out = skills.budgeted(task_type, 1024)
        assert text == skills.render(task_type, 1024) and len(text) <= 4 * 1024
        shown_general = sum(f"GENERAL-{i:02d}" in text for i in range(40))
        assert 0 < shown_general < 40             # the rest of the budget goes to general skills
        assert left_out == {"general": 40 - shown_general, "task_specific": 0, "common_mistakes": 2}
        assert f"({40 - shown_general + 2} more skill(s) left out to fit the token budget.)" in text


def test_the_prompt_keeps_the_set_s_order_whatever_it_leaves_out():
    """General skills first, then the type's own, then the mistakes: what goes is taken from the
    end of the order of priority (mistakes, then general skills from the last), not of the text."""
    skills = many_general_skills(n_general=10)
    text = skills.render("counting", 700)
    marks = ("GENERAL-00", "GENERAL-01", "OWN-counting-0", "OWN-counting-2")
    assert [m for m in marks if m in text] == list(marks)
    assert [text.index(m) for m in marks] == sorted(text.index(m) for m in marks)
    assert "GENERAL-09" not in text and "Guessing." not in text


def test_everything_fits_the_text_is_as_before_and_nothing_is_counted():
    skills = render_set()
    text, left_out = skills.budgeted("counting", 10_000)
    assert text == ("## G one\nGeneral one.\n\nBody G1.\n\n## G two\nGeneral two.\n\nBody G2.\n\n"
                    "## C one\nCounting one.\n\nBody C1.\n\n"
                    "## Common mistakes to avoid\n\n- Mistake A.\n- Mistake B.")
    assert left_out == {"general": 0, "task_specific": 0, "common_mistakes": 0}
    assert skills.left_out(["counting", "lookup", "counting"], 10_000) == {}


def test_the_own_skills_alone_over_the_budget_keep_their_first_cut_to_fit():
    skills = SkillSet(general=[make_skill("general-one", body="G " * 50)],
                      task_specific={"counting": [make_skill("own", body="OWN " * 400)]})
    text, left_out = skills.budgeted("counting", 100)
    assert text.startswith("## Own\n") and "OWN OWN" in text and "G G" not in text
    assert "[cut to fit the token budget]" in text and len(text) <= 400
    assert left_out == {"general": 1, "task_specific": 0, "common_mistakes": 0}


def test_left_out_counts_per_task_type_only_where_something_is_left_out():
    skills = many_general_skills()
    skills.task_specific["lookup"] = []
    left_out = skills.left_out(["counting", "lookup", "counting"], 1024)
    assert list(left_out) == ["counting", "lookup"]
    assert left_out["lookup"]["general"] < left_out["counting"]["general"]   # its own took room


@pytest.fixture
def task_model():
    """A scripted task model that answers; the test reads the prompts it was sent."""
    server = start_server(ScriptedBackend(lambda messages, request: "The answer is 4."))
    yield server.client(max_retries=0)
    server.close()


def test_the_evaluation_command_counts_what_is_left_out_and_says_it_once(tmp_path, task_model,
                                                                          capsys):
    library = many_general_skills()
    library.save(tmp_path / "library")
    out = tmp_path / "run"
    assert rollout.main(["--suite", "qa", "--skills", str(tmp_path / "library"), "--n-tasks", "8",
                         "--task-url", task_model.base_url, "--task-model", task_model.model,
                         "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("to fit --skill-max-tokens 1024, the prompt leaves out skills (") == 1
    assert "0 own," in err and "summary.json: run.skills_left_out" in err
    run = json.loads((out / "summary.json").read_text())["run"]
    trajectories = load_trajectories(out / "trajectories.jsonl")
    types = {t.task_type for t in trajectories}
    assert set(run["skills_left_out"]) == types
    assert run["skills_left_out"] == library.left_out(sorted(types), 1024)
    for traj in trajectories:                  # each prompt holds its type's own skills
        assert f"OWN-{traj.task_type}-0:" in traj.messages[0]["content"]
