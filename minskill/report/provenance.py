"""Edit provenance: what a run folder records about where each skill came from, read back for the
HTML report (minskill/report/), and the format of the lineage a Skill-R1 run adds
(skill_r1/records.py:lineage_records).

The report never re-runs a model: it only reads what the runs wrote. `load_run(folder)` tells the
kind of a run folder by the files it holds and reads them, with errors naming the file (and
FILE:LINE for a JSONL line) and, for a value of the wrong shape, the field (the shapes below,
checked with minskill.files.check_shape, are what the report uses; fields a run did not record are
optional). A file it would read that resolves outside the folder (a symbolic link out of it) is
refused: the page shows the run's own files only.

    kind           written by                  files read
    skill-r1       train_grpo.py (training)    metrics.jsonl (one row per step, with `probes`);
                                               checkpoint/trainer_state.pt (the flags,
                                               memory-mapped); lineage.jsonl when the run records it
    masa           evolve_masa.py              state.json (every candidate: skills, parent, reward,
                                               metrics, attribution, failures; the climb; the
                                               trees), run.json, results.json (held-out),
                                               model_card.json
    skill-r1-eval  train_grpo.py --eval        eval.json (skill_r1.evaluate.eval_record: the rows,
                                               per-task scores, the skills written per instance,
                                               the paired table, costs)
    compare        rewrite.py apply --compare  compare.json (with `costs` per role),
                                               trajectories-*.jsonl, teacher_oneshot/
    rewriter       rewrite.py train            metrics.jsonl (loss per step), run_config.json
    transfer       python -m minskill.measure.transfer
                                               transfer.json (drawn by minskill/report/transfer.py)

The cost per role is what the runs record with minskill/serve/client.py's Usage (calls, prompt and
completion tokens, summed request seconds, busy wall seconds): MASA's run.json / state.json `usage`
(target and teacher, the target's cache hits apart), a Skill-R1 metrics row's task_* and seconds_*
fields, eval.json's and compare.json's `costs`.

Derived here, from recorded data only:

* gained / lost tasks of a skill against its parent: the tasks both were scored on where the child's
  reward is higher / lower (`gained_lost`). MASA records each candidate's per-task rewards as
  metrics["task_rewards"] (masa.MasaSearch.evaluate); a Skill-R1 lineage row records `task_scores`.
* the UCB1 value of each tree node when it was selected (`replay_ucb1`). The search evaluates every
  node right after creating it and the selected node is always the new node's parent, so the
  statistics at the moment node k was created are those of the nodes created before it (candidate
  ids give the order):

      N(p)  = nodes created before k in p's subtree,   R̄(p) = their mean own reward
      UCB1(p) = R̄(p) + C · sqrt(ln N(parent(p)) / N(p))            (the root has no UCB1)

  An iteration whose teacher reply was skipped made no child and changed no statistic, so it leaves
  no trace; the replayed final N(n) must equal the recorded visits (checked, and said in the report
  if not).
* the trajectories that motivated an edit: the failed episodes of its parent (`failures` of the
  parent candidate), which is what teacher.attribution_messages showed the teacher.

Skill-R1 lineage (`lineage_records` of minskill/skill_r1/records.py: one JSON line per instance and
training step in OUT/lineage.jsonl):

    {"step", "instance", "task_type", "task_ids": [...], "questions": [...],
     "skills": [{"id": "g0" | "g<g>.<i>", "generation",
                 "parent": id of the skill carried into that generation (the "current skill" of
                 the editor's prompt), "text" (None: the reply did not parse), "reply" (the raw
                 reply when it did not parse), "parse_error", "reward", "advantage",
                 "task_scores": [mean score per task, in task_ids order] or None}],
     "carried": [id carried after generation 0, 1, ..., G],
     "gates": [the carry gate's decision record of generation 1..G (minskill/gates.py), or None],
     "editor_prompts": [{"generation", "current", "history": [ids, newest first], "prompt_tokens",
                         "outcomes_per_entry"}]}

train_grpo.py appends these records every step (skill_r1/records.py's log_step).
The history is what the prompt offered: editor_messages drops the oldest entries when the prompt
would exceed --context-tokens, which `prompt_tokens` lets a reader judge.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from minskill.files import ShapeError, check_shape, inside, read_json, read_jsonl
from minskill.masa import ucb
from minskill.measure.transfer_record import check_matrix

NOT_RECORDED = "not recorded by this run"
EVAL_VERSION = 2   # of eval.json, as skill_r1.evaluate.eval_record writes it


class NotARun(ValueError):
    """A folder the report cannot read as a run, or a run file that does not parse or has the wrong
    shape."""


# ----------------------------------------------------------------------------------------------
# shapes

def _optional(*keys: str, shape=float) -> dict:
    return {f"{k}?": shape for k in keys}


USAGE = {**_optional("calls", "prompt_tokens", "completion_tokens", "request_seconds",
                     "busy_seconds"),
         "wall_seconds?": (None, float)}
PROBE = {"after_steps": float, "reward_per_generation": [float, ...],
         **_optional("carried_reward", "beat_seed_share",
         shape=(None, float)), "task_calls?": float, "seconds?": float,
         "task_usage?": (None, {"prompt_tokens": float, "completion_tokens": float}),
         "skills?": (None, [{"reward?": float, "seed_reward?": float, "skill?": (None, str)}])}
SKILL_R1_ROW = {"step": int, "reward_per_generation": [float], "probes?": (None, [PROBE]),
                "best_skill?": (None, str),
                **_optional("task_calls", "task_tokens", "task_prompt_tokens",
                            "task_completion_tokens",
                            "task_request_seconds", "task_seconds", "editor_sampled_tokens",
                            "seconds_editor_sampling",
                            "editor_sample_tokens_per_s", "seconds_sampling_and_rollouts",
                            "train_tokens_per_s",
                            "seconds_update")}
LINEAGE_ROW = {"step": int, "carried": [str, ...], "task_ids?": (None, [str]),
               "questions?": (None, [str]),
               "skills": [{"id": str, "generation?": int, "parent?": (None, str),
                           "text?": (None, str),
                           "reply?": (None, str), "reward?": float, "advantage?": (None, float),
                           "task_scores?": (None, [float])}, ...],
               "editor_prompts?": (None, [{"generation": int, "current": str, "history": [str]}])}
CANDIDATE = {"id": int, "phase": str, "skills": object, "parent?": (None, int), "iteration": float,
             "reward?": (None, float),
             "metrics?": (None, {"success_rate?": (None, float), "nhr?": (None, float),
                                 "task_rewards?": (None, {str: float})}),
             "failures?": (None, [object]), "gate?": (None, {"p?": float})}
NODE = {"id": str, "reward?": (None, float), "visits?": (None, int), "value_sum?": float,
        "children?": [dict]}
MASA_STATE = {"args": {"c?": float}, "usage": {"target?": (None, USAGE), "teacher?": (None, USAGE),
                                               "wall_seconds?": float},
              "events?": (None, [dict]), "card?": (None, dict),
              "search?": (None, {"candidates?": (None, [CANDIDATE]), "events?": (None, [dict]),
                                 "trees?": (None, {str: {"root": NODE, "iterations?": int}})})}
MASA_RUN = {"usage?": (None, {"target?": (None, USAGE), "teacher?": (None, USAGE),
                              "wall_seconds?": float})}
SUMMARY = {"n?": (None, int), "success_rate?": (None, float), "nhr?": (None, float),
           "per_type?": (None, {str: dict})}
MASA_RESULTS = {"heldout?": (None, {"base": SUMMARY, "evolved": SUMMARY,
                                    "gained_lost?": (None, {str: [int, int]})})}
TRAJECTORY = {"task_id": str, "task_type": str, "reward?": float,
              "messages": [{"role?": (None, str), "content?": (None, str)}]}
COMPARE = {"results": {str: {"success_ci95?": (None, [float]), "per_type?": (None, {str: dict}),
                             **_optional(
               "success_rate", "nhr", "adjusted_reward", shape=(None, float))}},
           "costs?": (None, {"task model?": (None, USAGE), "teacher (one-shot)?": (None, USAGE),
                             "rewriter?": (None,
                                           {"completion_tokens": float, "wall_seconds": float})})}
EVAL_SKILLS = {"generations?": (None,
                                [{"g": object, "carried_reward?": float, "candidates?": (None, [
    {"reward?": float, "skill?": (None, str)}])}])}
EVAL = {"rows": [{"name": str, "success": (None, float), "scores": [[float]],
                  "ci95?": (None, [float]),
                  "per_generation?": (None, [(None, float)]), "skills?": (None, [EVAL_SKILLS]),
                  "costs?": (None, {"editor?": (None, {"sampled_tokens": float, "seconds": float,
                                                        "kl_seconds?": (None, float)})})}],
        "version": int, "flags?": (None, {"generations?": int}), "usage?": (None, USAGE),
        "wall_seconds?": float,
        "paired?": (None,
                    [{"row": object, "against": object, "difference": float, "ci95": [float, float],
                            "p": float, "per_task_gained": int, "per_task_lost": int}]),
        "instances?": (None, [{"id": object, "eval_tasks": [str], "eval_questions?": (None, [str]),
                               "evolve_tasks?": (None, [str])}])}


def _shape(value, shape, where: str):
    """files.check_shape, a wrong shape being NotARun (the report's one error)."""
    try:
        return check_shape(value, shape, where)
    except ShapeError as e:
        raise NotARun(str(e)) from None


def own_file(folder: Path, path: Path) -> Path:
    """`path` of the run folder; NotARun when it resolves outside `folder` (a link out of the
    run)."""
    try:
        inside(folder, path)
    except ValueError:
        raise NotARun(f"{path}: a link out of the run folder {folder} (to {path.resolve()}); the "
                      f"report reads only the run's own files: not read") from None
    return path


# ----------------------------------------------------------------------------------------------
# reading

def detect_kind(folder: Path) -> str:
    """The kind of run `folder` holds (module docstring), or NotARun naming the folder and what it
    expected."""
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise NotARun(f"{folder}: {what} (expected a run folder of train_grpo.py, evolve_masa.py, "
                       "rewrite.py or minskill.measure.transfer)")
    if (folder / "transfer.json").is_file():
        return "transfer"
    if (folder / "state.json").is_file():
        return "masa"
    if (folder / "compare.json").is_file():
        return "compare"
    if (folder / "eval.json").is_file():
        return "skill-r1-eval"
    if (folder / "metrics.jsonl").is_file():
        return "rewriter" if (folder / "run_config.json").is_file() else "skill-r1"
    held = sorted(p.name for p in folder.iterdir())
    shown = ", ".join(held[:8]) + (", ..." if len(held) > 8 else "") if held else "nothing"
    raise NotARun(f"{folder}: not a run folder: expected metrics.jsonl (train_grpo.py training, "
                  "rewrite.py train), eval.json (train_grpo.py --eval), state.json "
                  "(evolve_masa.py) or compare.json (rewrite.py apply --compare) or transfer.json "
                  f"(python -m minskill.measure.transfer); it holds {shown}.")


def read_rows(path: Path, required: tuple[str, ...], shape: dict | None = None) -> list[dict]:
    """The rows of a JSONL log (files.read_jsonl: a torn last line dropped), each a JSON object
    holding `required` (and of `shape`); anything else is NotARun naming FILE:LINE (and the
    field)."""
    try:
        lines = read_jsonl(own_file(path.parent, path))
    except ValueError as e:
        raise NotARun(str(e)) from None
    rows = []
    for lineno, row in lines:
        if not isinstance(row, dict):
            raise NotARun(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        missing = [k for k in required if k not in row]
        if missing:
            raise NotARun(f"{path}:{lineno}: lacks field(s) {', '.join(missing)}")
        rows.append(_shape(row, shape, f"{path}:{lineno}") if shape else row)
    return rows


def _json(path: Path, default=None, shape=None):
    """A JSON file of the run; absent: `default`; present but broken (or not of `shape`): NotARun
    naming it."""
    if not path.is_file() and not path.is_symlink():
        return default
    try:
        data = read_json(own_file(path.parent, path))
    except ValueError as e:
        raise NotARun(str(e)) from None
    return data if shape is None else _shape(data, shape, str(path))


def load_run(folder: str | Path) -> dict:
    """{"kind", "folder", "files": [names read], ...the kind's data}: see the module docstring."""
    folder = Path(folder)
    kind = detect_kind(folder)
    if kind == "transfer":
        return load_transfer(folder)
    loader = {"skill-r1": _load_skill_r1, "masa": _load_masa, "compare": _load_compare,
              "rewriter": _load_rewriter, "skill-r1-eval": _load_eval}[kind]
    return {"kind": kind, "folder": str(folder), **loader(folder)}


def _trainer_flags(folder: Path) -> dict | None:
    """The flags a train_grpo.py checkpoint was trained with (trainer_state.pt, memory-mapped: the
    optimizer state it also holds is never read into memory), or None when there is none or it does
    not load."""
    path = folder / "checkpoint" / "trainer_state.pt"
    if not path.is_file():
        return None
    own_file(folder, path)
    try:
        import torch
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {**state.get("args", {}), "editor_spec": state.get("editor_spec"),
                "checkpoint_step": state.get("step")}
    except Exception:   # an unreadable checkpoint costs the report its flags table, nothing else
        return None


def _load_skill_r1(folder: Path) -> dict:
    rows = read_rows(folder / "metrics.jsonl", ("step", "reward_per_generation"), SKILL_R1_ROW)
    if not (folder / "lineage.jsonl").is_file():
        raise NotARun(f"{folder / 'lineage.jsonl'}: missing (train_grpo.py writes it when a "
                      "training run starts)")
    lineage = read_rows(folder / "lineage.jsonl", ("step", "instance", "skills", "carried"),
                        LINEAGE_ROW)
    files = ["metrics.jsonl", "lineage.jsonl"]
    flags = _trainer_flags(folder)
    if flags is not None:
        files.append("checkpoint/trainer_state.pt")
    return {"files": files, "rows": rows, "lineage": lineage, "flags": flags}


def _load_masa(folder: Path) -> dict:
    state = _json(folder / "state.json")
    if not isinstance(state, dict) or "args" not in state:
        raise NotARun(f"{folder / 'state.json'}: not an evolve_masa.py state (no 'args')")
    _shape(state, MASA_STATE, str(folder / "state.json"))
    for task_type, tree in ((state.get("search") or {}).get("trees") or {}).items():
        _tree_shape(tree["root"], f"{folder / 'state.json'}: search.trees[{task_type[:40]!r}].root")
    names = ["state.json"] + [n for n in ("run.json", "results.json", "model_card.json")
                              if (folder / n).is_file()]
    search = state.get("search") or {"candidates": [], "general": None, "trees": {}, "events": [],
                                     "phase": "start"}
    return {"files": names, "state": state, "search": search,
            "run": _json(folder / "run.json", shape=(None, MASA_RUN)),
            "results": _json(folder / "results.json", shape=(None, MASA_RESULTS)),
            "card": _json(folder / "model_card.json", state.get("card"), shape=(None, dict))}


def _tree_shape(root: dict, where: str) -> None:
    """Every node of a saved UCB1 tree has NODE's shape (a loop: a tree may be deeper than a
    recursion)."""
    stack = [(root, "")]
    while stack:
        node, at = stack.pop()
        _shape(node, NODE, f"{where}{at}")
        stack.extend((child, f"{at}.children[{i}]")
                     for i, child in enumerate(node.get("children") or []))


def _load_compare(folder: Path) -> dict:
    compare = _json(folder / "compare.json")
    if not isinstance(compare, dict) or "results" not in compare:
        raise NotARun(
            f"{folder / 'compare.json'}: not a rewrite.py --compare result (no 'results')")
    _shape(compare, COMPARE, str(folder / "compare.json"))
    files, trajectories = ["compare.json"], {}
    for path in sorted(folder.glob("trajectories-*.jsonl")):
        name = path.stem[len("trajectories-"):].replace("_", " ")
        trajectories[name] = read_rows(path, ("task_id", "task_type", "messages"), TRAJECTORY)
        files.append(path.name)
    raw = folder / "teacher_oneshot.raw.txt"
    return {"files": files, "compare": compare, "trajectories": trajectories,
            "teacher_raw": own_file(folder, raw).read_text(encoding="utf-8", errors="replace")
            if raw.is_file() else None}


def _load_eval(folder: Path) -> dict:
    record = _json(folder / "eval.json")
    if not isinstance(record, dict) or not isinstance(record.get("rows"), list) or \
            not all(isinstance(r, dict) and {"name", "scores", "success"} <= set(r)
                    for r in record["rows"]):
        raise NotARun(f"{folder / 'eval.json'}: not a train_grpo.py --eval record (no 'rows' with "
                      f"name, scores and success)")
    _shape(record, EVAL, str(folder / "eval.json"))
    if record["version"] != EVAL_VERSION:
        raise NotARun(f"{folder / 'eval.json'}: version {record['version']}; the report reads "
                      f"version {EVAL_VERSION}, what train_grpo.py --eval writes (evaluate again)")
    return {"files": ["eval.json"], "eval": record}


def _load_rewriter(folder: Path) -> dict:
    return {"files": ["metrics.jsonl", "run_config.json"],
            "rows": read_rows(folder / "metrics.jsonl", ("step",),
                              {"step": float, "target_tokens?": float}),
            "config": _json(folder / "run_config.json", {}, shape=dict)}


def load_transfer(folder) -> dict:
    """{"kind": "transfer", "folder", "files", "transfer"}; NotARun for a missing or malformed
    transfer.json (minskill.measure.transfer_record.check_matrix: the shapes the page uses, naming
    the field)."""
    folder = Path(folder)
    try:
        data = read_json(own_file(folder, folder / "transfer.json"))
    except (FileNotFoundError, ValueError) as e:
        raise NotARun(str(e)) from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list)
                                             for k in ("libraries", "targets", "cells")):
        raise NotARun(f"{folder / 'transfer.json'}: not a transfer matrix (no libraries, targets "
                      "and cells lists)")
    try:
        check_matrix(data, str(folder / "transfer.json"))
    except ShapeError as e:
        raise NotARun(str(e)) from None
    return {"kind": "transfer", "folder": str(folder), "files": ["transfer.json"], "transfer": data}



