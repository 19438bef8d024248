"""The edit-provenance report: one self-contained HTML page for a run folder.

    python -m minskill.report RUN_DIR [-o report.html]     (default: RUN_DIR/report.html)

RUN_DIR is a train_grpo.py training or --eval folder, an evolve_masa.py folder, a rewrite.py
`apply --compare` or `train` folder, or a transfer matrix's folder. The page shows the curves, the
cost per role and the story of each edit (docs/report.md; in full there, "The command in full").

Decisions:
1. The page is one file: inline CSS and SVG, nothing fetched (minskill/report/html.py).
2. What the run did not record is shown as "not recorded by this run", never guessed; no model
   is run.
3. It reads the folders the current scripts write: a file they always write that is missing is an
   error naming it.
4. Only the run's own files are read: one that links out of RUN_DIR, of the wrong shape or nested
   too deeply is an error naming it (exit 2); the page is written atomically.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minskill.files import write_text_atomic
from minskill.report.masa import render_masa
from minskill.report.provenance import NotARun, load_run
from minskill.report.masa_rewriter import render_compare, render_rewriter
from minskill.report.skill_r1 import render_eval, render_skill_r1
from minskill.report.transfer import render_transfer


# ---------------------------------------------------------------------------------------------- CLI

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minskill.report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a run folder of train_grpo.py (training or --eval), "
                   "evolve_masa.py, rewrite.py apply --compare, rewrite.py train or python -m "
                   "minskill.measure.transfer")
    p.add_argument("-o", "--out", default=None,
                   help="the HTML file to write (default RUN_DIR/report.html; a "
                   "folder: FOLDER/report.html)")
    args = p.parse_args(argv)
    try:
        path = write_report(args.run_dir, args.out)
    except (NotARun, FileNotFoundError) as e:
        print(f"minskill.report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Read `run_dir`, write its report (default RUN_DIR/report.html; `out` a folder:
    OUT/report.html) atomically; returns the path."""
    out = Path(out) if out else Path(run_dir) / "report.html"
    if out.is_dir():
        out = out / "report.html"
    if out.is_dir():
        raise NotARun(f"-o {out}: is a folder (give the HTML file to write)")
    return write_text_atomic(out, render(load_run(run_dir)))


def render(run: dict) -> str:
    """The page for a run loaded by provenance.load_run."""
    return {"skill-r1": render_skill_r1, "skill-r1-eval": render_eval, "masa": render_masa,
            "compare": render_compare,
            "rewriter": render_rewriter, "transfer": render_transfer}[run["kind"]](run)


if __name__ == "__main__":
    sys.exit(main())
