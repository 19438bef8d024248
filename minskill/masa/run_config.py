"""evolve_masa.py's command line, written once: its flags (`build_parser`) with their defaults
(MasaRunConfig: the search's MasaConfig and the run's own), and the shape of the state.json its
--resume reads (`check_state`)."""
import argparse
from dataclasses import dataclass

from minskill import gates
from minskill.cli import DefaultsHelpFormatter, add_task_model_args, add_teacher_args
from minskill.device import add_device_args
from minskill.files import ShapeError, check_shape
from minskill.masa.search import MasaConfig
from minskill.retrieval import add_retrieval_args


@dataclass
class MasaRunConfig(MasaConfig):
    """The search's knobs are MasaConfig's fields, inherited with their defaults; these are the
    run's."""
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


DEFAULTS = MasaRunConfig()   # every default of the flags (argparse reads them)
# the embedded 135M teacher: short replies and no retry (a retry costs a minute and rarely parses)
EMBEDDED_TEACHER = {"teacher_retries": 0, "teacher_max_tokens": 384}


def build_parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    p = argparse.ArgumentParser(
        prog="python evolve_masa.py",
        usage="%(prog)s [main options] [other options, grouped below]",
        description="MASA stage 1: hill climbing on general skills and UCB1 tree search on "
                    "task-specific skills for one target model, driven by a teacher LLM. With no "
                    "endpoints, the target and the teacher are both the embedded offline default "
                    "model (one local server).",
        formatter_class=DefaultsHelpFormatter)
    m = p.add_argument_group("main options")
    # -- tasks and skills
    g = p.add_argument_group("tasks and skills")
    m.add_argument("--suite", default=d.suite,
                   help="qa | household | webwalk | webshop | searchqa | PATH.jsonl")
    g.add_argument("--n-train", type=int, default=d.n_train, help="search tasks (train split)")
    g.add_argument("--n-prelim", type=int, default=d.n_prelim,
                   help="preliminary train tasks for the card's strengths/weaknesses (apart from "
                        "the search); 0 = none")
    g.add_argument("--n-heldout", type=int, default=d.n_heldout,
                   help="held-out tasks of the final table; 0 = no table")
    g.add_argument("--task-seed", type=int, default=d.task_seed, help="seed of the generated suite")
    g.add_argument("--base-skills", default=None,
                   help="base skill library: Agent Skills folder or MASA .json (default: the "
                        "suite's built-in)")
    add_retrieval_args(p.add_argument_group(
        "retrieval in the held-out evaluation (minskill.retrieval)"))
    # -- target model and teacher
    g = p.add_argument_group("target model and teacher")
    g.add_argument("--model-card", default=None, help="model card of the target: JSON, or YAML as "
                   "MASA's model_cards/*.yaml (minskill.masa.model_card)")
    g.add_argument("--target-checkpoint", default=None,
                   help="HF folder whose config.json fills the card")
    add_task_model_args(g, concurrency=d.task_concurrency, max_tokens=d.target_max_tokens,
                        url_help="; the task model is MASA's target, the "
                        "model the skills are adapted for", main=m)
    add_teacher_args(g, main=m)
    g.add_argument("--model-spec", default=d.model_spec,
                   help="model of the embedded server (no URL given)")
    g.add_argument("--timeout", type=float, default=d.timeout,
                   help="seconds to wait for one reply (a 135M teacher on a busy CPU writes "
                        "slowly)")
    g.add_argument("--startup-timeout", type=float, default=d.startup_timeout,
                   help="seconds to wait for the embedded server")
    add_device_args(g, bf16=False, what="the embedded server (target and teacher) runs")
    # -- search
    g = p.add_argument_group("search")
    m.add_argument("--lam-nh", type=float, default=d.lam_nh, help="λ of R = SR − λ·NHR")
    m.add_argument("--iterations", type=int, default=d.iterations,
                   help="I: hill-climbing iterations (paper: 10)")
    g.add_argument("--patience", type=int, default=d.patience,
                   help="p: stop after p iterations without improvement")
    m.add_argument("--tree-iterations", type=int, default=d.tree_iterations,
                   help="J: UCB1 iterations per task type (paper: 10)")
    m.add_argument("--episodes", type=int, default=d.episodes,
                   help="N: episodes per tree-node evaluation")
    g.add_argument("--c", type=float, default=d.c, help="UCB1 exploration constant C")
    g.add_argument("--max-children", type=int, default=d.max_children,
                   help="rewrites per tree node before descending")
    m.add_argument("--gate", choices=gates.MASA_GATES, default=d.gate,
                   help="acceptance gate of the climb and of each tree's result: strict = R "
                        "strictly higher (the paper); paired = also a one-sided exact sign test on "
                        "the per-task rewards at --gate-alpha; fresh = R strictly higher and that "
                        "sign test on --gate-tasks train tasks the search never scores nor shows "
                        "the teacher (minskill/gates.py); fixed on --resume")
    g.add_argument("--gate-alpha", type=float, default=d.gate_alpha,
                   help="α of --gate paired / fresh")
    g.add_argument("--gate-tasks", type=int, default=d.gate_tasks,
                   help="--gate fresh: train tasks drawn after the search and preliminary ones for "
                        "its sign test (the climb uses all, a tree those of its type)")
    g.add_argument("--teacher-max-tokens", type=int, default=None,
                   help=f"reply budget of the teacher (default {d.teacher_max_tokens} for "
                        f"--teacher-url, {EMBEDDED_TEACHER['teacher_max_tokens']} for the slow "
                        f"embedded model)")
    g.add_argument("--teacher-temperature", type=float, default=d.teacher_temperature,
                   help="teacher sampling temperature")
    g.add_argument("--teacher-retries", type=int, default=None,
                   help=f"retries of a teacher reply that does not parse (default "
                        f"{d.teacher_retries} for --teacher-url; "
                        f"{EMBEDDED_TEACHER['teacher_retries']} for the embedded 135M teacher, "
                        "whose retries cost a minute and rarely parse)")
    g.add_argument("--seed", type=int, default=d.seed,
                   help="seed of target/teacher sampling and augmentations")
    # -- run control
    g = p.add_argument_group("run control")
    m.add_argument("--max-calls", type=int, default=None, help="model-call budget of the whole run")
    g.add_argument("--cache", default=None,
                   help="target-call cache file (default OUT/target_cache.jsonl)")
    g.add_argument("--no-cache", action="store_true", help="do not cache target calls")
    m.add_argument("--resume", action="store_true", help="continue the run saved in --out (the "
                   "resume policy: minskill/runs.py)")
    m.add_argument("--overwrite", action="store_true", help="replace the run that a non-empty "
                   "--out holds, keeping its target_cache.jsonl (without --resume or --overwrite "
                   "such an --out is refused)")
    m.add_argument("--out", default=None, help="output folder (default runs/masa-SUITE-TIME)")
    g.add_argument("--sft-copies", type=int, default=d.sft_copies,
                   help="augmented copies per augmentation kind in sft.jsonl")
    m.add_argument("--merge", nargs="+", default=None, metavar="RUN_DIR",
                   help="merge the SFT records of these runs (+ other_backbone records) into "
                        "OUT/sft.jsonl")
    return p