# ----------------------------------------------------------------------------------------------
# derived

def gained_lost(parent: dict | None, child: dict | None) -> tuple[list[str], list[str], int] | None:
    """(tasks where the child's reward is higher, lower, number of tasks both were scored on), from
    two {task id: reward} maps; None when either is not recorded."""
    if parent is None or child is None:
        return None
    common = [t for t in child if t in parent]
    return ([t for t in common if child[t] > parent[t]],
            [t for t in common if child[t] < parent[t]], len(common))


def replay_ucb1(root: dict, c: float) -> tuple[dict[str, list[float | None]], dict[str, int]]:
    """(node id -> the UCB1 value it had each time it was selected for expansion, None for the root;
    node id -> replayed visits), from a tree as ucb.to_dict writes it with candidate ids as
    payloads."""
    nodes: dict[str, tuple[dict, str | None]] = {}
    stack = [(root, None)]
    while stack:
        node, parent = stack.pop()
        nodes[node["id"]] = (node, parent)
        stack.extend((child, node["id"]) for child in node.get("children", []))

    def created(node_id):   # candidate ids count up as the search creates candidates
        payload = nodes[node_id][0].get("payload")
        return (0, payload, node_id) if isinstance(payload, int) else (1, 0, node_id)

    visits, sums, selected = defaultdict(int), defaultdict(float), defaultdict(list)
    for node_id in sorted(nodes, key=created):
        node, parent = nodes[node_id]
        if parent is not None and visits[parent]:
            grand = nodes[parent][1]
            selected[parent].append(None if grand is None else
                                    sums[parent] / visits[parent] + c
                                    * math.sqrt(math.log(visits[grand]) / visits[parent]))
        if node.get("reward") is not None:
            at = node_id
            while at is not None:           # backpropagation, as ucb.backpropagate
                visits[at] += 1
                sums[at] += float(node["reward"])
                at = nodes[at][1]
    return dict(selected), dict(visits)


def best_node_id(root: dict) -> str | None:
    """The tree's result (ucb.best_node: highest own reward, then shallower, then created first)."""
    try:
        best = ucb.best_node(ucb.from_dict(root))
    except ValueError:
        return None
    return None if best is None else best.id


def task_rewards(candidate: dict) -> dict | None:
    """A MASA candidate's {task id: reward}, or None when the run did not record it."""
    scores = (candidate.get("metrics") or {}).get("task_rewards")
    return scores if isinstance(scores, dict) and scores else None


def lineage_scores(skill: dict, task_ids: list[str]) -> dict | None:
    scores = skill.get("task_scores")
    return None if scores is None or len(scores) != len(task_ids) else dict(zip(task_ids, scores))
