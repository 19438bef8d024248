"""evolve_masa.py's defaults, written once (its argparse reads them from MasaRunConfig()), and the shape of the
state.json its --resume reads (`check_state`)."""
from dataclasses import dataclass

from minskill.files import ShapeError, check_shape
from minskill.masa.search import MasaConfig


@dataclass
class MasaRunConfig(MasaConfig):
    """The search's knobs are MasaConfig's fields, inherited with their defaults; these are the run's."""
    suite: str = "qa"
    n_train: int = 24             # search tasks (train split)
    n_prelim: int = 4             # preliminary train tasks of the model card
    n_heldout: int = 40           # held-out tasks of the final table
    task_seed: int = 0
    model_spec: str = "smollm2-135m"
    task_concurrency: int = 16
    timeout: float = 600.0
    startup_timeout: float = 600.0
    gate_tasks: int = 24
    sft_copies: int = 1


# What --resume reads of state.json (minskill.files.check_shape; check_state): every field MasaSearch.restore,
# the budget and the usage counters take, as to_json wrote them (a candidate field with a default may be absent)
USAGE_SHAPE = {f"{k}?": (None, float) for k in ("calls", "failures", "prompt_tokens", "completion_tokens",
                                                 "request_seconds", "busy_seconds")}
CANDIDATE_SHAPE = {"id": int, "phase": str, "skills": dict, "task_type?": (None, str), "parent?": (None, int),
                   "iteration?": int, "node?": (None, str), "reward?": (None, float), "metrics?": (None, dict),
                   "attribution?": object, "accepted?": (None, bool), "failures?": [dict], "gate?": (None, dict)}
NODE_SHAPE = {"payload": int, "visits": int, "value_sum": float, "reward": (None, float), "info": dict,
              "children": [dict]}
STATE_SHAPE = {"args": dict, "calls_spent": int, "events": [dict], "card": (None, dict), "gate_tasks?": [str],
               "usage?": (None, {"target?": USAGE_SHAPE, "teacher?": USAGE_SHAPE, "wall_seconds?": float,
                                 "sessions?": int}),
               "search": (None, {"phase": str, "candidates": [CANDIDATE_SHAPE], "events": [dict],
                                 "general": (None, {"best": int, "best_reward": float, "iteration": int, "stale": int}),
                                 "trees": {str: {"root": NODE_SHAPE, "iterations": int}}})}


def check_state(state, where: str) -> dict:
    """`state` (a parsed state.json) when --resume can continue it: STATE_SHAPE, candidate ids counting from 0
    with no field the search does not know, and the climb's and every tree node's candidate among them (the
    trees walked in a loop); else ShapeError naming `where` and the field."""
    check_shape(state, STATE_SHAPE, where)
    search = state["search"] or {"candidates": [], "general": None, "trees": {}}
    n = len(search["candidates"])
    for i, candidate in enumerate(search["candidates"]):
        unknown = sorted(set(candidate) - {k.rstrip("?") for k in CANDIDATE_SHAPE})
        if candidate["id"] != i or unknown:
            raise ShapeError(f"{where}: field search.candidates[{i}]: " + (f"id {candidate['id']}, expected {i} "
                             f"(ids count the candidates)" if not unknown else f"unknown field {unknown[0][:40]!r}"))
    if search["general"] is not None and not 0 <= search["general"]["best"] < n:
        raise ShapeError(f"{where}: field search.general.best: {search['general']['best']} is no candidate's id")
    for task_type, tree in search["trees"].items():
        stack = [(tree["root"], f"search.trees[{task_type[:40]!r}].root")]
        while stack:
            node, at = stack.pop()
            check_shape(node, NODE_SHAPE, f"{where}: {at}")
            if not 0 <= node["payload"] < n:
                raise ShapeError(f"{where}: field {at}.payload: {node['payload']} is no candidate's id")
            stack.extend((child, f"{at}.children[{i}]") for i, child in enumerate(node["children"]))
    return state