# What --resume reads of state.json (minskill.files.check_shape; check_state): every field
# MasaSearch.restore, the budget and the usage counters take, as to_json wrote them (a candidate
# field with a default may be absent)
USAGE_SHAPE = {f"{k}?": (None, float) for k in ("calls", "failures", "prompt_tokens",
                                                 "completion_tokens", "request_seconds",
                                                 "busy_seconds")}
CANDIDATE_SHAPE = {"id": int, "phase": str, "skills": dict, "task_type?": (None, str),
                   "parent?": (None, int), "iteration?": int, "node?": (None, str),
                   "reward?": (None, float), "metrics?": (None, dict), "attribution?": object,
                   "accepted?": (None, bool), "failures?": [dict], "gate?": (None, dict)}
NODE_SHAPE = {"payload": int, "visits": int, "value_sum": float, "reward": (None, float),
              "info": dict, "children": [dict]}
CLIMB_SHAPE = {"best": int, "best_reward": float, "iteration": int, "stale": int}
STATE_SHAPE = {"args": dict, "calls_spent": int, "events": [dict], "card": (None, dict),
               "gate_tasks?": [str],
               "usage?": (None, {"target?": USAGE_SHAPE, "teacher?": USAGE_SHAPE,
                                 "wall_seconds?": float, "sessions?": int}),
               "search": (None, {"phase": str, "candidates": [CANDIDATE_SHAPE], "events": [dict],
                                 "general": (None, CLIMB_SHAPE),
                                 "trees": {str: {"root": NODE_SHAPE, "iterations": int}}})}


def check_state(state, where: str) -> dict:
    """`state` (a parsed state.json) when --resume can continue it: STATE_SHAPE, candidate ids
    counting from 0 with no field the search does not know, and the climb's and every tree node's
    candidate among them (the trees walked in a loop); else ShapeError naming `where` and the
    field."""
    check_shape(state, STATE_SHAPE, where)
    search = state["search"] or {"candidates": [], "general": None, "trees": {}}
    n = len(search["candidates"])
    for i, candidate in enumerate(search["candidates"]):
        unknown = sorted(set(candidate) - {k.rstrip("?") for k in CANDIDATE_SHAPE})
        if candidate["id"] != i or unknown:
            raise ShapeError(f"{where}: field search.candidates[{i}]: "
                             + (f"id {candidate['id']}, expected {i} (ids count the candidates)"
                                if not unknown else f"unknown field {unknown[0][:40]!r}"))
    if search["general"] is not None and not 0 <= search["general"]["best"] < n:
        raise ShapeError(f"{where}: field search.general.best: {search['general']['best']} is no "
                         f"candidate's id")
    for task_type, tree in search["trees"].items():
        stack = [(tree["root"], f"search.trees[{task_type[:40]!r}].root")]
        while stack:
            node, at = stack.pop()
            check_shape(node, NODE_SHAPE, f"{where}: {at}")
            if not 0 <= node["payload"] < n:
                raise ShapeError(f"{where}: field {at}.payload: {node['payload']} is no "
                                 f"candidate's id")
            stack.extend((child, f"{at}.children[{i}]") for i, child in enumerate(node["children"]))
    return state
