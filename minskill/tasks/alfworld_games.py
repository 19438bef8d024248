"""ALFWorld games made offline from the alfworld wheel's own files, checked solvable, cached.

A game of ALFWorld's text engine is two files in a folder: `game.tw-pddl` (JSON: `pddl_domain`, the
wheel's `alfworld/data/alfred.pddl`; `grammar`, its `alfred.twl2` with the goal's words in place of
"UNKNOWN GOAL"; `pddl_problem`; `solvable`; `walkthrough`) beside `traj_data.json` (`task_type`,
`pddl_params`, `scene`). ALFRED's own problems are not in the wheel, but the layouts of its AI2-THOR
floor plans are (`alfworld/gen/layouts/FloorPlanN-objects.json`, `-openable.json`, `-layout.npy`),
and so are ALFRED's rules (`alfworld.gen.constants`, `alfworld.gen.goal_library`). `make_games`
draws games from them:

1. a floor plan of a room type ALFRED allows for the task type (constants.GOALS_VALID: heat and cool
   in kitchens, look in living rooms and bedrooms, ...), and of the split (below);
2. its receptacles: each one of `-openable.json` where the layout names it (a sink or a bathtub
   stands for its basin, as in ALFRED's ids "Sink|x|y|z|SinkBasin"), the scene's other receptacle
   types (coffee machine, toaster, stove burners, garbage can, ...) at a point of the layout's grid;
3. a goal as ALFRED draws them: an object type of the scene that the task's action takes (cleanable,
   heatable, coolable: constants.VAL_ACTION_OBJECTS), a receptacle type that may hold it
   (constants.VAL_RECEPTACLE_OBJECTS) other than the appliance, a lamp for a look task;
4. the scene's movable objects (1-2 of each type, 1-3 of the goal's, 2-3 for "two"), each in a
   receptacle that may hold it, never the goal's own, so that no game starts solved; a lamp sits on
   a table-like receptacle, since the domain's "use" needs the lamp to be in one;
5. the PDDL problem (ALFRED's names escaped as ALFRED escapes them: "|" -> "_bar_", ...) with the
   goal of goal_library.gdict, and the goal's words from one of its templates ("put a cool mug in
   cabinet").

Each game is then played: the engine's planner (fast-downward) plans from the start (in the room
without the objects the goal does not name: a kitchen's forty objects make it plan for minutes, and
each type's instances are numbered among themselves, so its commands name the same things), and the
plan is replayed in the game command by command; a game is kept only when every command is
admissible and the last one wins. One that is not is kept in the cache too, marked `"solvable":
false` (ALFWorld's own loaders skip such games), counted and never offered.

Split: by floor plan, split_of("alfworld|FloorPlanN") (tasks/base.py), so held-out games are played
in rooms no training game uses (ALFWorld's valid_unseen in spirit). Seed: the draws of a (split,
seed, task type) come from their own generator (rng_for), so the same arguments give the same games.

Cache: CACHE/alfworld/games-v1/<split>/<task_type>-<Object>-None-<Receptacle>-<N>/<digest>/
(ALFWorld's own folder layout, so that its loaders read it too), CACHE = $MINSKILL_CACHE, else
~/.cache/minskill (the default model's folder, nn/weights.py). A game's folder is written whole into
a temporary folder beside it and renamed into place, so that a killed run leaves no half game; a
folder already there is reused, never rewritten. The digest names the game's content, so two runs
agree on what is cached.

The engine (`pip install alfworld==0.4.2 'textworld[pddl]'`) is imported only when games are played
or made: `engine()` raises EngineMissing naming that line when it is absent.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from .base import rng_for, split_of

INSTALL_COMMAND = "pip install alfworld==0.4.2 'textworld[pddl]'"
TASK_TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
              "pick_two_obj_and_place")
# a new one when what a draw makes changes: old caches are never misread
GAMES_VERSION = "games-v1"
GAME_FILE, TRAJ_FILE = "game.tw-pddl", "traj_data.json"
# the appliance a task type's action needs (the goal never puts the object there), and the objects
# it takes
APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin",
             "pick_heat_then_place_in_recep": "Microwave",
             "pick_cool_then_place_in_recep": "Fridge"}
ACTION_PROPERTY = {"pick_clean_then_place_in_recep": "Cleanable",
                   "pick_heat_then_place_in_recep": "Heatable",
                   "pick_cool_then_place_in_recep": "Coolable"}
LAMPS = ("DeskLamp", "FloorLamp")
LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "CoffeeTable", "TVStand", "DiningTable", "Shelf",
              "ArmChair", "Sofa", "Bed", "Ottoman")
# the layout's name -> ALFRED's receptacle
BASINS = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}
GRID = 0.25   # metres a step of ALFRED's navigation grid ("loc|x|z|rotation|horizon" counts steps)


class EngineMissing(ImportError, ValueError):
    """ALFWorld's engine is not installed (a ValueError too: the scripts' usage errors catch it)."""


class GameError(ValueError):
    """A game file or layout that cannot be read or played; the message names it."""


# -------------------------------------------------------------------------------------- make games

def make_games(split: str, seed: int, counts: dict[str, int], cache_dir: str | Path | None = None,
               progress=None) -> dict[str, list[Path]]:
    """`counts[t]` solvable games of each task type t of `split`, made or taken from the cache: the
    folders that hold them, in draw order. `progress(text)` hears how the making goes (default:
    stderr, only when some game is not cached yet)."""
    rules, layouts = alfred_rules(), layouts_dir()
    plans = floor_plans(layouts)
    root = games_root(cache_dir) / split
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    made = {"checked": 0, "dropped": 0, "started": time.time()}
    out = {}
    for task_type, count in counts.items():
        rng, games, seen, attempts = rng_for("alfworld", split, seed, task_type), [], set(), 0
        scenes = [p for p in plans if split_of(f"alfworld|{p}") == split
                  and room_type(p) in rules.GOALS_VALID[task_type]]
        while len(games) < count:
            attempts += 1
            if attempts > 50 * (count + 10) or not scenes:
                raise GameError(f"alfworld/{task_type}: could not make {count} solvable {split} "
                                f"games ({len(games)} made in {attempts} draws from {len(scenes)} "
                                f"floor plans)")
            drawn = draw_game(rng, task_type, rng.choice(scenes), rules, layouts)
            if drawn is None or drawn["digest"] in seen:
                continue
            seen.add(drawn["digest"])
            folder = root / drawn["folder"] / drawn["digest"]
            if not (folder / GAME_FILE).is_file():
                write_checked(folder, drawn)
                made["checked"] += 1
                made["dropped"] += not read_game(folder / GAME_FILE).get("solvable")
                say(f"alfworld: {split} games, seed {seed}: {made['checked']} made and checked "
                    f"({made['dropped']} unsolvable, dropped), "
                    f"{(time.time() - made['started']) / made['checked']:.1f} s a game; "
                    f"{task_type} {len(games)}/{count}")
            if read_game(folder / GAME_FILE).get("solvable"):
                games.append(folder)
        out[task_type] = games
    return out


def games_root(cache_dir=None) -> Path:
    """The cache folder of generated games (module docstring)."""
    base = cache_dir or os.environ.get("MINSKILL_CACHE") or Path.home() / ".cache" / "minskill"
    return Path(base).expanduser() / "alfworld" / GAMES_VERSION


def write_checked(folder: Path, drawn: dict) -> None:
    """Play the drawn game's planner walkthrough, record the outcome in it, and write its folder
    atomically (a folder that appeared meanwhile is kept as it is)."""
    game = dict(drawn["game"])
    game["walkthrough"] = solve(game, drawn["planning_problem"])
    game["solvable"] = game["walkthrough"] is not None
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".tmp-{folder.name}-"))
    try:
        (staging / GAME_FILE).write_text(json.dumps(game), encoding="utf-8")
        (staging / TRAJ_FILE).write_text(json.dumps(drawn["traj_data"], indent=1), encoding="utf-8")
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / GAME_FILE).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)


# -------------------------------------------------------------------------------------------- play

def solve(game: dict, planning_problem: str | None = None) -> list[str] | None:
    """The planner's walkthrough of a game (planned on `planning_problem` when given: the same room
    with fewer objects) when replaying it in the game wins, else None (no plan, the game is won
    before any move, a planned command the engine does not take, or the plan ends short of the
    goal)."""
    try:
        plan = planned(game, planning_problem or game["pddl_problem"])
        return plan if plan and replay_wins(game, plan) else None
    except EngineMissing:
        raise
    except Exception:   # the planner or the engine failed on this problem: an unsolvable game
        return None


def planned(game: dict, problem: str) -> list[str]:
    """The engine's planner's commands from the start of `game`, with `problem` as its problem."""
    planner = open_game({**game, "walkthrough": None, "pddl_problem": problem}, walkthrough=True)
    try:
        return list(reset_game(planner).get("extra.walkthrough") or [])
    finally:
        close_game(planner)


def replay_wins(game: dict, plan: list[str]) -> bool:
    """Whether `plan`, played in `game` from its start, is admissible at every step and wins at its
    end (a game won before any move is not a game)."""
    env = open_game({**game, "walkthrough": None})
    try:
        state = reset_game(env)
        if state["won"]:
            return False
        for command in plan:
            if command not in state["admissible_commands"]:
                return False
            state, _, _ = env.step(command)
        return bool(state["won"])
    finally:
        close_game(env)


def open_game(game: str | Path | dict, walkthrough: bool = False):
    """ALFWorld's text environment of one game (a game.tw-pddl path or its JSON), as AlfredTWEnv
    builds it: textworld's PddlEnv with alfworld's AlfredDemangler (ALFRED ids -> "mug 1") and
    AlfredInfos; reset() it (through reset_game). An engine a finished game gave back (close_game)
    is used again: each one holds its own copy of the planner's library, which cannot be unloaded
    safely (dlclose makes the process crash at exit), so there are only as many as games were open
    at once."""
    with _LOCK:
        env = _IDLE[walkthrough].pop() if _IDLE[walkthrough] else None
    if env is None:
        textworld, PddlEnv, AlfredDemangler, AlfredInfos = engine()
        infos = textworld.EnvInfos(won=True, admissible_commands=True,
                                   extras=["gamefile"] + (["walkthrough"] if walkthrough else []))
        env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        env.minskill_walkthrough = walkthrough
    with keeping_argv():
        env.load(str(game) if isinstance(game, (str, Path)) else game)
    return env


def reset_game(env):
    """env.reset(), sys.argv kept (the engine translates the PDDL problem again at each reset)."""
    with keeping_argv():
        return env.reset()


def close_game(env) -> None:
    """Give a finished game's engine back, for the next game (open_game)."""
    with _LOCK:
        _IDLE[env.minskill_walkthrough].append(env)


