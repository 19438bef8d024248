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
        "minskill/skill_r1.py:step_seed", "minskill/skill_r1.py:EvolveConfig", "minskill/skill_r1.py:Instance",
        "minskill/skill_r1.py:evolve_batch", "minskill/skill_r1.py:score_skills", "minskill/skill_r1.py:Outcome",
        "minskill/skill_r1.py:Evolution", "minskill/skill_r1.py:HistoryEntry", "minskill/skill_r1.py:editor_messages",
        "minskill/skill_r1.py:_history_block", "minskill/skill_r1.py:_outcome_line", "minskill/sampling.py:generate",
        "minskill/skill_r1.py:Candidate", "minskill/skill_r1.py:_carry", "minskill/skill_r1.py:Generation",
        "minskill/skill_r1.py:assign_advantages", "minskill/grpo.py:bilevel_advantages",
        "minskill/grpo.py:intra_advantages", "minskill/grpo.py:_sample_std", "minskill/grpo.py:inter_advantage",
        "train_grpo.py:policy_update", "train_grpo.py:_padded", "minskill/sampling.py:completion_logprobs",
        "minskill/grpo.py:policy_loss", "train_grpo.py:log_step"],
    "MASA: one hill-climbing iteration": [
        "evolve_masa.py:main", "evolve_masa.py:run_search", "minskill/masa.py:MasaConfig",
        "minskill/masa.py:MasaSearch.__init__", "minskill/masa.py:MasaSearch.run",
        "minskill/masa.py:MasaSearch.climb_general", "minskill/masa.py:HillClimbState", "minskill/masa.py:hill_climb",
        "minskill/masa.py:MasaSearch.propose_general", "minskill/masa.py:attribution_messages",
        "minskill/masa.py:general_rewrite_messages", "minskill/masa.py:MasaSearch.ask", "minskill/masa.py:ask_teacher",
        "minskill/masa.py:MasaSearch.add_candidate", "minskill/masa.py:MasaSearch.as_logged",
        "minskill/masa.py:Candidate",
        "minskill/masa.py:MasaSearch.evaluate_candidate", "minskill/masa.py:MasaSearch.evaluate",
        "minskill/masa.py:rollouts", "minskill/masa.py:_metrics", "minskill/masa.py:failure_records",
        "minskill/masa.py:MasaSearch.checkpoint", "minskill/masa.py:MasaSearch.to_json", "evolve_masa.py:checkpoint",
        "evolve_masa.py:save_checkpoint"],
    "MASA: one UCB1 iteration": [
        "evolve_masa.py:main", "evolve_masa.py:run_search", "minskill/masa.py:MasaConfig",
        "minskill/masa.py:MasaSearch.__init__", "minskill/masa.py:MasaSearch.run", "minskill/masa.py:MasaSearch.search_tree",
        "minskill/masa.py:Tree", "minskill/masa.py:MasaSearch.plant_tree", "minskill/ucb.py:search", "minskill/ucb.py:select",
        "minskill/ucb.py:ucb_score", "minskill/ucb.py:ucb1", "minskill/ucb.py:Node",
        "minskill/masa.py:MasaSearch.propose_task_skills", "minskill/masa.py:attribution_messages",
        "minskill/masa.py:task_rewrite_messages", "minskill/masa.py:MasaSearch.ask", "minskill/masa.py:ask_teacher",
        "minskill/masa.py:MasaSearch.add_candidate", "minskill/masa.py:MasaSearch.as_logged",
        "minskill/masa.py:Candidate", "minskill/ucb.py:expand",
        "minskill/ucb.py:evaluate", "minskill/masa.py:MasaSearch.evaluate_node", "minskill/masa.py:MasaSearch.type_tasks",
        "minskill/masa.py:MasaSearch.evaluate_candidate", "minskill/masa.py:MasaSearch.evaluate", "minskill/masa.py:rollouts",
        "minskill/masa.py:_metrics", "minskill/masa.py:failure_records", "minskill/ucb.py:backpropagate",
        "minskill/ucb.py:best_node", "minskill/masa.py:MasaSearch.checkpoint", "minskill/masa.py:MasaSearch.to_json",
        "minskill/ucb.py:to_dict", "evolve_masa.py:checkpoint", "evolve_masa.py:save_checkpoint"],
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
