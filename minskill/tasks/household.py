"""`household`: a small ALFWorld-like text environment.

A house has rooms; rooms hold receptacles (a fridge, cabinets and drawers that open and close,
tables, a sink basin, a microwave, ...); receptacles hold objects. The agent is at one receptacle at
a time (or in the middle of the house at the start), holds at most one object, and acts with
ALFWorld's verbs:

    go to R | open R | close R | take O from R | put O in/on R | heat O with R | cool O with R |
    clean O with R | use O | examine X | inventory | look

The six ALFWorld task types and their success conditions (checked after every step):

    pick_and_place          an O is in/on a receptacle of type R
    look_at_obj_in_light    the agent holds an O and turns on a desklamp at the lamp's receptacle
    pick_clean_then_place   a clean O is in/on an R         (clean O with sinkbasin)
    pick_heat_then_place    a hot O is in/on an R           (heat O with microwave)
    pick_cool_then_place    a cool O is in/on an R          (cool O with fridge)
    pick_two_obj            two Os are in/on Rs

The types keep the names of the first release (task ids and base-skill folders are made from them);
TYPE_NAMES lists ALFWorld's own names of them (pick_two_obj_and_place,
pick_clean_then_place_in_recep, ...) and MASA's library keys (clean, heat, cool, examine), read as
these types wherever skills are looked up.

An action that cannot be carried out (unknown verb or name, not here, closed, hands full, ...)
returns exactly "Nothing happens." and is counted in `env.nothing_happens`; look, inventory and
examine only report. Tasks are generated from a seed; their split is decided by the goal (type,
object, receptacle), so held-out goals never appear in training. `oracle_actions(task)` plans a
solution from the state.
"""
from __future__ import annotations

import copy
import re

from .base import (NOTHING_HAPPENS, Environment, Task, check_split, counts_per_type, interleave,
                   rng_for,
                   split_of, task_id)

TASK_TYPES = ("pick_and_place", "look_at_obj_in_light", "pick_clean_then_place",
              "pick_heat_then_place",
              "pick_cool_then_place", "pick_two_obj")
# Other names of the six types: ALFWorld's own (its game folders) and the keys of MASA's ALFWorld
# skill libraries. A library keyed by one of them is read as keyed by this suite's type
# (tasks.skill_key_type).
TYPE_NAMES = {
    "pick_and_place": ("pick_and_place_simple",),
    "look_at_obj_in_light": ("examine",),
    "pick_clean_then_place": ("pick_clean_then_place_in_recep", "clean"),
    "pick_heat_then_place": ("pick_heat_then_place_in_recep", "heat"),
    "pick_cool_then_place": ("pick_cool_then_place_in_recep", "cool"),
    "pick_two_obj": ("pick_two_obj_and_place",),
}
DEFAULT_PER_TYPE = 10
MAX_STEPS = 30
ACTION_SYNTAX = ("go to X", "open X", "close X", "take X from Y", "put X in/on Y", "heat X with Y",
                 "cool X with Y", "clean X with Y", "use X", "examine X", "inventory", "look")

# receptacle type -> (openable, preposition)
RECEPTACLES = {
    "fridge": (True, "in"), "microwave": (True, "in"), "cabinet": (True, "in"),
    "drawer": (True, "in"),
    "safe": (True, "in"), "countertop": (False, "on"), "diningtable": (False, "on"),
    "sinkbasin": (False, "in"), "stoveburner": (False, "on"), "garbagecan": (False, "in"),
    "shelf": (False, "on"), "sidetable": (False, "on"), "desk": (False, "on"),
    "sofa": (False, "on"),
    "bed": (False, "on"), "dresser": (False, "on"), "coffeetable": (False, "on"),
    "armchair": (False, "on"),
}
ROOMS = {  # room -> receptacle types (with counts)
    "kitchen": {"fridge": 1, "microwave": 1, "sinkbasin": 1, "countertop": 2, "cabinet": 3,
                "drawer": 2,
                "stoveburner": 1, "garbagecan": 1, "diningtable": 1},
    "living room": {"sofa": 1, "coffeetable": 1, "shelf": 2, "armchair": 1, "sidetable": 1},
    "bedroom": {"bed": 1, "desk": 1, "dresser": 1, "drawer": 2, "safe": 1, "shelf": 1},
}
FOOD = ("apple", "potato", "egg", "tomato", "bread", "lettuce")
DISHES = ("mug", "cup", "plate", "bowl")
SMALL = ("book", "pen", "pencil", "keychain", "cellphone", "creditcard", "cd", "alarmclock",
         "remotecontrol", "pillow")
