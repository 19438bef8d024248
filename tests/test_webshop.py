"""The `webshop` suite: WebShop's reward term by term against hand-computed values, determinism and disjoint splits,
a scripted agent that buys right in every task (both splits), "Nothing happens." for bad actions, the step
limit, the agent loop over HTTP, and MASA's released webshop library read for the suite."""
import json
import warnings

import pytest

from minskill import rollout
from minskill.tasks import NOTHING_HAPPENS, TaskWarning, load_suite, make_env, oracle_actions, suite_types
from minskill.tasks.webshop import (BRANDS, CATALOGUE, FEATURE_LINES, MAX_STEPS, REVIEW_LINES, TASK_TYPES,
                                    WebShopEnv, _has_phrase, _texts, price_upper, type_reward, webshop_reward)
from helpers import rollouts_by_plan


def product(**fields):
    base = {"type": "t-shirt", "category": "apparel", "group": "tops", "title": "Norvik Cotton T-shirt",
            "attributes": ["cotton", "crew neck"], "features": ["Cotton.", "Crew Neck."],
            "description": "A t-shirt by Norvik.", "options": {"color": ["navy", "black"], "size": ["small", "large"]}}
    return {**base, **fields}


GOAL = {"type": "t-shirt", "category": "apparel", "group": "tops", "attributes": ["cotton", "machine wash"],
        "options": {"color": "navy", "size": "large"}, "price_upper": 40.0}


# --------------------------------------------------------------------------- the reward, by hand

def test_reward_counts_attributes_options_and_price_as_webshop_does():
    # (n_att + n_opt + r_price) / (|attributes| + |options| + 1), times r_type
    reward, info = webshop_reward(product(), GOAL, 25.0, {"color": "navy", "size": "small"})
    assert (info["n_att"], info["n_opt"], info["r_price"], info["r_type"]) == (1, 1, 1, 1.0)
    assert reward == pytest.approx((1 + 1 + 1) / (2 + 2 + 1))
    reward, info = webshop_reward(product(), GOAL, 45.0, {"color": "navy", "size": "small"})
    assert info["r_price"] == 0 and reward == pytest.approx(2 / 5)
    assert webshop_reward(product(), GOAL, 25.0, {})[0] == pytest.approx(2 / 5)         # no option chosen
    # an attribute named only in the features (WebShop also reads title, bullet points, description)
    washed = product(features=["Cotton.", "Machine Wash."])
    reward, info = webshop_reward(washed, GOAL, 40.0, {"color": "navy", "size": "large"})
    assert info["n_att"] == 2 and reward == 1.0
    # option values: the same words in any order count; another value does not
    x_large = {**GOAL, "options": {"size": "x large"}}
    assert webshop_reward(product(), x_large, 1.0, {"size": "large x"})[1]["n_opt"] == 1
    assert webshop_reward(product(), GOAL, 1.0, {"color": "black", "size": "small"})[1]["n_opt"] == 0


def test_type_reward_follows_webshop_s_cascade():
    assert type_reward(product(), GOAL)["r_type"] == 1.0                                   # same type (query match)
    hoodie = product(type="hoodie", title="Norvik Cotton Hoodie")
    r = type_reward(hoodie, GOAL)
    assert r["category_match"] and r["title_score"] == 0.0 and r["r_type"] == 0.0          # title_score 0 -> 0
    assert webshop_reward(hoodie, GOAL, 10.0, {"color": "navy", "size": "large"})[0] == 0.0
    # title_score > 0.2 is a match without the same type or category: half the words of "running shoes"
    boots = product(type="hiking boots", category="footwear", group="outdoor", title="Brisa Running Boots")
    r = type_reward(boots, {**GOAL, "type": "running shoes", "category": "footwear", "group": "athletic"})
    assert (r["query_match"], r["category_match"], r["title_score"], r["r_type"]) == (False, False, 0.5, 1.0)
    # no match and 0.1 <= title_score <= 0.2 -> 0.5; title_score < 0.1 -> 0.1
    far = product(type="x", category="other", group="y", title="Warm Socks")
    r = type_reward(far, {**GOAL, "type": "soft warm wool winter hiking boots"})
    assert r["title_score"] == pytest.approx(1 / 6) and r["r_type"] == 0.5
    eleven = {**GOAL, "type": "a1 b1 c1 d1 e1 f1 g1 h1 i1 j1 warm"}
    r = type_reward(far, eleven)
    assert r["title_score"] == pytest.approx(1 / 11) and r["r_type"] == 0.1


