"""Tests of minskill.masa.ucb: UCB1 values, subtree statistics, selection, iterations (select, expand, set_reward,
backpropagate, composed as MasaSearch.tree_iteration composes them) on scripted bandit trees, serialisation and
resume. (The search's own loop, its skipped rewrites and its stop at R = 1: tests/test_masa.py.)"""
import json
import math
import random

import pytest

from minskill.masa.ucb import (Node, backpropagate, best_node, expand, from_dict, iter_nodes, select, set_reward,
                               to_dict, ucb1, ucb_score)


def test_ucb1_matches_hand_computation():
    # 0.5 + 1.4·sqrt(ln 10 / 2) = 0.5 + 1.4·sqrt(1.1512925) = 0.5 + 1.4·1.0729830
    assert ucb1(0.5, 2, 10) == pytest.approx(2.0021762, abs=1e-6)
    assert ucb1(0.5, 2, 10, c=0.0) == 0.5
    # ln 1 = 0: a node that is its parent's only visit scores its mean.
    assert ucb1(0.3, 1, 1) == pytest.approx(0.3)
    # 0.25 + 2·sqrt(ln 4 / 4) = 0.25 + 2·0.5887050
    assert ucb1(0.25, 4, 4, c=2.0) == pytest.approx(1.4274100, abs=1e-6)


def test_ucb1_unvisited_is_inf_and_bad_counts_raise():
    assert ucb1(0.0, 0, 5) == math.inf
    assert ucb1(0.0, 0, 0) == math.inf
    with pytest.raises(ValueError, match="must be >= 0"):
        ucb1(0.0, -1, 3)
    with pytest.raises(ValueError, match="parent_visits"):
        ucb1(0.0, 4, 3)


def test_backpropagate_gives_subtree_means():
    root = Node("root")
    a = expand(root, "a")
    b = expand(a, "b")
    c = expand(root, "c")
    assert (a.id, b.id, c.id) == ("0.0", "0.0.0", "0.1")
    backpropagate(root, 1.0)
    backpropagate(a, 0.5)
    backpropagate(b, 0.0)
    backpropagate(c, 0.2)
    assert (root.visits, root.value_sum) == (4, pytest.approx(1.7))
    assert root.mean == pytest.approx(1.7 / 4)
    assert (a.visits, a.mean) == (2, pytest.approx(0.25))
    assert (b.visits, b.mean) == (1, 0.0)
    assert ucb_score(a) == pytest.approx(0.25 + 1.4 * math.sqrt(math.log(4) / 2))
    assert [n.payload for n in iter_nodes(root)] == ["root", "a", "b", "c"]
    assert (root.depth, a.depth, b.depth) == (0, 1, 2)
    with pytest.raises(ValueError, match="finite"):
        backpropagate(b, float("nan"))


def _tree_with_children(rewards):
    root = Node("root")
    root.reward = 0.0
    backpropagate(root, 0.0)
    for i, r in enumerate(rewards):
        child = expand(root, i)
        child.reward = r
        backpropagate(child, r)
    return root


def test_select_descends_by_ucb1_and_stops_where_documented():
    root = _tree_with_children([0.1, 0.6, 0.4])
    # All children have 1 visit, root has 4: the highest mean wins.
    assert select(root, max_children=3).payload == 1
    # Below the child limit the root itself is returned (it gets another child).
    assert select(root, max_children=4) is root
    # No limit: descend to a leaf.
    assert select(root, max_children=None).payload == 1
    # More visits lower the exploration bonus: child 1 with 5 more visits of mean 0.6 vs child 2 ...
    for _ in range(5):
        backpropagate(root.children[1], 0.6)
    scores = [ucb_score(ch) for ch in root.children]
    assert select(root, max_children=3).payload == scores.index(max(scores)) == 2
    # An unvisited child is returned first (UCB1 = +inf).
    fresh = expand(root, "fresh")
    assert select(root, max_children=4) is fresh
    # Ties keep the earliest child.
    tied = _tree_with_children([0.5, 0.5])
    assert select(tied, max_children=2).payload == 0
    with pytest.raises(ValueError, match="max_children"):
        select(root, max_children=0)


# A scripted bandit tree: a node's payload is the tuple of arm choices from the root; arm 1 is good and
# arms 0 and 2 are bad, so the best nodes are the deepest all-1 paths.
def _arm_reward(path):
    good = sum(1 for a in path if a == 1)
    return max(0.0, min(1.0, 0.3 + 0.2 * good - 0.1 * (len(path) - good)))


def _expand_next_arm(node):
    return node.payload + (len(node.children),)


def plant(payload, evaluate_fn) -> Node:
    """A root holding payload, with its reward (as MasaSearch.plant_tree gives the root its own)."""
    root = Node(payload)
    backpropagate(root, set_reward(root, evaluate_fn(root)))
    return root


def iterate(root, expand_fn, evaluate_fn, iterations, c=1.4, max_children=3):
    """`iterations` UCB1 iterations as MasaSearch.tree_iteration makes each: select, expand (no child when expand_fn
    gives None), set_reward, backpropagate. Returns [(selected id, child id or None)] per iteration."""
    made = []
    for _ in range(iterations):
        selected = select(root, c, max_children)
        payload = expand_fn(selected)
        child = None if payload is None else expand(selected, payload)
        if child is not None:
            backpropagate(child, set_reward(child, evaluate_fn(child)))
        made.append((selected.id, None if child is None else child.id))
    return made


