"""UCB1 tree search (MASA stage 1, task-specific skills): a small generic Monte-Carlo-style tree.

Each node holds a payload (in MASA, a skill set). A node's statistics cover the node *and all of
its descendants*: every evaluation reward is added to the evaluated node and to each of its
ancestors (backpropagation), so

    N(n)  = number of evaluations in the subtree of n       (visits)
    R̄(n)  = (sum of those rewards) / N(n)                    (value_sum / visits)

    UCB1(n) = R̄(n) + C · sqrt( ln N(parent(n)) / N(n) )     C = 1.4 by default; +inf when N(n) = 0.

One iteration (the caller composes it from the functions below; in MASA, MasaSearch.tree_iteration):
  1. select: start at the root. Stop at the current node when it is unvisited or has fewer than
     `max_children` children (a leaf has none); otherwise (it is *fully expanded*) move to its
     child of highest UCB1 (ties: the earliest child; an unvisited child scores +inf, so it is moved
     to and, being unvisited, returned). The returned node is the one to expand.
     Why a child limit: the teacher can always write one more rewrite (infinite branching), so
     with "descend to a leaf" alone the tree would grow as a single chain; with the limit a node
     gets up to `max_children` sibling rewrites before the search commits to its best child.
  2. expand: the caller makes a new payload from the node (MASA: rollouts of the node's skills,
     failure attribution, teacher rewrite) and `expand` adds it as a child. When no payload comes
     (e.g. the teacher's reply did not parse) the iteration is spent without a child.
  3. set_reward: the child's reward (MASA: mean adjusted reward over N episodes) is stored as
     child.reward (its *own* reward).
  4. backpropagate: visits += 1 and value_sum += reward for the child and every ancestor.

The root gets its reward (set_reward, backpropagate) before the first iteration.

Best node: the evaluated node with the highest *own* reward (ties: the shallower node, then the
smaller child-index path, i.e. the sibling created first). Not the subtree mean: the subtree mean
measures how promising a region is for exploration, but what the search returns is one skill set to
use, and its quality is its own score; a mediocre parent with good children would otherwise win.

The tree round-trips through plain dicts (`to_dict` / `from_dict`, with converters for the
payload), so a caller can checkpoint it wherever it keeps its state and resume: iterations on a
rebuilt root continue the search. This module does no file I/O and imports nothing from minskill,
so it can be copied alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


@dataclass(eq=False)
class Node:
    """A tree node. id: its path of child indices from the root ("0", "0.1", "0.1.0");
    visits/value_sum cover the subtree; reward: its own evaluation (None until evaluated); info:
    free-form, into the logs."""
    payload: Any
    parent: "Node | None" = field(default=None, repr=False)
    children: list["Node"] = field(default_factory=list, repr=False)
    visits: int = 0
    value_sum: float = 0.0
    reward: float | None = None
    info: dict = field(default_factory=dict)
    id: str = "0"

    @property
    def mean(self) -> float:   # R̄(n): mean reward over the node and its descendants (unvisited: 0)
        return self.value_sum / self.visits if self.visits else 0.0

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1


def select(root: Node, c: float = 1.4, max_children: int | None = None) -> Node:
    """Descend from root by UCB1 to the node to expand (module docstring; max_children None: to a
    leaf)."""
    if max_children is not None and max_children < 1:
        raise ValueError(f"select: max_children must be >= 1 or None, got {max_children}")
    node = root
    while node.visits > 0 and node.children:
        if max_children is not None and len(node.children) < max_children:
            return node
        # ties: the earliest child (max's first)
        node = max(node.children, key=lambda child: ucb_score(child, c))
    return node


def ucb_score(node: Node, c: float = 1.4) -> float:
    """UCB1 of a non-root node from its own and its parent's statistics."""
    if node.parent is None:
        raise ValueError("ucb_score: the root has no parent, so no UCB1 score")
    return ucb1(node.mean, node.visits, node.parent.visits, c)