_LOCK = threading.Lock()
# finished games' engines, by: do they plan at reset
_IDLE: dict[bool, list] = {False: [], True: []}


@contextmanager
def keeping_argv():
    """The engine's PDDL translator (fast_downward.pddl2sas) sets sys.argv for its option parser:
    put it back, so that a script's own arguments (a run's recorded command) stay as they were."""
    saved = sys.argv
    try:
        yield
    finally:
        sys.argv = saved


def engine():
    """(textworld, PddlEnv, AlfredDemangler, AlfredInfos), or EngineMissing naming the pip line."""
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv
        import fast_downward  # noqa: F401 - textworld's [pddl] extra: PddlEnv needs it
    except ImportError as e:
        raise EngineMissing(f"the alfworld suite needs ALFWorld's text engine, which is not "
                            f"installed ({e}); install it with:\n    {INSTALL_COMMAND}") from None
    return textworld, PddlEnv, AlfredDemangler, AlfredInfos


def read_game(path: Path) -> dict:
    """A game.tw-pddl file's JSON, or GameError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise GameError(f"{path}: not a readable ALFWorld game file "
                        f"({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str)
                                             for k in ("pddl_domain", "grammar", "pddl_problem")):
        raise GameError(f"{path}: not an ALFWorld game file (needs the strings pddl_domain, "
                        f"grammar, pddl_problem)")
    return data


# ------------------------------------------------------------------------------------- draw a game

def draw_game(rng, task_type: str, plan: str, rules, layouts: Path) -> dict | None:
    """One game of `task_type` in floor plan `plan`: {"digest", "folder", "game", "traj_data",
    "planning_problem"}; None when the room has nothing this task type can use."""
    scene = read_layout(layouts, plan)
    receptacles = place_receptacles(rng, scene, rules)
    goal = draw_goal(rng, task_type, scene, receptacles, rules)
    if goal is None:
        return None
    objects = place_objects(rng, task_type, goal, scene, receptacles, rules)
    if objects is None:
        return None
    start = start_location(rng, scene, receptacles)
    problem = problem_pddl(task_type, goal, receptacles, objects, start, rules)
    # the planner plans in the room without the objects the goal does not name (it is far slower
    # with them; the names are the same: each type's instances are numbered among themselves)
    needed = [o for o in objects if o["type"] in (goal["object"], goal["toggle"])]
    planning = problem_pddl(task_type, goal, receptacles, needed, start, rules)
    words = rng.choice(rules.goal_library.gdict[task_type]["templates"]).format(
        obj=goal["object"].lower(), recep=goal["receptacle"].lower(), toggle=goal["toggle"].lower())
    domain, grammar = logic_files()
    game = {"pddl_domain": domain, "grammar": grammar.replace("UNKNOWN GOAL", words),
            "pddl_problem": problem, "solvable": None, "walkthrough": None}
    number = plan.replace("FloorPlan", "")
    parent = goal["toggle"] if task_type == "look_at_obj_in_light" else goal["receptacle"]
    traj_data = {"task_type": task_type, "scene": {"floor_plan": plan, "scene_num": int(number)},
                 "pddl_params": {"object_target": goal["object"],
                                 "parent_target": goal["receptacle"],
                                 "toggle_target": goal["toggle"],
                                 "mrecep_target": "", "object_sliced": False},
                 "goal": words, "source": "minskill.tasks.alfworld_games " + GAMES_VERSION}
    digest = hashlib.sha256((problem + "\n" + words).encode("utf-8")).hexdigest()[:16]
    return {"digest": digest, "folder": f"{task_type}-{goal['object']}-None-{parent}-{number}",
            "game": game, "traj_data": traj_data, "planning_problem": planning}


def draw_goal(rng, task_type: str, scene: dict, receptacles: list[dict], rules) -> dict | None:
    """(object, receptacle, lamp) types of a goal this room allows, or None."""
    holds = rules.VAL_RECEPTACLE_OBJECTS
    here = sorted({r["type"] for r in receptacles})
    movable = movable_types(scene, rules)
    if task_type == "look_at_obj_in_light":
        hosted = any(h in here for h in LAMP_HOSTS)
        lamps = [t for t in LAMPS if t in scene["objects"]] if hosted else []
        if not lamps or not movable:
            return None
        return {"object": rng.choice(movable), "receptacle": "", "toggle": rng.choice(lamps)}
    appliance = APPLIANCE.get(task_type)
    if appliance and appliance not in here:
        return None
    wanted = rules.VAL_ACTION_OBJECTS.get(ACTION_PROPERTY.get(task_type))   # (None: any object)
    pairs = [(o, r) for o in movable if wanted is None or o in wanted
             for r in here if r != appliance and o in holds.get(r, ())
             and any(o in holds.get(s, ()) for s in here if s != r)]   # it can start somewhere else
    if not pairs:
        return None
    obj, recep = rng.choice(pairs)
    return {"object": obj, "receptacle": recep, "toggle": ""}


def place_receptacles(rng, scene: dict, rules) -> list[dict]:
    """The room's receptacles: {"id", "type", "location"}; those the layout places first, then one
    of each other receptacle type of the room (four stove burners) at a point of its grid."""
    static = set(rules.RECEPTACLES) - set(rules.MOVABLE_RECEPTACLES)
    out, ids = [], set()
    for key, pose in sorted(scene["openable"].items()):
        kind = key.split("|")[0]
        rtype = BASINS.get(kind, kind)
        if rtype in static:
            rid = key + (f"|{rtype}" if kind in BASINS else "")
            out.append({"id": rid, "type": rtype, "location": location(*pose)})
            ids.add(rid)
    placed = {r["type"] for r in out}
    for rtype in sorted(static & set(scene["objects"]) - placed):
        for _ in range(4 if rtype == "StoveBurner" else 1):
            x, z = scene["grid"][rng.randrange(len(scene["grid"]))]
            base = next((k for k, v in BASINS.items() if v == rtype), rtype)
            rid = f"{base}|{x:+06.2f}|{rng.uniform(0.0, 1.5):+06.2f}|{z:+06.2f}"
            rid += f"|{rtype}" if base != rtype else ""
            if rid not in ids:
                pose = location(x, z, 90 * rng.randrange(4), 30)
                out.append({"id": rid, "type": rtype, "location": pose})
                ids.add(rid)
    return out


def place_objects(rng, task_type: str, goal: dict, scene: dict, receptacles: list[dict],
                  rules) -> list[dict] | None:
    """The room's movable objects and its lamps: {"id", "type", "in"} (the receptacle's id); the
    goal's object never starts in a receptacle of the goal's type. None when it finds no place."""
    holds = rules.VAL_RECEPTACLE_OBJECTS
    objects, ids = [], set()

    def put(otype: str, places: list[dict]) -> bool:
        if not places:
            return False
        where = rng.choice(places)
        while True:
            x, y, z = rng.uniform(-3, 3), rng.uniform(0, 2), rng.uniform(-3, 3)
            oid = f"{otype}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}"
            if oid not in ids:
                break
        ids.add(oid)
        objects.append({"id": oid, "type": otype, "in": where["id"]})
        return True

    for otype in movable_types(scene, rules) if goal["object"] else ():
        is_goal = otype == goal["object"]
        places = [r for r in receptacles if otype in holds.get(r["type"], ())
                  and not (is_goal and r["type"] == goal["receptacle"])]
        if is_goal:
            low = 2 if task_type == "pick_two_obj_and_place" else 1
            count = rng.randint(low, 3)
        else:
            count = rng.randint(1, 2)
        for _ in range(count):
            if not put(otype, places) and is_goal:
                return None
    for lamp in (t for t in LAMPS if t in scene["objects"]):
        hosts = [r for r in receptacles if r["type"] in LAMP_HOSTS]
        if not put(lamp, hosts) and lamp == goal["toggle"]:
            return None
    return objects


def start_location(rng, scene: dict, receptacles: list[dict]) -> str:
    """Where the agent starts: a grid point at no receptacle ("You are in the middle of a room")."""
    taken = {r["location"] for r in receptacles}
    for _ in range(100):
        x, z = scene["grid"][rng.randrange(len(scene["grid"]))]
        here = location(x, z, 90 * rng.randrange(4), 30)
        if here not in taken:
            return here
    return location(0.0, 0.0, 0, 30) + "|start"


def location(x: float, z: float, rotation: float, horizon: float) -> str:
    """ALFRED's name of a pose: grid steps, quarter turns, the camera's horizon."""
    return f"loc|{round(x / GRID)}|{round(z / GRID)}|{round(rotation / 90) % 4}|{round(horizon)}"


def movable_types(scene: dict, rules) -> list[str]:
    """The room's object types that some receptacle may hold (ALFRED's pickup objects), sorted."""
    held = set().union(*rules.VAL_RECEPTACLE_OBJECTS.values())
    return sorted(t for t in scene["objects"]
                  if t in held and t in rules.OBJECTS and "Sliced" not in t)


# -------------------------------------------------------------------------------------------- PDDL

def problem_pddl(task_type: str, goal: dict, receptacles: list[dict], objects: list[dict],
                 start: str, rules) -> str:
    """The PDDL problem of a drawn game, with ALFRED's escaped names and goal_library's goal."""
    action = rules.VAL_ACTION_OBJECTS
    holds = rules.VAL_RECEPTACLE_OBJECTS
    rtypes = sorted({r["type"] for r in receptacles} | ({goal["receptacle"]} - {""}))
    otypes = sorted({o["type"] for o in objects} | {goal["object"]} | ({goal["toggle"]} - {""}))
    where = {r["id"]: r["location"] for r in receptacles}
    locations = sorted(set(where.values()) | {start})
    # ("#": escape() makes it "-"); a type that is both an object's and a receptacle's is declared
    # once
    declared = (["agent1 # agent"] + [f"{t}Type # otype" for t in otypes]
                + [f"{t}Type # rtype" for t in rtypes if t not in otypes]
                + [f"{o['id']} # object" for o in objects]
                + [f"{r['id']} # receptacle" for r in receptacles]
                + [f"{loc} # location" for loc in locations])
    facts = [f"(atLocation agent1 {start})"]
    for r in receptacles:
        facts += [f"(receptacleType {r['id']} {r['type']}Type)",
                  f"(receptacleAtLocation {r['id']} {r['location']})"]
        facts += [f"(openable {r['id']})"] if r["type"] in rules.OPENABLE_CLASS_SET else []
    for o in objects:
        facts += [f"(objectType {o['id']} {o['type']}Type)", f"(inReceptacle {o['id']} {o['in']})",
                  f"(objectAtLocation {o['id']} {where[o['in']]})"]
        if o["type"] in LAMPS:
            facts.append(f"(toggleable {o['id']})")
            continue
        facts.append(f"(pickupable {o['id']})")
        facts += [f"({p.lower()} {o['id']})" for p in ("Cleanable", "Heatable", "Coolable",
                                                       "Sliceable") if o["type"] in action[p]]
        if o["type"] in rules.MOVABLE_RECEPTACLES_SET:
            facts.append(f"(isReceptacleObject {o['id']})")
    facts += [f"(canContain {r}Type {o}Type)" for r in rtypes if r not in otypes for o in otypes
              if o in holds.get(r, ())]
    goal_pddl = rules.goal_library.gdict[task_type]["pddl"].format(
        obj=goal["object"], recep=goal["receptacle"], toggle=goal["toggle"]).replace("#", "-")
    text = ("(define (problem plan_minskill)\n    (:domain alfred)\n    (:objects\n        "
            + "\n        ".join(escape(d) for d in declared) + "\n    )\n    (:init\n        "
            + "\n        ".join(escape(f) for f in facts) + "\n    )\n")
    return text + goal_pddl   # (goal_library's goal closes the "(define" too)


def escape(text: str) -> str:
    """ALFRED's PDDL spelling of its ids (PlannedGameState.fix_pddl_str_chars)."""
    for old, new in (("-", "_minus_"), ("#", "-"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"),
                     (",", "_comma_")):
        text = text.replace(old, new)
    return text


# ------------------------------------------------------------------------------- the wheel's files

class _Rules:
    """alfworld.gen.constants with its goal library (from the wheel, where ALFRED's rules live)."""

    def __init__(self, constants, goal_library):
        self.__dict__.update({k: getattr(constants, k) for k in dir(constants) if k.isupper()})
        self.goal_library = goal_library


def alfred_rules() -> _Rules:
    """ALFRED's rules as the alfworld wheel ships them; EngineMissing when it is not installed."""
    engine()
    import alfworld.gen.constants as constants
    import alfworld.gen.goal_library as goal_library
    return _Rules(constants, goal_library)


def wheel_dir() -> Path:
    engine()
    import alfworld
    return Path(alfworld.__file__).parent


def layouts_dir() -> Path:
    return wheel_dir() / "gen" / "layouts"


def logic_files() -> tuple[str, str]:
    """The wheel's PDDL domain and text grammar (alfworld/data/alfred.pddl, alfred.twl2)."""
    data = wheel_dir() / "data"
    try:
        return ((data / "alfred.pddl").read_text(encoding="utf-8"),
                (data / "alfred.twl2").read_text(encoding="utf-8"))
    except OSError as e:
        raise GameError(f"the alfworld wheel lacks its logic files ({e}); reinstall it: "
                        f"{INSTALL_COMMAND}") from None


def floor_plans(layouts: Path) -> list[str]:
    """The floor plans whose three layout files are all there, sorted by number."""
    names = {p.name.split("-")[0] for p in layouts.glob("FloorPlan*-objects.json")}
    complete = [n for n in names if all((layouts / f"{n}-{part}").is_file()
                                        for part in ("openable.json", "layout.npy"))]
    if not complete:
        raise GameError(f"{layouts}: no ALFRED floor-plan layouts (FloorPlanN-objects.json, "
                        f"-openable.json, -layout.npy); reinstall the wheel: {INSTALL_COMMAND}")
    return sorted(complete, key=lambda n: int(n.replace("FloorPlan", "")))


def room_type(plan: str) -> str:
    """ALFRED's room type of a floor plan by its number (constants.SCENE_TYPE: 1-30 kitchens,
    ...)."""
    rooms = {0: "Kitchen", 2: "LivingRoom", 3: "Bedroom", 4: "Bathroom"}
    return rooms.get(int(plan.replace("FloorPlan", "")) // 100, "Kitchen")


def read_layout(layouts: Path, plan: str) -> dict:
    """A floor plan's object types, its receptacles' poses (x, z, rotation, horizon), its grid."""
    import numpy as np
    try:
        objects = json.loads((layouts / f"{plan}-objects.json").read_text(encoding="utf-8"))
        openable = json.loads((layouts / f"{plan}-openable.json").read_text(encoding="utf-8"))
        grid = [(float(x), float(z)) for x, z in np.load(layouts / f"{plan}-layout.npy")[:, :2]]
    except (OSError, ValueError, IndexError, TypeError) as e:
        raise GameError(f"{layouts / plan}: unreadable layout ({type(e).__name__}: {e})") from None
    if not isinstance(objects, list) or not isinstance(openable, dict) or not grid:
        raise GameError(f"{layouts / plan}: a layout needs a list of objects, a map of "
                        f"receptacles and a grid")
    return {"objects": sorted(set(objects)), "openable": openable, "grid": grid}