def test_search_finds_best_arm_of_deterministic_bandit_tree():
    score = lambda n: _arm_reward(n.payload)  # noqa: E731
    root = plant((), score)
    calls = iterate(root, _expand_next_arm, score, iterations=15, max_children=3)
    best = best_node(root)
    assert len(calls) == 15 and None not in (child for _, child in calls)
    # by hand: the root is expanded 3 times (child limit 3), then UCB1 (c = 1.4, N(root) = 4, one visit each)
    # picks child 0.1 (means 0.2, 0.5, 0.2, the same bonus), whose first child is 0.1.0
    assert calls[:4] == [("0", "0.0"), ("0", "0.1"), ("0", "0.2"), ("0.1", "0.1.0")]
    assert root.visits == 16                      # root evaluation + one per iteration
    assert root.reward == pytest.approx(0.3)
    nodes = list(iter_nodes(root))
    assert len(nodes) == 16
    assert best.reward == max(n.reward for n in nodes)
    assert set(best.payload) == {1} and len(best.payload) >= 2
    assert best.reward == pytest.approx(_arm_reward(best.payload))
    # UCB concentrated the visits on the good arm.
    visits = [ch.visits for ch in root.children]
    assert visits.index(max(visits)) == 1
    # Every node's statistics are the sum over its subtree of own rewards.
    for n in nodes:
        own = [m.reward for m in iter_nodes(n)]
        assert n.visits == len(own) and n.value_sum == pytest.approx(sum(own))


def test_search_finds_best_arm_of_seeded_noisy_bandit():
    rng = random.Random(1234)
    true_mean = {0: 0.3, 1: 0.7, 2: 0.5}

    def evaluate(node):
        if not node.payload:
            return 0.4 + rng.gauss(0, 0.1)
        return true_mean[node.payload[0]] + rng.gauss(0, 0.1)   # a subtree shares its first arm's quality

    root = plant((), evaluate)
    iterate(root, _expand_next_arm, evaluate, iterations=40, max_children=3)
    best = best_node(root)
    visits = [ch.visits for ch in root.children]
    assert visits.index(max(visits)) == 1 and visits[1] > visits[0] + visits[2]
    assert best.payload[0] == 1


def test_best_node_uses_own_reward_with_deterministic_ties():
    # A parent whose own score is low but whose subtree mean is high is not the best: its child is.
    root = Node("root")
    root.reward = 0.5
    backpropagate(root, 0.5)
    a = expand(root, "a")
    a.reward = 0.1
    backpropagate(a, 0.1)
    for payload, r in (("a0", 0.9), ("a1", 0.9)):
        ch = expand(a, payload)
        ch.reward = r
        backpropagate(ch, r)
    b = expand(root, "b")
    b.reward = 0.9
    backpropagate(b, 0.9)
    assert a.mean == pytest.approx(1.9 / 3) and a.mean > root.reward > a.reward
    # Three nodes tie at 0.9: the shallower b (depth 1) wins over a0/a1 (depth 2).
    assert best_node(root) is b
    # Between same-depth ties, the earlier sibling wins.
    assert best_node(a) is a.children[0]
    assert best_node(Node("never evaluated")) is None


def test_iteration_without_a_child_and_set_reward_validates():
    root = plant("seed", lambda n: 0.5)
    assert iterate(root, lambda n: None, lambda n: 1 / 0, iterations=3) == [("0", None)] * 3
    assert root.children == [] and root.visits == 1 and best_node(root) is root
    with pytest.raises(ValueError, match="node 0 got the reward nan; expected a finite number"):
        set_reward(Node("x"), float("nan"))
    with pytest.raises(ValueError, match="expected a number"):
        set_reward(Node("x"), "high")
    node = Node("x")
    assert set_reward(node, 1) == 1.0 and node.reward == 1.0 and node.visits == 0   # set_reward does not count a visit


def test_serialisation_round_trip():
    score = lambda n: _arm_reward(n.payload)  # noqa: E731
    root = plant((), score)
    iterate(root, _expand_next_arm, score, iterations=8)
    root.children[0].info["attribution"] = {"failure": "missed step", "why": "ünïcode"}
    data = to_dict(root, payload_to_json=list)
    json.dumps(data)                                          # plain JSON
    again = from_dict(data, payload_from_json=tuple)
    assert to_dict(again, payload_to_json=list) == data
    for original, loaded in zip(iter_nodes(root), iter_nodes(again)):
        assert (loaded.id, loaded.payload, loaded.visits, loaded.reward, loaded.info) == \
               (original.id, original.payload, original.visits, original.reward, original.info)
        assert (loaded.parent.id if loaded.parent else None) == (original.parent.id if original.parent else None)
    through_json = from_dict(json.loads(json.dumps(data)), payload_from_json=tuple)
    assert to_dict(through_json, payload_to_json=list) == data


def test_resumed_search_equals_uninterrupted_run():
    score = lambda n: _arm_reward(n.payload)  # noqa: E731
    straight = plant((), score)
    iterate(straight, _expand_next_arm, score, iterations=12)
    first_half = plant((), score)
    iterate(first_half, _expand_next_arm, score, iterations=5)
    saved = json.dumps(to_dict(first_half, payload_to_json=list))       # a checkpoint, as a caller writes it
    resumed = from_dict(json.loads(saved), payload_from_json=tuple)
    iterate(resumed, _expand_next_arm, score, iterations=7)
    assert to_dict(resumed) == to_dict(straight)
    assert best_node(resumed).id == best_node(straight).id


def test_from_dict_errors_name_the_node():
    data = to_dict(_tree_with_children([0.1, 0.2]))
    del data["children"][1]["visits"]
    with pytest.raises(ValueError, match=r"node 0\.1 lacks field\(s\) visits"):
        from_dict(data)
    data = to_dict(_tree_with_children([0.1]))
    data["children"][0]["visits"] = -2
    with pytest.raises(ValueError, match=r"node 0\.0: visits"):
        from_dict(data)
    with pytest.raises(ValueError, match=r"node 0 must be a dict"):
        from_dict(["not", "a", "node"])