# which object types each task type uses, and where such an object may be put for it
TASK_OBJECTS = {
    "pick_and_place": FOOD + DISHES + SMALL,
    "look_at_obj_in_light": FOOD + DISHES + SMALL,
    "pick_clean_then_place": FOOD + DISHES,
    "pick_heat_then_place": ("apple", "potato", "egg", "tomato", "bread", "mug", "cup", "plate"),
    "pick_cool_then_place": FOOD + DISHES,
    "pick_two_obj": ("book", "pen", "pencil", "keychain", "cellphone", "creditcard", "cd", "pillow",
                     "apple", "egg", "mug", "plate"),
}
TARGETS = {"kitchen_goods": ("countertop", "diningtable", "cabinet", "fridge", "drawer", "shelf"),
           "small_goods": ("sofa", "bed", "desk", "dresser", "shelf", "drawer", "sidetable",
                           "coffeetable",
                           "safe", "armchair")}
# where objects of a kind are found at the start
HOMES = {"food": ("fridge", "countertop", "diningtable", "cabinet", "garbagecan", "stoveburner"),
         "dishes": ("cabinet", "countertop", "diningtable", "sinkbasin", "shelf", "drawer"),
         "small": ("drawer", "shelf", "desk", "sidetable", "sofa", "bed", "dresser", "coffeetable",
                   "safe",
                   "armchair")}
LAMP_PLACES = ("desk", "sidetable")
APPLIANCE = {"pick_clean_then_place": ("clean", "sinkbasin"),
             "pick_heat_then_place": ("heat", "microwave"),
             "pick_cool_then_place": ("cool", "fridge")}


def _kind(object_type: str) -> str:
    return "food" if object_type in FOOD else "dishes" if object_type in DISHES else "small"


def _targets_for(object_type: str) -> tuple[str, ...]:
    return TARGETS["small_goods"] if _kind(object_type) == "small" else TARGETS["kitchen_goods"]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _listing(names: list[str]) -> str:
    if not names:
        return "nothing"
    items = [f"{_article(n)} {n}" for n in names]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


def goal_text(goal: dict) -> str:
    o, r, t = goal["object"], goal["target"], goal["type"]
    prep = RECEPTACLES[r][1]
    return {"pick_and_place": f"put some {o} {prep} {r}.",
            "look_at_obj_in_light": f"look at {o} under the desklamp.",
            "pick_clean_then_place": f"clean some {o} and put it {prep} {r}.",
            "pick_heat_then_place": f"heat some {o} and put it {prep} {r}.",
            "pick_cool_then_place": f"cool some {o} and put it {prep} {r}.",
            "pick_two_obj": f"find two {o} and put them {prep} {r}."}[t]


# --------------------------------------------------------------------------- environment

