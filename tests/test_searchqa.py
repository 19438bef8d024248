"""The `searchqa` suite: EM and F1 against hand-computed values, BM25 search (the project's one implementation),
determinism and disjoint splits, a scripted agent that answers every task (both splits), "Nothing happens." for
bad actions, the step limit, the agent loop over HTTP, and MASA's released search library (query_type_skills)
read for the suite."""
import json
import warnings

import pytest

from minskill import retrieval, rollout
from minskill.skillsets import SkillSet
from minskill.tasks import NOTHING_HAPPENS, TaskWarning, bm25, load_suite, make_env, oracle_actions
from minskill.tasks.searchqa import MAX_STEPS, TASK_TYPES, TOP_K
from minskill.tasks.verifiers import exact_match, token_f1
from helpers import rollouts_by_plan


# --------------------------------------------------------------------------- scores, by hand

def test_exact_match_and_f1_as_squad_scores_them():
    assert exact_match("The Kelbar Records.", "kelbar records") and not exact_match("Kelbar", "Kelbar Records")
    # normalised tokens: [kelbar, records, company] vs [kelbar, records]: P = 2/3, R = 1
    assert token_f1("the Kelbar Records company", "Kelbar Records") == pytest.approx(2 * (2 / 3) / (2 / 3 + 1))
    assert token_f1("records", "Kelbar Records") == pytest.approx(2 * 0.5 / 1.5)        # P = 1, R = 1/2
    assert token_f1("an apple", "the apple") == 1.0 and token_f1("pear", "apple") == 0.0
    assert token_f1("born 1987 1987", "1987") == pytest.approx(2 * (1 / 3) / (1 / 3 + 1))  # counted once
    assert token_f1("Osmer", ["Vel River", "Osmer"]) == 1.0                               # the best golden answer
    assert token_f1("", "x") == 0.0


def test_one_bm25_for_skills_and_corpora():
    assert retrieval.bm25_scores is bm25.bm25_scores   # retrieval scores skills with the corpora's BM25
    docs = ["kelbar records founded", "kelbar", "river"]
    assert bm25.top_documents("kelbar records", docs, 2) == [0, 1]
    assert bm25.top_documents("nothing", docs, 2) == []


# --------------------------------------------------------------------------- the generated suite

def test_deterministic_and_splits_disjoint():
    train, heldout = load_suite("searchqa", "train"), load_suite("searchqa", "heldout")
    assert [t.to_dict() for t in train] == [t.to_dict() for t in load_suite("searchqa", "train")]
    assert [t.type for t in train[:4]] == list(TASK_TYPES) and len(train) == 40
    assert not {t.id for t in train} & {t.id for t in heldout}
    assert not {t.question for t in train} & {t.question for t in heldout}
    assert {t.id for t in load_suite("searchqa", "heldout", seed=1)} != {t.id for t in heldout}
    assert {t.metadata["hops"] for t in train if t.type in ("multi_hop_reasoning", "comparison")} == {2}


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_the_scripted_agent_answers_every_task_by_reading(split):
    for task in load_suite("searchqa", split):
        env = make_env(task)
        env.reset()
        plan = oracle_actions(task)
        assert len(plan) <= task.max_steps == MAX_STEPS
        for action, name in zip(plan, task.env_spec["searches"]):
            observation = env.step(action)[0]
            assert f"(Title: {name})" in observation                         # the document the answer needs
        if task.type != "comparison":
            assert task.answer in observation                               # it states the answer
        observation, done, success = env.step(plan[-1])
        assert done and success and env.em and env.f1 == 1.0 and env.nothing_happens == 0


def test_search_shows_the_top_documents_by_bm25():
    task = load_suite("searchqa", "train", n=2)[1]
    env = make_env(task)
    env.reset()
    query = task.env_spec["searches"][0]
    texts = [f"{d['title']} {d['text']}" for d in task.env_spec["docs"]]
    scores = bm25.bm25_scores(query, texts)
    best = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: -scores[i])[:TOP_K]
    expected = "\n".join(f"Doc {k}(Title: {task.env_spec['docs'][i]['title']}) {task.env_spec['docs'][i]['text']}"
                         for k, i in enumerate(best, start=1))
    assert env.step(f"search [{query}]")[0] == f"<information>{expected}</information>"
    assert env.step("search zzzz qqqq")[0] == "<information>No documents found.</information>"


