"""`alfworld`: ALFWorld itself (Shridhar et al., 2021), played on its own TextWorld/PDDL engine.

Each task is one ALFWorld game, played as ALFWorld's text setting plays it (AlfredTWEnv's wrappers:
textworld's PddlEnv, alfworld's AlfredDemangler and AlfredInfos): the first observation is the room
and the task line ("You are in the middle of a room. Looking quickly around you, you see a cabinet
1, ... \\n\\nYour task is to: put a cool mug in cabinet."; the "-= Welcome to TextWorld, ALFRED! =-"
banner is dropped, as ReAct's and MASA's agents drop it), each step is one command (go to, open,
close, take X from Y, move X to Y, heat, cool, clean X with Y, use, examine, inventory, look),
`admissible_actions()` are the engine's admissible commands, a command it does not take answers
exactly "Nothing happens." (counted), and the episode ends when the game is won (success) or after
MAX_STEPS = 50 steps, ALFWorld's limit.

Games, by where they come from:

* generated (the default): made offline from the alfworld wheel's floor-plan layouts and checked
  solvable by replaying the engine's planner's walkthrough (tasks/alfworld_games.py), cached; `n`
  games of a split (default 10 per type), the six types interleaved; held-out games are in floor
  plans no train game uses.
* ALFWorld's own (`data=`, or $MINSKILL_ALFWORLD_DATA, which the scripts' --alfworld-data sets): the
  folder `alfworld-download` fills ($ALFWORLD_DATA, holding json_2.1.1/) or json_2.1.1 itself. Split
  "train" is its train games, "heldout" its valid_unseen (out of distribution: the 134 games ReAct,
  Reflexion and MASA report), "valid_seen" and "valid_unseen" name theirs; a game is taken as
  AlfredTWEnv takes it (a traj_data.json of the six types beside a game.tw-pddl marked solvable; no
  "movable" or "Sliced" path). All games of the split unless `n` is set (then the first n, types
  interleaved).

Task types are ALFWorld's six (TASK_TYPES); TYPE_NAMES lists the other names a skill library may key
them by: MASA's released ALFWorld libraries (pick_and_place, look_at_obj, pick_clean_then_place,
...) and the household suite's. The engine is an optional extra: without it loading the suite is an
error naming `pip install alfworld==0.4.2 'textworld[pddl]'`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .alfworld_games import (GAME_FILE, INSTALL_COMMAND, TASK_TYPES, TRAJ_FILE, EngineMissing,
                             GameError, close_game, engine, make_games, open_game, read_game,
                             reset_game)
from .base import Environment, Task, check_split, counts_per_type, interleave, task_id

__all__ = ["TASK_TYPES", "TYPE_NAMES", "MAX_STEPS", "DATA_ENV", "INSTALL_COMMAND", "AlfworldEnv",
           "EngineMissing", "GameError", "generate_alfworld", "oracle_actions"]

TYPE_NAMES = {
    "pick_and_place_simple": ("pick_and_place",),
    "look_at_obj_in_light": ("look_at_obj", "examine"),
    "pick_clean_then_place_in_recep": ("pick_clean_then_place", "clean"),
    "pick_heat_then_place_in_recep": ("pick_heat_then_place", "heat"),
    "pick_cool_then_place_in_recep": ("pick_cool_then_place", "cool"),
    "pick_two_obj_and_place": ("pick_two_obj",),
}
MAX_STEPS = 50
DEFAULT_PER_TYPE = 10
DATA_ENV = "MINSKILL_ALFWORLD_DATA"   # ALFWorld's downloaded data, when the games are to be its own
OFFICIAL_SPLITS = {"train": "train", "heldout": "valid_unseen", "valid_seen": "valid_seen",
                   "valid_unseen": "valid_unseen"}
ACTION_SYNTAX = ("go to X", "open X", "close X", "take X from Y", "move X to Y", "heat X with Y",
                 "cool X with Y", "clean X with Y", "use X", "examine X", "inventory", "look")
BANNER = "-= Welcome to TextWorld, ALFRED! =-"
GOAL = re.compile(r"Your task is to: (.*?)(?:\"|\\n|$)")


def generate_alfworld(split: str = "train", seed: int = 0, n: int | None = None,
                      types: tuple[str, ...] = TASK_TYPES, data: str | Path | None = None,
                      cache_dir: str | Path | None = None) -> list[Task]:
    """The alfworld suite's tasks of a split (module docstring): ALFWorld's own games from `data`
    (default $MINSKILL_ALFWORLD_DATA), else generated games; "all" is train then held-out."""
    data = data or os.environ.get(DATA_ENV) or None
    if split == "all":
        return (generate_alfworld("train", seed, n, types, data, cache_dir)
                + generate_alfworld("heldout", seed, n, types, data, cache_dir))
    if data is not None:
        return load_official(data, split, n, types)
    check_split(split, allow_all=False)
    counts = counts_per_type(types, TASK_TYPES, n, DEFAULT_PER_TYPE, "alfworld task types")
    folders = make_games(split, seed, counts, cache_dir)
    by_type = {t: [game_task(f, split, {"seed": seed, "source": "generated"}) for f in folders[t]]
               for t in types}
    return interleave(by_type, types)


def load_official(data: str | Path, split: str, n: int | None, types) -> list[Task]:
    """ALFWorld's own games of a split, found as AlfredTWEnv finds them (module docstring)."""
    if split not in OFFICIAL_SPLITS:
        raise ValueError(f"unknown split {split!r} of ALFWorld's games; "
                         f"use {', '.join(OFFICIAL_SPLITS)}")
    unknown = [t for t in types if t not in TASK_TYPES]
    if unknown:
        raise ValueError(f"unknown alfworld task types {unknown}; known: {', '.join(TASK_TYPES)}")
    engine()   # (before any game is read: without it no game could be played)
    root = Path(data).expanduser()
    root = root / "json_2.1.1" if (root / "json_2.1.1").is_dir() else root
    folder = root / OFFICIAL_SPLITS[split]
    if not folder.is_dir():
        raise FileNotFoundError(f"--alfworld-data {data}: no {OFFICIAL_SPLITS[split]}/ folder of "
                                f"ALFWorld's games in {root} (the folder `alfworld-download` "
                                f"fills, or its json_2.1.1/)")
    by_type: dict[str, list[Task]] = {t: [] for t in types}
    for traj in sorted(folder.rglob(TRAJ_FILE)):
        trial = traj.parent
        if "movable" in str(trial) or "Sliced" in str(trial) or not (trial / GAME_FILE).is_file():
            continue
        task_type = read_json_field(traj, "task_type")
        if task_type in by_type and read_game(trial / GAME_FILE).get("solvable"):
            by_type[task_type].append(game_task(
                trial, split, {"source": "alfworld", "path": str(trial.relative_to(root))}))
    tasks = interleave(by_type, types)
    return tasks if n is None else tasks[:n]