class HouseholdEnv(Environment):
    """The world of one task; `spec` is the task's env_spec (copied, never modified)."""
    action_syntax = ACTION_SYNTAX

    def __init__(self, spec: dict, max_steps: int = MAX_STEPS):
        super().__init__(max_steps)
        self.spec = spec
        self.goal = spec["goal"]

    # ---- state
    def _reset(self) -> str:
        self.receptacles = copy.deepcopy(self.spec["receptacles"])
        self.objects = copy.deepcopy(self.spec["objects"])
        self.location: str | None = None
        self.holding: str | None = None
        rooms = "; ".join(f"in the {room}: {_listing(names)}"
                          for room, names in self.spec["rooms"].items())
        return (f"You are in the middle of a house. Looking quickly around you, you see {rooms}.\n"
                f"Your task is to: {goal_text(self.goal)}")

    def _contents(self, receptacle: str) -> list[str]:
        return [name for name, obj in self.objects.items() if obj["location"] == receptacle]

    def _accessible(self, receptacle: str) -> bool:
        r = self.receptacles[receptacle]
        return not r["openable"] or r["open"]

    def _describe(self, receptacle: str) -> str:
        r, listing = self.receptacles[receptacle], _listing(self._contents(receptacle))
        if r["openable"]:
            if not r["open"]:
                return f"The {receptacle} is closed."
            return f"The {receptacle} is open. In it, you see {listing}."
        return f"{r['prep'].capitalize()} the {receptacle}, you see {listing}."

    def _reachable_objects(self) -> list[str]:
        at = self.location
        here = self._contents(at) if at and self._accessible(at) else []
        return here + ([self.holding] if self.holding else [])

    def _check_success(self) -> None:
        g = self.goal
        if g["type"] == "look_at_obj_in_light":
            return  # decided when the lamp is used
        placed = [o for o in self.objects.values()
                  if o["type"] == g["object"] and o["location"]
                  and self.receptacles[o["location"]]["type"] == g["target"]]
        need = {"pick_clean_then_place": "clean", "pick_heat_then_place": "hot",
                "pick_cool_then_place": "cool"}.get(g["type"])
        if need:
            placed = [o for o in placed if o[need]]
        if len(placed) >= (2 if g["type"] == "pick_two_obj" else 1):
            self.success = self.done = True

    # ---- actions: each verb's pattern and the method that carries it out (or answers
    # NOTHING_HAPPENS)
    VERBS = [(re.compile(r"go to (?:the )?(.+)"), "_go"),
             (re.compile(r"(open|close) (?:the )?(.+)"), "_open_close"),
             (re.compile(r"take (.+?) from (.+)"), "_take"),
             (re.compile(r"put (.+?) (?:in/on|in|on|into|onto) (.+)"), "_put"),
             (re.compile(r"(heat|cool|clean) (.+?) with (.+)"), "_treat"),
             (re.compile(r"use (.+)"), "_use"),
             (re.compile(r"examine (?:the )?(.+)"), "_examine")]

    def _step(self, action: str) -> str:
        if action == "look":
            if self.location is None:
                return "You are in the middle of the house. " + self._reset_rooms()
            return f"You are at the {self.location}. {self._describe(self.location)}"
        if action in ("inventory", "inv", "i"):
            return f"You are carrying: {_article(self.holding)} {self.holding}." if self.holding \
                else "You are not carrying anything."
        for pattern, method in self.VERBS:
            m = pattern.fullmatch(action)
            if m:
                return getattr(self, method)(*m.groups())
        return NOTHING_HAPPENS

    def _go(self, target: str) -> str:
        if target not in self.receptacles or target == self.location:
            return NOTHING_HAPPENS
        self.location = target
        return f"You arrive at {target}. {self._describe(target)}"

    def _open_close(self, verb: str, target: str) -> str:
        r = self.receptacles.get(target)
        if target != self.location or not r or not r["openable"] or r["open"] == (verb == "open"):
            return NOTHING_HAPPENS
        r["open"] = verb == "open"
        if verb == "open":
            return f"You open the {target}. {self._describe(target)}"
        return f"You close the {target}."

    def _take(self, obj: str, source: str) -> str:
        if (self.holding or source != self.location or not self._accessible(source)
                or self.objects.get(obj, {}).get("location") != source
                or self.objects[obj]["type"] == "desklamp"):  # lamps stay where they are
            return NOTHING_HAPPENS
        self.objects[obj]["location"] = None
        self.holding = obj
        return f"You pick up the {obj} from the {source}."

    def _put(self, obj: str, dest: str) -> str:
        if obj != self.holding or dest != self.location or not self._accessible(dest):
            return NOTHING_HAPPENS
        self.objects[obj]["location"] = dest
        self.holding = None
        self._check_success()
        return f"You put the {obj} {self.receptacles[dest]['prep']} the {dest}."

    def _treat(self, verb: str, obj: str, tool: str) -> str:
        needed = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}[verb]
        if obj != self.holding or tool != self.location or self.receptacles[tool]["type"] != needed:
            return NOTHING_HAPPENS
        state = self.objects[obj]
        if verb == "heat":
            state["hot"], state["cool"] = True, False
        elif verb == "cool":
            state["cool"], state["hot"] = True, False
        else:
            state["clean"] = True
        return f"You {verb} the {obj} using the {tool}."

    def _use(self, name: str) -> str:
        lamp = self.objects.get(name)
        if not lamp or lamp["type"] != "desklamp" or lamp["location"] != self.location:
            return NOTHING_HAPPENS
        lamp["on"] = not lamp["on"]
        if not lamp["on"]:
            return f"You turn off the {name}."
        g = self.goal
        if g[
            "type"] == "look_at_obj_in_light" and self.holding and self.objects[
                self.holding]["type"] == g["object"]:
            self.success = self.done = True
        return f"You turn on the {name}."

    def _examine(self, target: str) -> str:
        if target == self.location:
            return self._describe(target)
        if target not in self._reachable_objects():
            return NOTHING_HAPPENS
        obj = self.objects[target]
        states = [s for s in ("clean", "hot", "cool") if obj.get(s)]
        if obj["type"] == "desklamp":
            return f"This is a desklamp. It is {'on' if obj['on'] else 'off'}."
        if states:
            return f"This is a {' and '.join(states)} {target}."
        return f"There's nothing special about {target}."

    def _reset_rooms(self) -> str:
        return "; ".join(f"In the {room}: {_listing(names)}."
                         for room, names in self.spec["rooms"].items())

    def admissible_actions(self) -> list[str]:
        """Every action that would not return "Nothing happens." now (look/inventory included)."""
        actions = ["look", "inventory"]
        actions += [f"go to {r}" for r in self.receptacles if r != self.location]
        here = self.location
        if here:
            r = self.receptacles[here]
            actions.append(f"examine {here}")
            if r["openable"]:
                actions.append(f"{'close' if r['open'] else 'open'} {here}")
            if self._accessible(here):
                if self.holding is None:
                    actions += [f"take {o} from {here}" for o in self._contents(here)
                                if self.objects[o]["type"] != "desklamp"]
                else:
                    actions.append(f"put {self.holding} {r['prep']} {here}")
            if self.holding:
                verb = {"microwave": "heat", "fridge": "cool", "sinkbasin": "clean"}.get(r["type"])
                if verb:
                    actions.append(f"{verb} {self.holding} with {here}")
            actions += [f"use {o}" for o, s in self.objects.items()
                        if s["type"] == "desklamp" and s["location"] == here]
        if self.holding:
            actions.append(f"examine {self.holding}")
        return actions


