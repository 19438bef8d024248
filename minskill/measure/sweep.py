"""A λ sweep in one table and one figure: each arm's held-out probe curve and
what its training records' second generation gained over the first.

    python -m minskill.measure.sweep "λ=0=runs/sweep-lam0" "raw λ=0.5=runs/sweep-raw-0.5" \\
        --svg sweep.svg

Each argument is NAME=RUN, split on its LAST '=' (a NAME may hold '=', a RUN may not). RUN is a
train_grpo.py output folder (RUN/metrics.jsonl, RUN/lineage.jsonl) or a file prefix
(RUN.metrics.jsonl, RUN.lineage.jsonl: docs/runs/skill-r1-cold-start/grpo). One row per arm:

1. The probe (metrics.jsonl rows' "probes", skill_r1.evaluate.probe): after t steps the editor
   writes one generation of candidates for the fixed held-out probe instances from their seed
   skills, so reward_per_generation = [r_0 (the seed skills), r_1 (the candidates' mean)]. The
   table shows r_1 at each probe point t, and r_1 − r_0 at the last one; the figure draws r_1
   against t, a line per arm. Every arm must hold the same probe points (else an error naming
   both lists).
2. The training records (lineage.jsonl), per record (one instance at one step):

       D = mean_k r_{2,k} − mean_k r_{1,k}

   its mean over the records, the 95% interval and p of the paired sign-flip test
   (group_stats.generation_gain: the line group_stats prints).
3. The share of λ·A_inter / S in the advantage, over every candidate of the run
   (group_stats.inter_shares, grpo.inter_share):

       share = mean_{g,k} |λ·A_inter(g) / S| / mean_{g,k} |A(g, k)|

--svg OUT writes the figure atomically (plot.write_svg_plot); an OUT that exists is refused unless
--overwrite, and a symbolic link always (nothing is written through one). Bad input (a malformed
argument, a missing file, a run without probes) is an error naming it, exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minskill.files import check_shape, read_jsonl
from minskill.measure.group_stats import generation_gain, inter_shares, read_groups
from minskill.plot import write_svg_plot

PROBE_ROW = {"probes?": [{"after_steps": int, "reward_per_generation": [float, float]}]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minskill.measure.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", metavar="NAME=RUN",
                        help="an arm's label and its run: split on the last '='; RUN is a "
                             "train_grpo.py folder or a prefix of RUN.metrics.jsonl and "
                             "RUN.lineage.jsonl")
    parser.add_argument("--svg", metavar="OUT.svg", help="also write the probe curves here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --svg file")
    args = parser.parse_args(argv)
    try:
        if args.svg:
            check_output(Path(args.svg), args.overwrite)
        arms = [read_arm(*split_arm(text)) for text in args.arms]
        check_arms(arms)
        print("\n".join(table(arms)))
        if args.svg:
            write_svg_plot(args.svg, {arm["name"]: arm["curve"] for arm in arms},
                           title="λ sweep: the held-out probe", xlabel="training steps",
                           ylabel="probe: mean candidate reward")
            print(f"wrote {args.svg}")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def check_output(out: Path, overwrite: bool) -> None:
    """ValueError unless --svg may be written: not a link, not a folder, absent or --overwrite."""
    if out.is_symlink():
        raise ValueError(f"--svg {out} is a symbolic link (to {out.resolve()}): nothing is written "
                         f"through a link; remove it or choose another file")
    if out.is_dir():
        raise ValueError(f"--svg {out} is a folder: name a file")
    if out.exists() and not overwrite:
        raise ValueError(f"--svg {out} exists: add --overwrite to replace it, or choose another "
                         f"file")


def split_arm(text: str) -> tuple[str, Path, Path]:
    """(NAME, metrics file, lineage file) of a NAME=RUN argument (module docstring)."""
    name, sep, run = text.rpartition("=")
    if not sep or not name.strip() or not run.strip():
        raise ValueError(f"argument {text!r}: expected NAME=RUN (a label, '=', a run folder or "
                         f"file prefix)")
    run_path = Path(run)
    if run_path.is_dir():
        files = run_path / "metrics.jsonl", run_path / "lineage.jsonl"
    else:
        files = Path(run + ".metrics.jsonl"), Path(run + ".lineage.jsonl")
        if not any(f.exists() for f in files):
            raise ValueError(f"argument {text!r}: {run} is neither a run folder nor the prefix of "
                             f"{files[0].name} and {files[1].name}")
    for f in files:
        if not f.is_file():
            raise ValueError(f"argument {text!r}: {f} is missing")
    return name.strip(), *files


def read_arm(name: str, metrics: Path, lineage: Path) -> dict:
    """One arm's row: its probe points and curve (t, r_1), r_1 − r_0 at the last point, D (mean,
    low, high, p, how) and its records, and the share of λ·A_inter (None: no advantages)."""
    probes = {}
    for line, row in read_jsonl(metrics):
        for probe in check_shape(row, PROBE_ROW, f"{metrics}:{line}").get("probes", []):
            if probe["after_steps"] in probes:
                raise ValueError(f"{metrics}:{line}: a second probe after {probe['after_steps']} "
                                 f"steps")
            probes[probe["after_steps"]] = probe["reward_per_generation"]
    if not probes:
        raise ValueError(f"{metrics}: no held-out probe recorded (train with --probe-every)")
    points = sorted(probes)
    groups = read_groups(lineage)
    if min(len(g["generations"]) for g in groups) < 2:
        raise ValueError(f"{lineage}: a record holds one generation: no second generation to "
                         f"compare with the first (train with -G 2 or more)")
    shares = inter_shares(groups)
    return {"name": name, "points": points,
            "curve": [(t, probes[t][1]) for t in points],
            "last_gain": probes[points[-1]][1] - probes[points[-1]][0],
            "gain": generation_gain(groups, 1), "records": len(groups),
            "share": None if shares is None else shares[0]}


def check_arms(arms: list[dict]) -> None:
    """ValueError unless the arms' names differ and every arm was probed after the same steps (the
    curves are comparable)."""
    first, names = arms[0], set()
    for arm in arms:
        if arm["name"] in names:
            raise ValueError(f"two arms are named {arm['name']!r}: give each its own NAME")
        names.add(arm["name"])
        if arm["points"] != first["points"]:
            raise ValueError(f"arm {arm['name']!r} was probed after steps {arm['points']}, arm "
                             f"{first['name']!r} after {first['points']}: the arms' probe points "
                             f"must be the same")


def table(arms: list[dict]) -> list[str]:
    """The markdown table (module docstring), a row per arm, and the line that says its units."""
    points = arms[0]["points"]
    head = ([f"probe r_1 after {t} steps" for t in points] +
            [f"probe r_1 − r_0 after {points[-1]}", "D = gen 2 − gen 1 (95% interval)",
             "p (records)", "share of λ·A_inter"])
    lines = ["| arm | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for arm in arms:
        mean, low, high, p, how = arm["gain"]
        share = "—" if arm["share"] is None else f"{arm['share']:.3f}"
        cells = ([arm["name"]] + [f"{r:.3f}" for _, r in arm["curve"]] +
                 [f"{arm['last_gain']:+.3f}", f"{mean:+.3f} ({low:+.3f} to {high:+.3f})",
                  f"{p:.4f} ({arm['records']}, {how})", share])
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines.append("r_1: the probe's mean candidate reward, r_0: its seed skills'; D: per training "
                 "record (one instance at one step), paired sign-flip test")
    return lines


if __name__ == "__main__":
    sys.exit(main())