def test_a_wrong_or_partial_answer_scores_f1_but_fails():
    task = next(t for t in load_suite("searchqa", "train") if t.type == "comparison")
    env = make_env(task)
    env.reset()
    first_word = task.answer.split()[0]                                     # "Osmer" of "Osmer River"
    observation, done, success = env.step(f"answer {first_word}")          # the agent loop's "answer X"
    assert done and not success and not env.em and env.f1 == pytest.approx(2 / 3)
    assert observation == f"You answered: {first_word.lower()}"


def test_bad_actions_say_nothing_happens_and_the_step_limit_ends_the_episode():
    task = load_suite("searchqa", "heldout", n=1)[0]
    env = make_env(task)
    env.reset()
    for k, action in enumerate(["look", "search[]", "answer", "click[x]"], start=1):
        assert env.step(action)[0] == NOTHING_HAPPENS and env.nothing_happens == k
    for _ in range(task.max_steps - 5):
        assert env.step("search[something]")[1] is False
    observation, done, success = env.step("search[the last step]")
    assert done and not success and env.steps == task.max_steps
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("answer[x]")


def test_the_agent_loop_answers_with_a_scripted_agent_over_http():
    tasks = load_suite("searchqa", "heldout", n=8)
    # the last action as small models write it: "Answer: X" (the loop makes it "answer X")
    trajs = rollouts_by_plan(tasks, lambda action: f"<think>next</think>\n{action}" if action.startswith("search")
                             else "Answer: " + action[len("answer["):-1])
    assert [t.success for t in trajs] == [True] * len(tasks) and all(t.nothing_happens == 0 for t in trajs)
    assert set(rollout.summarize(trajs)["per_type"]) == set(TASK_TYPES)


# --------------------------------------------------------------------------- MASA's released library

RELEASED = {  # the shape of MASA's (SkillRL's) released search libraries: query_type_skills, "compare"
    "general_skills": [{"skill_id": "gen_001", "title": "Search the entity", "principle":
                        "Search the exact name of the entity first.", "when_to_apply": "Every question."}],
    "query_type_skills": {
        "direct_retrieval": [{"skill_id": "dr_001", "title": "Quote the fact", "principle": "Answer with the span.",
                              "when_to_apply": "One-fact questions."}],
        "multi_hop_reasoning": [{"skill_id": "mh_001", "title": "Bridge first", "principle": "Find the bridge.",
                                 "when_to_apply": "Two-hop questions."}],
        "entity_attribute_lookup": [{"skill_id": "ea_001", "title": "Own page", "principle": "Read its own page.",
                                     "when_to_apply": "Attribute questions."}],
        "compare": [{"skill_id": "cmp_001", "title": "Both sides", "principle": "Search both entities.",
                     "when_to_apply": "Which of two."}]},
    "common_mistakes": [{"mistake_id": "err_001", "description": "Answering with a sentence.",
                         "why_it_happens": "Verbosity.", "how_to_avoid": "Give the span only."}],
    "metadata": {"source": "generated from Search AI agent trajectories"},
}


def test_masa_s_released_search_library_is_read_for_the_suite(tmp_path):
    """Its query_type_skills are the task-specific skills, and its 'compare' key holds comparison's."""
    path = tmp_path / "search_qwen3_8b.json"
    path.write_text(json.dumps(RELEASED))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)
        skills = rollout.load_skills(str(path), "searchqa")
    assert sorted(skills.task_specific) == sorted(TASK_TYPES)
    expected = {"direct_retrieval": "Answer with the span.", "multi_hop_reasoning": "Find the bridge.",
                "entity_attribute_lookup": "Read its own page.", "comparison": "Search both entities."}
    for task in load_suite("searchqa", "heldout", n=4):
        text = skills.render(task.type)
        assert expected[task.type] in text and "Search the exact name" in text and "Answering with a sentence." in text
    # read as it is, it saves back in its own shape
    assert SkillSet.load(path).to_json() == RELEASED
