"""Measure a reading path: the code a learner reads to follow one step of an algorithm.

PATHS lists, in reading order, what a learner follows for one Skill-R1 training step and for one MASA
iteration of each phase: every function of the algorithm files that the default run executes there
(tests/test_reading_paths.py traces it), plus the data classes and configs they read.
A path is a list of "FILE:QUALNAME" entries in reading order (e.g. "train_grpo.py:train",
"minskill/skill_r1/grpo.py:policy_loss", "minskill/skill_r1/loop.py:Candidate"). Each entry counts the lines of that
function or class as written, from its `def`/`class` line (decorators included) to its last line,
docstring and comments included: what the reader has in front of them. Module docstrings and imports
are not counted (they are read once, not per step).

    python tests/reading_path.py            prints the paths as the README shows them
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PATHS = {
    "Skill-R1: one training step": [
        "train_grpo.py:train", "train_grpo.py:Run", "train_grpo.py:train_step", "train_grpo.py:instance_order",
        "minskill/skill_r1/loop.py:step_seed", "minskill/skill_r1/loop.py:EvolveConfig",
        "minskill/skill_r1/loop.py:Instance", "minskill/skill_r1/loop.py:autocast",
        "minskill/skill_r1/loop.py:evolve_batch", "minskill/skill_r1/loop.py:_check_batch",
        "minskill/skill_r1/loop.py:score_skills", "minskill/rollout.py:run_rollouts",
        "minskill/rollout.py:skill_prompts", "minskill/rollout.py:skill_text",
        "minskill/rollout.py:_with_system", "minskill/rollout.py:_run_single_turn",
        "minskill/rollout.py:_as_completed", "minskill/rollout.py:_score", "minskill/skill_r1/loop.py:Outcome",
        "minskill/skill_r1/loop.py:Evolution", "minskill/skill_r1/loop.py:HistoryEntry",
        "minskill/skill_r1/loop.py:editor_messages", "minskill/skill_r1/loop.py:_history_block",
        "minskill/skill_r1/loop.py:_outcome_line", "minskill/skill_r1/loop.py:_clip",
        "minskill/nn/sampling.py:generate", "minskill/skill_r1/loop.py:Candidate",
        "minskill/skill_r1/loop.py:parse_candidate", "minskill/skill_r1/loop.py:_has_front_matter",
        "minskill/skill_r1/loop.py:_carry", "minskill/gates.py:carry", "minskill/gates.py:carried",
        "minskill/gates.py:per_task_means", "minskill/gates.py:decision", "minskill/gates.py:check_gate",
        "minskill/paired.py:sign_test_p_greater", "minskill/skill_r1/loop.py:Generation",
        "minskill/skill_r1/loop.py:assign_advantages", "minskill/skill_r1/grpo.py:bilevel_advantages",
        "minskill/skill_r1/grpo.py:_as_reward_tensor", "minskill/skill_r1/grpo.py:intra_advantages",
        "minskill/skill_r1/grpo.py:_sample_std", "minskill/skill_r1/grpo.py:inter_advantage",
        "train_grpo.py:policy_update", "train_grpo.py:micro_batches", "train_grpo.py:_padded",
        "minskill/nn/shared_prefix.py:grouped_logprobs", "minskill/nn/shared_prefix.py:shared_prefix_logprobs",
        "minskill/nn/shared_prefix.py:DifferentiableKV", "minskill/skill_r1/grpo.py:policy_loss",
        "minskill/skill_r1/grpo.py:_check_loss_inputs", "minskill/skill_r1/grpo.py:_loss_stats",
        "train_grpo.py:log_step", "train_grpo.py:metrics_row", "train_grpo.py:plot_rewards",
        "minskill/skill_r1/loop.py:lineage_records"],
    "MASA: one hill-climbing iteration": [
        "evolve_masa.py:run_search", "minskill/masa/search.py:MasaConfig",
        "minskill/masa/search.py:MasaSearch.run", "minskill/masa/search.py:HillClimbState",
        "minskill/masa/search.py:MasaSearch.climb_iteration",
        "minskill/masa/search.py:MasaSearch.propose_general", "minskill/masa/search.py:attribution_messages",
        "minskill/masa/search.py:_failure_text", "minskill/masa/search.py:_clip",
        "minskill/masa/search.py:_skills_text", "minskill/masa/search.py:_only_general",
        "minskill/masa/search.py:_format_help", "minskill/masa/search.py:general_rewrite_messages",
        "minskill/masa/search.py:MasaSearch.ask", "minskill/masa/search.py:teacher_seed",
        "minskill/masa/search.py:ask_teacher", "minskill/masa/teacher.py:parse_attribution",
        "minskill/masa/teacher.py:_json_in", "minskill/masa/teacher.py:_strings",
        "minskill/masa/teacher.py:_quote", "minskill/masa/teacher.py:parse_skillset_reply",
        "minskill/masa/search.py:MasaSearch.add_candidate", "minskill/masa/search.py:MasaSearch.as_logged",
        "minskill/masa/search.py:Candidate", "minskill/masa/search.py:_unique",
        "minskill/masa/search.py:MasaSearch.evaluate_candidate", "minskill/masa/search.py:MasaSearch.evaluate",
        "minskill/masa/search.py:rollouts", "minskill/rollout.py:run_rollouts",
        "minskill/rollout.py:skill_prompts", "minskill/rollout.py:skill_text",
        "minskill/rollout.py:_with_system", "minskill/rollout.py:_run_single_turn",
        "minskill/rollout.py:_as_completed", "minskill/rollout.py:_score", "minskill/rollout.py:summarize",
        "minskill/rollout.py:_stats", "minskill/rollout.py:wilson_interval", "minskill/masa/search.py:_metrics",
        "minskill/masa/search.py:failure_records", "minskill/masa/search.py:episode_record",
        "minskill/masa/search.py:MasaSearch.gate", "minskill/gates.py:masa_decision",
        "minskill/gates.py:_task_rewards", "minskill/gates.py:decision", "minskill/gates.py:check_gate",
        "minskill/paired.py:sign_test_p_greater", "minskill/masa/search.py:MasaSearch.checkpoint",
        "minskill/masa/search.py:MasaSearch.to_json", "evolve_masa.py:checkpoint", "evolve_masa.py:run_usage",
        "evolve_masa.py:save_checkpoint", "minskill/masa/search.py:search_log", "evolve_masa.py:log",
        "minskill/masa/search.py:MasaSearch.calls"],
    "MASA: one UCB1 iteration": [
        "evolve_masa.py:run_search", "minskill/masa/search.py:MasaConfig",
        "minskill/masa/search.py:MasaSearch.run", "minskill/masa/search.py:Tree",
        "minskill/masa/search.py:MasaSearch.tree_iteration", "minskill/masa/ucb.py:Node",
        "minskill/masa/ucb.py:select", "minskill/masa/ucb.py:ucb_score", "minskill/masa/ucb.py:ucb1",
        "minskill/masa/search.py:MasaSearch.propose_task_skills",
        "minskill/masa/search.py:attribution_messages", "minskill/masa/search.py:_failure_text",
        "minskill/masa/search.py:_clip", "minskill/masa/search.py:_skills_text",
        "minskill/masa/search.py:_only_general", "minskill/masa/search.py:_format_help",
        "minskill/masa/search.py:_only_type", "minskill/masa/search.py:task_rewrite_messages",
        "minskill/masa/search.py:MasaSearch.ask", "minskill/masa/search.py:teacher_seed",
        "minskill/masa/search.py:ask_teacher", "minskill/masa/teacher.py:parse_attribution",
        "minskill/masa/teacher.py:_json_in", "minskill/masa/teacher.py:_strings",
        "minskill/masa/teacher.py:_quote", "minskill/masa/teacher.py:parse_skillset_reply",
        "minskill/masa/ucb.py:expand", "minskill/masa/search.py:MasaSearch.evaluate_node",
        "minskill/masa/search.py:MasaSearch.add_candidate", "minskill/masa/search.py:MasaSearch.as_logged",
        "minskill/masa/search.py:Candidate", "minskill/masa/search.py:_unique",
        "minskill/masa/search.py:MasaSearch.evaluate_candidate", "minskill/masa/search.py:MasaSearch.evaluate",
        "minskill/masa/search.py:rollouts", "minskill/rollout.py:run_rollouts",
        "minskill/rollout.py:skill_prompts", "minskill/rollout.py:skill_text",
        "minskill/rollout.py:_with_system", "minskill/rollout.py:_run_single_turn",
        "minskill/rollout.py:_as_completed", "minskill/rollout.py:_score", "minskill/rollout.py:summarize",
        "minskill/rollout.py:_stats", "minskill/rollout.py:wilson_interval", "minskill/masa/search.py:_metrics",
        "minskill/masa/search.py:failure_records", "minskill/masa/search.py:episode_record",
        "minskill/masa/ucb.py:set_reward", "minskill/masa/ucb.py:backpropagate",
        "minskill/masa/ucb.py:best_node", "minskill/masa/ucb.py:iter_nodes",
        "minskill/masa/ucb.py:_sibling_indices", "minskill/masa/search.py:MasaSearch.tree_result",
        "minskill/masa/search.py:MasaSearch.gate", "minskill/gates.py:masa_decision",
        "minskill/gates.py:_task_rewards", "minskill/gates.py:decision", "minskill/gates.py:check_gate",
        "minskill/paired.py:sign_test_p_greater", "minskill/masa/search.py:MasaSearch.checkpoint",
        "minskill/masa/search.py:MasaSearch.to_json", "minskill/masa/search.py:HillClimbState.to_json",
        "minskill/masa/ucb.py:to_dict", "evolve_masa.py:checkpoint", "evolve_masa.py:run_usage",
        "evolve_masa.py:save_checkpoint", "minskill/masa/search.py:search_log", "evolve_masa.py:log",
        "minskill/masa/search.py:MasaSearch.calls"],
}


def _find(tree: ast.Module, qualname: str):
    nodes: list = [tree]
    for part in qualname.split("."):
        found = None
        for parent in nodes[-1:]:
            for child in ast.iter_child_nodes(parent):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                    found = child
        if found is None:
            return None
        nodes.append(found)
    return nodes[-1]


def entry_lines(entry: str) -> int:
    """Source lines of one "FILE:QUALNAME" entry; raises LookupError when it does not exist."""
    file, _, qualname = entry.partition(":")
    tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
    node = _find(tree, qualname)
    if node is None:
        raise LookupError(f"{entry}: no such function or class")
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return node.end_lineno - first + 1


def path_report(entries: list[str]) -> tuple[int, int, list[tuple[str, int]]]:
    """(total lines, number of files, [(entry, lines)])."""
    rows = [(e, entry_lines(e)) for e in entries]
    return sum(n for _, n in rows), len({e.partition(":")[0] for e in entries}), rows


def format_path(name: str, width: int = 116) -> str:
    """The README's block of one path: its title with the counts, then its entries in reading order, one line per
    run of entries of the same file ("LINES QUALNAME", joined by " · "; a long run wraps under itself)."""
    total, files, rows = path_report(PATHS[name])
    runs: list[tuple[str, list[str]]] = []
    for entry, n in rows:
        file, _, qualname = entry.partition(":")
        if not runs or runs[-1][0] != file:
            runs.append((file, []))
        runs[-1][1].append(f"{n} {qualname}")
    pad = max(len(file) for file, _ in runs) + 2
    lines = []
    for file, items in runs:
        line = file.ljust(pad)
        for k, item in enumerate(items):
            if k and len(line) + 3 + len(item) > width:
                lines.append(line)
                line = " " * pad + item
            else:
                line += (" · " if k else "") + item
        lines.append(line)
    return f"**{name}: {total} lines in {files} files**\n\n```\n" + "\n".join(lines) + "\n```\n"


if __name__ == "__main__":
    print("\n".join(format_path(name) for name in PATHS))