def read_json_field(path: Path, field: str):
    """One field of a small JSON file (a traj_data.json), or GameError naming the file."""
    import json
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise GameError(f"{path}: not readable JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise GameError(f"{path}: not a JSON object")
    return data.get(field)


def game_task(folder: Path, split: str, metadata: dict) -> Task:
    """The Task of the game in `folder` (its game.tw-pddl and traj_data.json)."""
    task_type = read_json_field(folder / TRAJ_FILE, "task_type")
    game_file = folder / GAME_FILE
    goal = GOAL.search(read_game(game_file)["grammar"])
    question = f"Your task is to: {goal.group(1)}" if goal else ""
    key = metadata.get("path") or f"{folder.parent.name}/{folder.name}"
    return Task(id=task_id(f"alfworld-{task_type}", key), type=task_type, question=question,
                answer=None, verifier="env", multi_turn=True, max_steps=MAX_STEPS,
                env_spec={"kind": "alfworld", "game": str(game_file.resolve())},
                metadata={"suite": "alfworld", "split": split, "game": key, **metadata})


class AlfworldEnv(Environment):
    """One ALFWorld game on its engine; `spec` is the task's env_spec
    ({"kind": "alfworld", "game": PATH})."""
    action_syntax = ACTION_SYNTAX

    def __init__(self, spec: dict, max_steps: int = MAX_STEPS):
        super().__init__(max_steps)
        self.spec = spec
        self.game = None
        self.admissible: list[str] = []

    def _reset(self) -> str:
        self.close()
        self.game = open_game(self.spec["game"])
        state = reset_game(self.game)
        self.admissible = list(state["admissible_commands"])
        text = state.feedback.strip()
        return text[len(BANNER):].strip() if text.startswith(BANNER) else text

    def _step(self, action: str) -> str:
        state, _, _ = self.game.step(action)
        self.admissible = list(state["admissible_commands"])
        if state["won"]:
            self.success = self.done = True
        return state.feedback.strip()

    def step(self, action: str) -> tuple[str, bool, bool]:
        result = super().step(action)
        # the engine's planner library is large: give it back as soon as the game ends
        if self.done:
            self.close()
        return result

    def admissible_actions(self) -> list[str]:
        return list(self.admissible)

    def close(self) -> None:
        if self.game is not None:
            game, self.game = self.game, None
            close_game(game)


def oracle_actions(task: Task) -> list[str]:
    """The game's walkthrough: the one stored in it (generated games keep the planner's), else the
    engine's planner's."""
    game = read_game(Path(task.env_spec["game"]))
    if game.get("walkthrough"):
        return list(game["walkthrough"])
    env = open_game(task.env_spec["game"], walkthrough=True)
    try:
        return list(reset_game(env).get("extra.walkthrough") or [])
    finally:
        close_game(env)
