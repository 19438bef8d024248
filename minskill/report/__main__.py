"""The edit-provenance report: one self-contained HTML page for a run folder.

    python -m minskill.report RUN_DIR [-o report.html]       (default: RUN_DIR/report.html; -o FOLDER:
                                                               FOLDER/report.html)

RUN_DIR is a train_grpo.py training folder, a `train_grpo.py --eval` folder, an evolve_masa.py folder, a
`rewrite.py apply --compare` folder, a `rewrite.py train` folder (minskill/report/provenance.py reads them) or a
`python -m minskill.masa.transfer` folder (its heat map: minskill/report/transfer.py). The
page shows the reward and loss curves (minskill/plot.py's SVG), the cost per role (calls, tokens, seconds:
client.Usage as the runs record it), and the story of each edit: for Skill-R1 the skill lineage of every
instance across generations (each skill diffed against its parent, with its reward and the tasks it gained
and lost); for --eval the table and paired table as printed and, per instance, the skills each editor wrote
with their rewards and the tasks gained and lost against no skill (minskill/report/skill_r1.py); for MASA the
hill-climbing trajectory, each UCB1 tree drawn as a tree and every candidate with the teacher's failure
attribution and the failed episodes that motivated it (minskill/report/masa.py); for --compare the three skill
sets side by side (minskill/report/rewrite.py).
Whatever the run did not record (e.g. a run that stopped before its end) is shown as "not recorded by this
run", never guessed, and no model is run. It reads the folders the current scripts write (no release came
before them): a file they always write that is missing is an error naming it.

This module reads the run (provenance.load_run), hands it to the renderer of its kind and writes the page
atomically (files.write_text_atomic); the renderers build on the escaping helpers of minskill/report/html.py.
Only the run's own files are read: one that links out of RUN_DIR, a file of the wrong shape or one nested too
deeply is an error naming it (exit 2).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minskill.files import write_text_atomic
from minskill.report.masa import render_masa
from minskill.report.provenance import NotARun, load_run
from minskill.report.rewrite import render_compare, render_rewriter
from minskill.report.skill_r1 import render_eval, render_skill_r1
from minskill.report.transfer import render_transfer


# ---------------------------------------------------------------------------------------------- CLI

def render(run: dict) -> str:
    """The page for a run loaded by provenance.load_run."""
    return {"skill-r1": render_skill_r1, "skill-r1-eval": render_eval, "masa": render_masa, "compare": render_compare,
            "rewriter": render_rewriter, "transfer": render_transfer}[run["kind"]](run)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Read `run_dir`, write its report (default RUN_DIR/report.html; `out` a folder: OUT/report.html)
    atomically; returns the path."""
    out = Path(out) if out else Path(run_dir) / "report.html"
    if out.is_dir():
        out = out / "report.html"
    if out.is_dir():
        raise NotARun(f"-o {out}: is a folder (give the HTML file to write)")
    return write_text_atomic(out, render(load_run(run_dir)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minskill.report", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a run folder of train_grpo.py (training or --eval), evolve_masa.py, rewrite.py "
                   "apply --compare, rewrite.py train or python -m minskill.masa.transfer")
    p.add_argument("-o", "--out", default=None, help="the HTML file to write (default RUN_DIR/report.html; a "
                   "folder: FOLDER/report.html)")
    args = p.parse_args(argv)
    try:
        path = write_report(args.run_dir, args.out)
    except (NotARun, FileNotFoundError) as e:
        print(f"minskill.report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
