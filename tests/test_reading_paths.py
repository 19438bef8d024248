"""The learner's path stays readable as the code grows (issue: "each algorithm readable in one sitting").

PATHS lists, in reading order, the functions and classes a learner follows for one Skill-R1 training step
and for one MASA iteration (tests/reading_path.py counts their lines). The README's "Read the algorithms"
section prints the same lists; this test keeps them true: every entry exists, and each path stays within
its budget of lines and files. It also holds the size rules: no module over 700 lines, no function over 80
lines in the algorithm modules and the three scripts (argument parsers aside)."""
import ast
import re

import pytest

from reading_path import ROOT, path_report

PATHS = {
    "Skill-R1: one training step": [
        "train_grpo.py:main", "train_grpo.py:train", "train_grpo.py:Run", "train_grpo.py:instance_order",
        "minskill/skill_r1/loop.py:step_seed", "minskill/skill_r1/loop.py:EvolveConfig",
        "minskill/skill_r1/loop.py:Instance", "minskill/skill_r1/loop.py:evolve_batch",
        "minskill/skill_r1/loop.py:score_skills", "minskill/skill_r1/loop.py:Outcome",
        "minskill/skill_r1/loop.py:Evolution", "minskill/skill_r1/loop.py:HistoryEntry",
        "minskill/skill_r1/loop.py:editor_messages", "minskill/skill_r1/loop.py:_history_block",
        "minskill/skill_r1/loop.py:_outcome_line", "minskill/nn/sampling.py:generate",
        "minskill/skill_r1/loop.py:Candidate", "minskill/skill_r1/loop.py:_carry",
        "minskill/skill_r1/loop.py:Generation", "minskill/skill_r1/loop.py:assign_advantages",
        "minskill/skill_r1/grpo.py:bilevel_advantages", "minskill/skill_r1/grpo.py:intra_advantages",
        "minskill/skill_r1/grpo.py:_sample_std", "minskill/skill_r1/grpo.py:inter_advantage",
        "train_grpo.py:policy_update", "train_grpo.py:_padded", "minskill/nn/sampling.py:completion_logprobs",
        "minskill/skill_r1/grpo.py:policy_loss", "train_grpo.py:log_step"],
    "MASA: one hill-climbing iteration": [
        "evolve_masa.py:main", "evolve_masa.py:run_search", "minskill/masa/search.py:MasaConfig",
        "minskill/masa/search.py:MasaSearch.__init__", "minskill/masa/search.py:MasaSearch.run",
        "minskill/masa/search.py:MasaSearch.climb_general", "minskill/masa/search.py:HillClimbState",
        "minskill/masa/search.py:hill_climb", "minskill/masa/search.py:MasaSearch.propose_general",
        "minskill/masa/search.py:attribution_messages", "minskill/masa/search.py:general_rewrite_messages",
        "minskill/masa/search.py:MasaSearch.ask", "minskill/masa/search.py:ask_teacher",
        "minskill/masa/search.py:MasaSearch.add_candidate", "minskill/masa/search.py:MasaSearch.as_logged",
        "minskill/masa/search.py:Candidate", "minskill/masa/search.py:MasaSearch.evaluate_candidate",
        "minskill/masa/search.py:MasaSearch.evaluate", "minskill/masa/search.py:rollouts",
        "minskill/masa/search.py:_metrics", "minskill/masa/search.py:failure_records",
        "minskill/masa/search.py:MasaSearch.checkpoint", "minskill/masa/search.py:MasaSearch.to_json",
        "evolve_masa.py:checkpoint", "evolve_masa.py:save_checkpoint"],
    "MASA: one UCB1 iteration": [
        "evolve_masa.py:main", "evolve_masa.py:run_search", "minskill/masa/search.py:MasaConfig",
        "minskill/masa/search.py:MasaSearch.__init__", "minskill/masa/search.py:MasaSearch.run",
        "minskill/masa/search.py:MasaSearch.search_tree", "minskill/masa/search.py:Tree",
        "minskill/masa/search.py:MasaSearch.plant_tree", "minskill/masa/ucb.py:search", "minskill/masa/ucb.py:select",
        "minskill/masa/ucb.py:ucb_score", "minskill/masa/ucb.py:ucb1", "minskill/masa/ucb.py:Node",
        "minskill/masa/search.py:MasaSearch.propose_task_skills", "minskill/masa/search.py:attribution_messages",
        "minskill/masa/search.py:task_rewrite_messages", "minskill/masa/search.py:MasaSearch.ask",
        "minskill/masa/search.py:ask_teacher", "minskill/masa/search.py:MasaSearch.add_candidate",
        "minskill/masa/search.py:MasaSearch.as_logged", "minskill/masa/search.py:Candidate",
        "minskill/masa/ucb.py:expand", "minskill/masa/ucb.py:evaluate",
        "minskill/masa/search.py:MasaSearch.evaluate_node", "minskill/masa/search.py:MasaSearch.type_tasks",
        "minskill/masa/search.py:MasaSearch.evaluate_candidate", "minskill/masa/search.py:MasaSearch.evaluate",
        "minskill/masa/search.py:rollouts", "minskill/masa/search.py:_metrics",
        "minskill/masa/search.py:failure_records", "minskill/masa/ucb.py:backpropagate",
        "minskill/masa/ucb.py:best_node", "minskill/masa/search.py:MasaSearch.checkpoint",
        "minskill/masa/search.py:MasaSearch.to_json", "minskill/masa/ucb.py:to_dict", "evolve_masa.py:checkpoint",
        "evolve_masa.py:save_checkpoint"],
}
BUDGETS = {"Skill-R1: one training step": (500, 4), "MASA: one hill-climbing iteration": (600, 3),
           "MASA: one UCB1 iteration": (600, 3)}
SCRIPTS = ("train_grpo.py", "evolve_masa.py", "rewrite.py")
INFRASTRUCTURE = ("bench.py",)   # measurement code, not an algorithm module: only the module size rule applies


@pytest.mark.parametrize("name", list(PATHS))
def test_each_path_fits_its_budget(name):
    lines, files, _ = path_report(PATHS[name])
    max_lines, max_files = BUDGETS[name]
    assert lines <= max_lines and files <= max_files, f"{name}: {lines} lines in {files} files"


def test_the_readme_prints_each_path_with_its_counts():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name, entries in PATHS.items():
        lines, files, rows = path_report(entries)
        assert f"{name}: {lines} lines in {files} files" in readme, name
        for entry, n in rows:
            assert re.search(rf"\b{n}\s+`?{re.escape(entry)}`?", readme), entry


def modules():
    return sorted([*(ROOT / "minskill").rglob("*.py"), *(ROOT / s for s in SCRIPTS)])


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_700_lines(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 700


def long_functions(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "parser" not in node.name \
                and node.name != "parse_args":
            if node.end_lineno - node.lineno + 1 > 80:
                yield f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"


@pytest.mark.parametrize("path", [p for p in modules() if p.name not in INFRASTRUCTURE],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_over_80_lines(path):
    assert list(long_functions(path)) == []