def ucb1(mean: float, visits: int, parent_visits: int, c: float = 1.4) -> float:
    """UCB1 = mean + c · sqrt(ln(parent_visits) / visits); +inf for an unvisited node (visits ==
    0)."""
    if visits < 0 or parent_visits < visits:   # a parent's count includes its children's
        raise ValueError(f"ucb1: visits ({visits}) must be >= 0 and parent_visits "
                         f"({parent_visits}) >= visits")
    return math.inf if visits == 0 else mean + c * math.sqrt(math.log(parent_visits) / visits)


def expand(node: Node, payload: Any, info: dict | None = None) -> Node:
    """Add and return a new (unvisited) child of node holding payload."""
    child = Node(payload=payload, parent=node, info=dict(info or {}),
                 id=f"{node.id}.{len(node.children)}")
    node.children.append(child)
    return child


def set_reward(node: Node, reward) -> float:
    """Store `reward` as the node's own reward (checked: a finite number) and return it."""
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise ValueError(f"set_reward: node {node.id} got the reward {reward!r}; expected a "
                         f"number") from None
    if not math.isfinite(reward):
        raise ValueError(f"set_reward: node {node.id} got the reward {reward}; expected a finite "
                         f"number")
    node.reward = reward
    return reward


def backpropagate(node: Node, reward: float) -> None:
    """Add one visit and `reward` to node and every ancestor up to the root."""
    reward = float(reward)
    if not math.isfinite(reward):
        raise ValueError(f"backpropagate: reward must be finite, got {reward} (node {node.id})")
    while node is not None:
        node.visits += 1
        node.value_sum += reward
        node = node.parent


def best_node(root: Node) -> Node | None:
    """The evaluated node of highest own reward; ties -> shallower, then earlier in pre-order (the
    sibling made first: min keeps the first of equal keys). None if none evaluated."""
    evaluated = [n for n in iter_nodes(root) if n.reward is not None]
    return min(evaluated, key=lambda n: (-n.reward, n.depth)) if evaluated else None


def iter_nodes(root: Node) -> Iterator[Node]:
    """All nodes of the tree in pre-order (a node before its children, children in creation
    order)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def to_dict(root: Node, payload_to_json: Callable[[Any], Any] | None = None) -> dict:
    """Nested plain dict of the tree (payload through payload_to_json, identity by default)."""
    def convert(node: Node) -> dict:
        return {"id": node.id,
                "payload": payload_to_json(node.payload) if payload_to_json else node.payload,
                "visits": node.visits, "value_sum": node.value_sum, "reward": node.reward,
                "info": node.info, "children": [convert(child) for child in node.children]}
    return convert(root)


def from_dict(data: dict, payload_from_json: Callable[[Any], Any] | None = None) -> Node:
    """Inverse of to_dict; rebuilds parent links. ids are re-derived from the structure (they are
    the child-index path). Raises ValueError naming the node and field on bad data."""
    def build(d: Any, parent: Node | None) -> Node:
        where = "0" if parent is None else f"{parent.id}.{len(parent.children)}"  # this node's id
        if not isinstance(d, dict):
            raise ValueError(f"from_dict: node {where} must be a dict, got {type(d).__name__}")
        missing = [k for k in _NODE_KEYS if k not in d]
        if missing:
            raise ValueError(f"from_dict: node {where} lacks field(s) {', '.join(missing)}")
        if not isinstance(d["visits"], int) or d["visits"] < 0:
            raise ValueError(f"from_dict: node {where}: visits must be an int >= 0, got "
                             f"{d['visits']!r}")
        if not isinstance(d["children"], list) or not isinstance(d["info"], dict):
            raise ValueError(f"from_dict: node {where}: children must be a list and info a dict")
        node = Node(payload=payload_from_json(d["payload"]) if payload_from_json else d["payload"],
                    parent=parent, visits=d["visits"], value_sum=float(d["value_sum"]),
                    reward=None if d["reward"] is None else float(d["reward"]),
                    info=dict(d["info"]), id=where)
        for child in d["children"]:   # appended one by one: the next child's id counts them
            node.children.append(build(child, node))
        return node
    return build(data, None)


_NODE_KEYS = ("payload", "visits", "value_sum", "reward", "info", "children")