# --------------------------------------------------------------------------- generation

def _goal_pool(split: str) -> dict[str, list[tuple[str, str]]]:
    """(object, target) goals per task type that belong to `split`."""
    pool = {}
    for t in TASK_TYPES:
        goals = []
        for o in TASK_OBJECTS[t]:
            # a look task's goal is its object; where the desklamp stands is drawn with the world
            for r in (("",) if t == "look_at_obj_in_light" else _targets_for(o)):
                if split_of(f"household|{t}|{o}|{r}") == split:
                    goals.append((o, r))
        pool[t] = goals
    return pool


def _make_world(rng, task_type: str, obj_type: str, target: str) -> dict:
    rooms = ["kitchen", rng.choice(["living room", "bedroom"])]
    if _kind(obj_type) == "small" or task_type == "look_at_obj_in_light":
        rooms = [rng.choice(["kitchen", "living room"]), "bedroom"]
    rooms = list(dict.fromkeys(rooms))
    needed = {target} if target else set()
    needed |= {APPLIANCE[task_type][1]} if task_type in APPLIANCE else set()
    layout, receptacles = {}, {}
    counters: dict[str, int] = {}
    for room in rooms:
        names = []
        for rtype, count in ROOMS[room].items():
            for _ in range(count):
                counters[rtype] = counters.get(rtype, 0) + 1
                name = f"{rtype} {counters[rtype]}"
                openable, prep = RECEPTACLES[rtype]
                receptacles[name] = {"type": rtype, "openable": openable, "open": False,
                                     "prep": prep,
                                     "room": room}
                names.append(name)
        layout[room] = names
    missing = needed - {r["type"] for r in receptacles.values()}
    if missing:  # the goal needs a receptacle the chosen rooms lack: add it to the first room
        for rtype in sorted(missing):
            name = f"{rtype} {counters.get(rtype, 0) + 1}"
            openable, prep = RECEPTACLES[rtype]
            receptacles[name] = {"type": rtype, "openable": openable, "open": False, "prep": prep,
                                 "room": rooms[0]}
            layout[rooms[0]].append(name)

    def spots(kind: str) -> list[str]:
        # objects start anywhere that suits their kind, but never where the goal wants them
        return [n for n, r in receptacles.items()
                if r["type"] in HOMES[kind] and r["type"] != target] or \
               [n for n, r in receptacles.items() if r["type"] != target]

    objects: dict[str, dict] = {}
    counts: dict[str, int] = {}

    def add(otype: str, where: str | None = None, **state) -> str:
        counts[otype] = counts.get(otype, 0) + 1
        name = f"{otype} {counts[otype]}"
        objects[name] = {"type": otype, "location": where or rng.choice(spots(_kind(otype))),
                         "clean": False, "hot": False, "cool": False, **state}
        return name

    for _ in range(2 if task_type == "pick_two_obj" else rng.randint(1, 2)):
        add(obj_type)
    lamp_types = (target,) if task_type == "look_at_obj_in_light" else LAMP_PLACES
    lamp_places = [n for n, r in receptacles.items() if r["type"] in lamp_types]
    if lamp_places:
        add("desklamp", rng.choice(lamp_places), on=False)
    distractors = [t for t in FOOD + DISHES + SMALL if t != obj_type]
    for otype in rng.sample(distractors, rng.randint(4, 7)):
        add(otype)
    return {"kind": "household", "rooms": layout, "receptacles": receptacles, "objects": objects,
            "goal": {"type": task_type, "object": obj_type, "target": target}}


