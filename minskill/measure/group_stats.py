"""What K candidates and G generations buy, measured on training runs' lineage.jsonl (no new run).

    python -m minskill.measure.group_stats runs/skill-r1-cs runs/skill-r1-cs-seed1

Decisions (the equations in full: docs/measure.md):
1. K: for K' ≤ K, the share of groups whose K' rewards are all equal (A_intra = 0: no gradient)
   and the best-of-K' reward over r_0, as exact averages over all C(K, K') subsets of each
   group's recorded rewards (no resampling noise).
2. G: D = mean_k r_{g+1,k} − mean_k r_{g,k} per group, what one more generation adds; its mean
   over the records is tested by paired.sign_flip. The carried reward is printed too, biased
   upward (selected on the tasks it is scored on).
3. λ: the share of λ·A_inter / S in each candidate's advantage (grpo.inter_share), read from the
   recorded advantages alone: it needs neither the run's λ nor its --inter-scale.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

from minskill.files import read_jsonl
from minskill.paired import sign_flip
from minskill.skill_r1.grpo import inter_share

LINEAGE_FILE = "lineage.jsonl"


def read_groups(path) -> list[dict]:
    """One dict per lineage record: {"seed": r_0, "generations": [[r_{1,k}], [r_{2,k}], ...],
    "carried": [r], "step", "advantages": [[A_{1,k}], ...], or None where the record has none}. A
    record without the skills' rewards is a ValueError naming the file and line."""
    path = Path(path)
    if path.is_dir():
        path = path / LINEAGE_FILE
    groups = []
    for line, record in read_jsonl(path):
        try:
            skills = record["skills"]
            reward = {s["id"]: float(s["reward"]) for s in skills}
            seed = [reward[s["id"]] for s in skills if s["generation"] == 0][0]
            n_gen = max(s["generation"] for s in skills)
            generations = [[reward[s["id"]] for s in skills if s["generation"] == g]
                           for g in range(1, n_gen + 1)]
            carried = [reward[c] for c in record["carried"]]
            advantage = {s["id"]: s.get("advantage") for s in skills if s["generation"] > 0}
            advantages = None if None in advantage.values() else [
                [float(advantage[s["id"]]) for s in skills if s["generation"] == g]
                for g in range(1, n_gen + 1)]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{line}: not a lineage record with rewards "
                             f"({type(e).__name__}: {e})") from None
        groups.append({"seed": seed, "generations": generations, "carried": carried,
                       "step": record.get("step"), "advantages": advantages})
    if not groups:
        raise ValueError(f"{path}: no lineage record")
    return groups


def subset_stats(groups: list[dict], k: int) -> tuple[float, float]:
    """(zero(k), best(k)) of the module docstring over every generation's group of every record."""
    zero, best = [], []
    for group in groups:
        for rewards in group["generations"]:
            subsets = list(itertools.combinations(rewards, k))
            zero.append(statistics.mean(float(len(set(s)) == 1) for s in subsets))
            best.append(statistics.mean(max(s) - group["seed"] for s in subsets))
    return statistics.mean(zero), statistics.mean(best)


def report(groups: list[dict]) -> list[str]:
    sizes = {len(r) for g in groups for r in g["generations"]}
    n_gen = min(len(g["generations"]) for g in groups)
    if len(sizes) != 1 or min(sizes) < 2:
        raise ValueError(f"the groups hold {sorted(sizes)} candidates: K must be one value ≥ 2 "
                         f"across the runs")
    k = sizes.pop()
    lines = [f"{len(groups)} instances × G = {n_gen} generations × K = {k} candidates",
             "| K' | groups with zero reward variance (no gradient) | best of K' − seed skill |",
             "|---|---|---|"]
    for k_sub in range(2, k + 1):
        zero, best = subset_stats(groups, k_sub)
        lines.append(f"| {k_sub} | {zero:.3f} | {best:+.3f} |")
    for g in range(n_gen):
        means = [statistics.mean(grp["generations"][g]) - grp["seed"] for grp in groups]
        bests = [max(grp["generations"][g]) - grp["seed"] for grp in groups]
        carried = statistics.mean(grp["carried"][g + 1] for grp in groups
                                  if len(grp["carried"]) > g + 1)
        lines.append(f"generation {g + 1}: mean candidate − seed {statistics.mean(means):+.3f}, "
                     f"best − seed {statistics.mean(bests):+.3f}, carried reward {carried:.3f}")
    for g in range(1, n_gen):
        mean, low, high, p, how = generation_gain(groups, g)
        lines.append(f"generation {g + 1} − generation {g} (mean candidate, paired by record: one "
                     f"instance at one step): {mean:+.3f} ({low:+.3f} to {high:+.3f}), p {p:.4f} "
                     f"({how} sign flip)")
    return lines


def generation_gain(groups: list[dict], g: int) -> tuple[float, float, float, float, str]:
    """(mean D, 95% interval low, high, p, how) of D = mean_k r_{g+1,k} − mean_k r_{g,k} over the
    records (module docstring, G; paired.sign_flip)."""
    d = [statistics.mean(grp["generations"][g]) - statistics.mean(grp["generations"][g - 1])
         for grp in groups]
    p, (low, high), how = sign_flip(d)
    return statistics.mean(d), low, high, p, how


def inter_share_line(run: str, groups: list[dict]) -> str:
    """The share of λ·A_inter in a run's advantages (module docstring, λ), and per step."""
    shares = inter_shares(groups)
    if shares is None:
        return f"{run}: its records hold no advantages: the share of λ·A_inter cannot be computed"
    share, candidates, steps = shares
    return (f"{run}: share of λ·A_inter in the advantage {share:.3f} over {candidates} "
            f"candidates; per step: median {statistics.median(steps):.3f}, "
            f"{min(steps):.3f} to {max(steps):.3f} ({len(steps)} steps)")


def inter_shares(groups: list[dict]) -> tuple[float, int, list[float]] | None:
    """(the run's share of λ·A_inter, its candidates, the share of each step) over the records
    that hold advantages (module docstring, λ); None when none does."""
    recorded = [g for g in groups if g["advantages"] is not None]
    if not recorded:
        return None
    by_step: dict = {}
    for group in recorded:
        by_step.setdefault(group["step"], []).extend(group["advantages"])
    every = [advantages for group in recorded for advantages in group["advantages"]]
    return (inter_share(every), sum(map(len, every)),
            [inter_share(advantages) for advantages in by_step.values()])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minskill.measure.group_stats",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="train_grpo.py training folders (or their "
                                                "lineage.jsonl)")
    args = parser.parse_args(argv)
    try:
        runs = [(run, read_groups(run)) for run in args.runs]
        print("\n".join(report([g for _, groups in runs for g in groups]) +
                        [inter_share_line(run, groups) for run, groups in runs]))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
