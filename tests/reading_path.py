"""Measure a reading path: the code a learner reads to follow one step of an algorithm.

PATHS lists, in reading order, what a learner follows for one Skill-R1 training step and for one MASA
iteration of each phase: every function of the algorithm files that the default run executes there
(tests/test_reading_paths.py traces it), plus the data classes and configs they read.
A path is a list of "FILE:QUALNAME" entries in reading order (e.g. "train_grpo.py:train",
"minskill/skill_r1/grpo.py:policy_loss", "minskill/skill_r1/loop.py:Candidate"). Each entry counts the lines of that
function or class as written, from its `def`/`class` line (decorators included) to its last line,
docstring and comments included: what the reader has in front of them. Module docstrings and imports
are not counted (they are read once, not per step).

    python tests/reading_path.py            prints the paths as docs/files.md shows them
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def _entries(file: str, *names: str) -> list[str]:
    return [f"{file}:{name}" for name in names]


# Stretches that more than one path runs, in the order they run there.
SINGLE_TURN_ROLLOUTS = _entries("minskill/rollout.py", "run_rollouts", "skill_prompts", "skill_text", "_with_system",
                                "_run_single_turn", "_score")
# MASA's paths begin at the search's own loop: evolve_masa.py:run_search around it prints each iteration's progress
# line and saves the state (files, usage) after it, bookkeeping as train_grpo.py's checkpoints are
MASA_START = _entries("minskill/masa/search.py", "MasaConfig", "MasaSearch.run")
MASA_PROMPT_PARTS = _entries("minskill/masa/search.py", "attribution_messages", "_failure_text", "_clip",
                             "_skills_text", "_only_general", "_format_help", "_json_format_help")
MASA_ASK_TEACHER = (_entries("minskill/masa/search.py", "MasaSearch.ask", "teacher_seed", "ask_teacher") +
                    _entries("minskill/masa/teacher.py", "parse_attribution", "_json_in", "_strings", "_quote",
                             "parse_skillset_reply"))
MASA_EVALUATE = (_entries("minskill/masa/search.py", "MasaSearch.add_candidate", "Candidate",
                          "_unique", "MasaSearch.evaluate_candidate", "MasaSearch.evaluate", "rollouts") +
                 SINGLE_TURN_ROLLOUTS + _entries("minskill/rollout.py", "summarize", "_stats", "wilson_interval") +
                 _entries("minskill/masa/search.py", "_metrics", "failure_records", "episode_record"))
MASA_GATE = (["minskill/masa/search.py:MasaSearch.gate"] +
             _entries("minskill/gates.py", "masa_decision", "decision") +
             ["minskill/paired.py:sign_test_p_greater"])

PATHS = {
    "Skill-R1: one training step": (
        _entries("train_grpo.py", "train", "Run", "train_step", "instance_order") +
        _entries("minskill/skill_r1/loop.py", "step_seed", "EvolveConfig", "Instance", "autocast", "evolve_batch",
                 "score_skills") +
        SINGLE_TURN_ROLLOUTS +
        _entries("minskill/skill_r1/loop.py", "Outcome", "Evolution", "HistoryEntry", "editor_messages",
                 "_history_block", "outcome_line", "_clip") +
        # (the editor is sampled by nn/sampling.py:generate, language-model machinery like the model's forward)
        _entries("minskill/skill_r1/loop.py", "Candidate", "parse_candidate", "_carry", "Generation",
                 "assign_advantages") +
        _entries("minskill/skill_r1/grpo.py", "bilevel_advantages", "_as_reward_tensor", "intra_advantages",
                 "inter_advantage") +
        _entries("train_grpo.py", "policy_update", "micro_batches") +
        _entries("minskill/nn/shared_prefix.py", "shared_prefix_logprobs", "DifferentiableKV") +
        _entries("minskill/skill_r1/grpo.py", "policy_loss", "_check_loss_inputs", "_loss_stats")),
    "MASA: one hill-climbing iteration": (
        MASA_START +
        _entries("minskill/masa/search.py", "HillClimbState", "MasaSearch.climb_iteration",
                 "MasaSearch.propose_general") +
        MASA_PROMPT_PARTS + ["minskill/masa/search.py:general_rewrite_messages"] +
        MASA_ASK_TEACHER + MASA_EVALUATE + MASA_GATE + ["minskill/masa/search.py:MasaSearch.calls"]),
    "MASA: one UCB1 iteration": (
        MASA_START +
        _entries("minskill/masa/search.py", "Tree", "MasaSearch.tree_iteration") +
        _entries("minskill/masa/ucb.py", "Node", "select", "ucb_score", "ucb1") +
        ["minskill/masa/search.py:MasaSearch.propose_task_skills"] + MASA_PROMPT_PARTS +
        _entries("minskill/masa/search.py", "_only_type", "task_rewrite_messages") +
        MASA_ASK_TEACHER + ["minskill/masa/ucb.py:expand", "minskill/masa/search.py:MasaSearch.evaluate_node"] +
        MASA_EVALUATE +
        _entries("minskill/masa/ucb.py", "set_reward", "backpropagate", "best_node", "iter_nodes") +
        _entries("minskill/masa/search.py", "MasaSearch.tree_result") + MASA_GATE +
        ["minskill/masa/search.py:MasaSearch.calls"]),
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
    """docs/files.md's block of one path: its title with the counts, then its entries in reading order, one line per
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