def generate_household(split: str = "train", seed: int = 0, n: int | None = None,
                       types: tuple[str, ...] = TASK_TYPES) -> list[Task]:
    """`n` household tasks (default 10 per type) of one split, types interleaved."""
    check_split(split, allow_all=False)
    per_type = counts_per_type(types, TASK_TYPES, n, DEFAULT_PER_TYPE, "household task types")
    pool = _goal_pool(split)
    by_type = {}
    for t in types:
        count = per_type[t]
        if count > len(pool[t]):
            raise ValueError(f"household/{t}: asked for {count} {split} tasks, the split has "
                             f"{len(pool[t])} distinct goals")
        rng = rng_for("household", split, seed, t)
        goals = rng.sample(pool[t], count)
        tasks = []
        for obj_type, target in goals:
            key = f"household|{t}|{obj_type}|{target}|{seed}"
            if t == "look_at_obj_in_light":
                target = rng.choice(LAMP_PLACES)
            spec = _make_world(rng, t, obj_type, target)
            tasks.append(Task(id=task_id(f"household-{t}", key), type=t,
                              question=goal_text(spec["goal"]),
                              answer=None, verifier="env", multi_turn=True, max_steps=MAX_STEPS,
                              env_spec=spec,
                              metadata={"suite": "household", "split": split, "seed": seed}))
        by_type[t] = tasks
    return interleave(by_type, types)


# --------------------------------------------------------------------------- oracle

def oracle_actions(task: Task) -> list[str]:
    """A shortest-ish plan that solves the task, found by acting in a private copy of the
    environment."""
    env = HouseholdEnv(task.env_spec, max_steps=task.max_steps)
    env.reset()
    plan: list[str] = []

    def do(action: str) -> None:
        observation, _, _ = env.step(action)
        if observation == NOTHING_HAPPENS:
            raise RuntimeError(f"oracle for {task.id}: {action!r} did nothing")
        plan.append(action)

    def go(receptacle: str) -> None:
        if env.location != receptacle:
            do(f"go to {receptacle}")
        if not env._accessible(receptacle):
            do(f"open {receptacle}")

    goal = env.goal
    targets = [n for n, r in env.receptacles.items() if r["type"] == goal["target"]]
    wanted = [n for n, o in env.objects.items() if o["type"] == goal["object"]]
    for obj in wanted[:2 if goal["type"] == "pick_two_obj" else 1]:
        source = env.objects[obj]["location"]
        go(source)
        do(f"take {obj} from {source}")
        if goal["type"] in APPLIANCE:
            verb, tool_type = APPLIANCE[goal["type"]]
            tool = next(n for n, r in env.receptacles.items() if r["type"] == tool_type)
            if env.location != tool:
                do(f"go to {tool}")
            do(f"{verb} {obj} with {tool}")
        if goal["type"] == "look_at_obj_in_light":
            lamp = next(n for n, o in env.objects.items() if o["type"] == "desklamp")
            if env.location != env.objects[lamp]["location"]:
                do(f"go to {env.objects[lamp]['location']}")
            do(f"use {lamp}")
            break
        go(targets[0])
        do(f"put {obj} {env.receptacles[targets[0]]['prep']} {targets[0]}")
    if not env.success:
        raise RuntimeError(f"oracle for {task.id}: plan {plan} did not reach the goal")
    return plan
