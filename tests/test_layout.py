"""The package's layout, as its imports draw it: no circle between files, no arrow back up, few floors, and the
modules that must copy alone import nothing else from minskill.

LAYERS lists minskill's parts from the bottom up; a module may import from a layer below its own, or sideways
within its layer, except that the two papers (skill_r1/, masa/) import nothing from each other. A floor is a
module's height in the graph (1: it imports nothing from minskill). The graph is read with ast from every
`import` and `from ... import` in minskill/, those inside functions included."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minskill"

# bottom to top; a layer is a list of parts (a module or a subpackage, named without "minskill.")
LAYERS = [
    ["files", "skills", "skillsets", "paired", "gates", "tasks", "replies", "plot",   # shared by both papers
     "distributed", "device",            # data-parallel ranks (torchrun); where the models run
     "trajectories"],                    # one rollout's record
    ["nn"],                              # the model: weights, tokenizer, sampling, LoRA, int8, shared prefix
    ["serve", "cli", "web"],             # the task model behind HTTP, its client, the flags; the web tools
    ["runs", "retrieval", "rollout",     # run folders, skill retrieval, rollouts and their rewards,
     "agent_loop",                       # the multi-turn rollouts
     "sft"],                             # supervised fine-tuning on chats (both papers' trainers)
    ["skill_r1", "masa"],                # the two papers
    ["measure"],                         # what measures the papers and the model: tables, benchmarks
    ["report"],                          # the HTML report of any run folder
]
APART = {"skill_r1", "masa"}            # same layer, but neither imports the other
MAX_FLOORS = 10
# each copies into another project alone: it imports nothing from minskill outside itself
ALONE = ["minskill/skill_r1/grpo.py", "minskill/masa/ucb.py", "minskill/serve/client.py", "minskill/skills.py",
         "minskill/nn/tokenizer.py", "minskill/nn/model.py", "minskill/files.py", "minskill/tasks"]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name: str) -> set[str]:
    """The minskill modules that module `name` imports (a package's __init__ when that is what it names)."""
    path, out = MODULES[name], set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in out if m in MODULES and m not in (name, "minskill")}


GRAPH = {name: imported(name) for name in MODULES}


def part(name: str) -> str:
    return name.split(".")[1]


def layer(name: str) -> int:
    found = [i for i, parts in enumerate(LAYERS) if part(name) in parts]
    assert found, f"{name}: in no layer of tests/test_layout.py's LAYERS; place it there"
    return found[0]


def test_every_module_has_a_layer():
    for name in MODULES:
        if name != "minskill":
            layer(name)


def test_no_import_cycle():
    state: dict[str, str] = {}

    def visit(name, path):
        state[name] = "open"
        for target in sorted(GRAPH[name]):
            assert state.get(target) != "open", "import cycle: " + " -> ".join(path + [target])
            if target not in state:
                visit(target, path + [target])
        state[name] = "done"

    for name in sorted(MODULES):
        if name not in state:
            visit(name, [name])


def test_no_import_goes_up_a_layer():
    upward = [f"{source} -> {target}" for source, targets in GRAPH.items() for target in targets
              if source != "minskill" and (layer(target) > layer(source) or (
                  layer(target) == layer(source) and part(target) != part(source) and
                  {part(source), part(target)} <= APART))]
    assert upward == []


def test_no_two_parts_import_each_other():
    """Sideways within a layer is allowed, but only one way: two parts that import each other (cli.py
    and serve/, once: cli imported serve/client.py while serve/server.py imported cli) draw an arrow
    back up, whichever way the drawing puts them."""
    arrows = {(part(s), part(t)) for s, targets in GRAPH.items() for t in targets
              if s != "minskill" and part(s) != part(t)}
    both_ways = sorted(f"{a} <-> {b}" for a, b in arrows if (b, a) in arrows and a < b)
    assert both_ways == []


def test_the_graph_has_at_most_ten_floors():
    floors: dict[str, int] = {}

    def floor(name):
        if name not in floors:
            floors[name] = 1 + max((floor(t) for t in GRAPH[name]), default=0)
        return floors[name]

    highest = max(MODULES, key=floor)
    assert floors[highest] <= MAX_FLOORS, f"{highest} is on floor {floors[highest]}"


@pytest.mark.parametrize("alone", ALONE)
def test_the_modules_that_copy_alone_import_nothing_else_from_minskill(alone):
    prefix = module_name(ROOT / alone / "__init__.py") if (ROOT / alone).is_dir() else module_name(ROOT / alone)
    mine = [m for m in MODULES if m == prefix or m.startswith(prefix + ".")]
    outside = {m: sorted(t for t in GRAPH[m] if not (t == prefix or t.startswith(prefix + "."))) for m in mine}
    assert mine and {m: t for m, t in outside.items() if t} == {}