def test_price_bound_is_webshop_s():
    import random
    rng = random.Random(0)
    for price in (3.5, 12.0, 29.99, 95.0):
        bounds = {price_upper(rng, price) for _ in range(50)}
        above = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
        assert bounds <= set(above[1:]) and min(bounds) > price


# --------------------------------------------------------------------------- the generated suite

def test_deterministic_and_splits_disjoint_by_goal():
    train, heldout = load_suite("webshop", "train"), load_suite("webshop", "heldout")
    assert [t.to_dict() for t in train] == [t.to_dict() for t in load_suite("webshop", "train")]
    assert [t.type for t in train[:7]] == list(TASK_TYPES) and len(train) == 70

    def goals(tasks):
        return {(g["type"], tuple(sorted(g["attributes"])), tuple(sorted(g["options"].items())))
                for g in (t.env_spec["goal"] for t in tasks)}
    assert not goals(train) & goals(heldout)
    assert not goals(load_suite("webshop", "train", seed=3)) & goals(load_suite("webshop", "heldout", seed=5))
    assert {t.id for t in load_suite("webshop", "heldout", seed=1)} != {t.id for t in heldout}
    assert not {t.question for t in train} & {t.question for t in heldout}


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_the_scripted_agent_buys_right_in_every_task(split):
    for task in load_suite("webshop", split):
        plan = oracle_actions(task)
        assert len(plan) <= task.max_steps == MAX_STEPS
        env = make_env(task)
        env.reset()
        for action in plan:
            observation, done, success = env.step(action)
            assert observation != NOTHING_HAPPENS, (task.id, action)
        assert done and success and env.reward == 1.0 and env.nothing_happens == 0
        assert task.question in observation or "Thank you for shopping with us!" in observation


def test_a_product_lacks_exactly_what_it_is_said_to_lack():
    """Attributes and option values of a type are never phrases of another product text of that type (else the
    text rule of WebShop's reward would credit what the product does not have)."""
    fixed = " ".join(BRANDS + FEATURE_LINES + REVIEW_LINES).lower()
    for category, types in CATALOGUE.items():
        for product_type, (_, attributes, options, _) in types.items():
            values = [v for vs in options.values() for v in vs]
            for phrase in list(attributes) + values:
                assert not _has_phrase(fixed + " " + product_type, phrase), (product_type, phrase)
                others = [a for a in attributes if a != phrase]
                assert not any(_has_phrase(a, phrase) for a in others), (product_type, phrase)
    for task in load_suite("webshop", "heldout", n=14):
        goal = task.env_spec["goal"]
        for p in task.env_spec["products"]:
            pool = CATALOGUE[p["category"]][p["type"]][1]
            assert not [a for a in pool if a not in p["attributes"] and _has_phrase(_texts(p), a)]
        near = [p for p in task.env_spec["products"] if p["type"] == goal["type"] and not p.get("target")]
        bought = [webshop_reward(p, goal, p["price"], {k: v for k, v in goal["options"].items()
                                                       if v in p["options"][k]})[0] for p in near]
        # the near misses: an attribute short, too dear, a goal value not offered
        assert sum(b < 1.0 for b in bought) >= 3, task.id


# --------------------------------------------------------------------------- the environment

def test_pages_and_clicks_use_webshop_s_names():
    task = load_suite("webshop", "train", n=1)[0]
    env = make_env(task)
    first = env.reset()
    assert first == f"WebShop [SEP] Instruction: [SEP] {task.question} [SEP] Search"
    assert env.admissible_actions() == []
    page = env.step("search[" + task.env_spec["goal"]["type"] + "]")[0]
    assert "[SEP] Back to Search [SEP] Page 1 (Total results: " in page
    asin = env.clickables()[1 if "next >" not in env.clickables() else 2]
    assert env.admissible_actions()[0] == "click [back to search]"
    item = env.step(f"click [{asin}]")[0]                       # the agent loop writes a space before the bracket
    assert item.endswith("[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now") and "< Prev" in item
    value = next(iter(env.products[asin]["options"].values()))[0]
    assert env.step(f"click[{value}]")[0].startswith(f"You have clicked {value}.\n")
    assert env.step("click[features]")[0].split(" [SEP] ")[-1] == FEATURE_LINES[-1]
    assert env.step("click[< prev]")[0].startswith(f"You have clicked {value}.")    # back to the item
    assert env.step("click[< prev]")[0].startswith("Instruction:")                  # back to the results
    assert env.step("click[back to search]")[0] == first
    assert env.nothing_happens == 0


def test_bad_actions_say_nothing_happens_and_are_counted():
    task = load_suite("webshop", "heldout", n=1)[0]
    env = make_env(task)
    env.reset()
    bad = ["click[buy now]", "fly to the moon", "search[]", "search", "click[search]", "look"]
    for k, action in enumerate(bad, start=1):
        assert env.step(action)[0] == NOTHING_HAPPENS and env.nothing_happens == k, action
    env.step("search[" + task.env_spec["goal"]["type"] + "]")
    for action in ["search[anything else]", "click[b0nothere]", "click[buy now]", "click[< prev]"]:
        assert env.step(action)[0] == NOTHING_HAPPENS, action      # no search bar here; not on the page
    assert env.nothing_happens == len(bad) + 4 and not env.done


def test_a_wrong_purchase_ends_the_episode_with_its_partial_reward():
    task = load_suite("webshop", "train", n=1)[0]
    plan = oracle_actions(task)
    env = make_env(task)
    env.reset()
    for action in plan[:2]:                                      # search, open the target: buy without options
        env.step(action)
    observation, done, success = env.step("click[buy now]")
    n_options = len(task.env_spec["goal"]["options"])
    assert done and not success and env.reward == pytest.approx(3 / (3 + n_options))
    assert observation.endswith(f"[SEP] {env.reward:.2f}")


def test_the_step_limit_ends_the_episode():
    task = load_suite("webshop", "train", n=1)[0]
    env = make_env(task)
    env.reset()
    for k in range(task.max_steps):
        _, done, success = env.step("look")
        assert done is (k == task.max_steps - 1) and not success
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")
    assert isinstance(env, WebShopEnv) and env.nothing_happens == task.max_steps


def test_the_agent_loop_buys_with_a_scripted_agent_over_http():
    tasks = load_suite("webshop", "heldout", n=7)
    # WebShop/ReAct style replies: a thought, then the action (a plan is shorter than the 8 exchanges kept)
    trajs = rollouts_by_plan(tasks, lambda action: f"Thought: the next step.\nAction: {action}")
    assert [t.success for t in trajs] == [True] * len(tasks) and all(t.nothing_happens == 0 for t in trajs)
    assert set(rollout.summarize(trajs)["per_type"]) == set(TASK_TYPES)


# --------------------------------------------------------------------------- MASA's released library

def test_masa_s_released_webshop_library_is_read_for_the_suite(tmp_path):
    """MASA's webshop libraries key task_specific_skills by the seven categories: each reaches its tasks."""
    library = {"general_skills": [{"skill_id": "gen_001", "title": "Search precisely", "principle":
                                   "Search with the product type and its attributes.", "when_to_apply": "Always."}],
               "task_specific_skills": {c: [{"skill_id": f"{c}_001", "title": f"{c} tip", "principle":
                                             f"Check the {c} options.", "when_to_apply": f"Shopping for {c}."}]
                                        for c in TASK_TYPES},
               "common_mistakes": [{"mistake_id": "err_001", "description": "Buying before choosing options.",
                                    "why_it_happens": "Haste.", "how_to_avoid": "Click every option first."}]}
    path = tmp_path / "webshop_qwen3_8b.json"
    path.write_text(json.dumps(library))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)
        skills = rollout.load_skills(str(path), "webshop")
    assert sorted(skills.task_specific) == sorted(suite_types("webshop"))
    for task in load_suite("webshop", "heldout", n=7):
        text = skills.render(task.type)
        assert f"Check the {task.type} options." in text and "Search with the product type" in text
        assert "Buying before choosing options." in text
