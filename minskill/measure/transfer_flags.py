"""The flags of `python -m minskill.measure.transfer` (its docstring and docs/measure.md: what
they define): libraries, targets, tasks, the --rewriter rows, the run settings."""
from __future__ import annotations

import argparse

from minskill import device
from minskill.cli import LABELLED_EXTRA_BODY_HELP
from minskill.retrieval import add_retrieval_args

PROG = "python -m minskill.measure.transfer"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The transfer matrix: score every skill library (rows) on every target model "
                    "(columns) on the same held-out tasks; success with a 95% Wilson interval, and "
                    "per cell the paired difference to the column's own library (gained/lost "
                    "tasks, exact sign test p).",
        epilog=f"example:\n  {PROG} --suite qa --libraries base=builtin "
               f"evolved=runs/masa-qa/library \\\n"
               "      --targets f32=smollm2-135m int8=smollm2-135m:int8\n"
               f"continue an interrupted one (only its missing cells are scored):\n  {PROG} "
               f"--resume --out OUT\n\n"
               "LABEL=VALUE: a target's own library is the library with its label (else the first "
               "library).\nEquations, outputs, --resume and the --rewriter rows: see the module "
               "docstring (minskill/measure/transfer.py).")
    p.add_argument("--libraries", nargs="+", metavar="[LABEL=]PATH",
                   help="skill libraries: an Agent Skills folder, "
                   "a MASA .json, builtin (the suite's base skills) or none (no system prompt)")
    p.add_argument("--targets", nargs="+", metavar="[LABEL=]SPEC",
                   help="target models: http(s)://HOST:PORT/v1, or "
                   "an embedded model spec (smollm2-135m, an HF folder) with an optional :int8 or "
                   ":auto suffix")
    p.add_argument("--target-model", nargs="+", default=None, metavar="LABEL=NAME",
                   help="the model name to ask a URL target for (default: the first it lists)")
    p.add_argument("--task-api-key", default=None, help="API key of the URL targets (default "
                                                        "$OPENAI_API_KEY)")
    p.add_argument("--task-extra-body", nargs="+", metavar="[LABEL=]JSON",
                   help=LABELLED_EXTRA_BODY_HELP)
    p.add_argument("--suite", default="qa",
                   help="qa | household | webwalk | webshop | searchqa | PATH.jsonl (default qa)")
    p.add_argument("--n-heldout", type=int, default=40,
                   help="held-out tasks (evolve_masa.py's; default 40)")
    p.add_argument("--task-seed", type=int, default=0, help="seed of the generated suite (default "
                                                            "0)")
    p.add_argument("--task-max-tokens", type=int, default=128,
                   help="reply budget per task (evolve_masa.py's; 128)")
    p.add_argument("--skill-max-tokens", type=int, default=1024,
                   help="token budget of the rendered skills")
    p.add_argument("--seed", type=int, default=0, help="seed sent with each request (greedy: no "
                                                       "effect)")
    add_retrieval_args(p.add_argument_group("retrieval (minskill.retrieval)"))
    g = p.add_argument_group("--rewriter: also score each library rewritten for each target (MASA "
                             "stage 2)")
    g.add_argument("--rewriter", default=None, metavar="CKPT",
                   help="a rewrite.py train --out folder or HF folder")
    g.add_argument("--model-card", nargs="+", default=None, metavar="LABEL=PATH",
                   help="a target's model card: a "
                   "JSON/YAML file, checkpoint folder or model spec (an embedded target's default: "
                   "its spec's card)")
    g.add_argument("--task", default=None, help="task description given to the rewriter, or a "
                   "suite's name for the description evolve_masa.py's SFT records hold for it "
                   "(default: --suite's)")
    g.add_argument("--rewriter-max-tokens", type=int, default=1536,
                   help="reply budget of the rewriter")
    g.add_argument("--rewriter-json-schema", choices=("on", "off"), default="on",
                   help="on (default): the rewriter's reply decoded under the skill-set JSON "
                        "schema its parser reads, as rewrite.py apply does; off: free decoding")
    device.add_device_args(g, bf16=False, what="the rewriter and the embedded targets run")
    g = p.add_argument_group("run")
    g.add_argument("--task-concurrency", type=int, default=16, help="requests in flight per target")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds one reply may take")
    g.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds to wait for an embedded server")
    g.add_argument("--out", default=None, help="output folder (default runs/transfer-TIME)")
    g.add_argument("--overwrite", action="store_true", help="replace what a non-empty --out holds")
    g.add_argument("--resume", action="store_true", help="continue the matrix in --out with its "
                   "saved arguments: only its missing cells are scored (run settings and a URL "
                   "target's URL may change)")
    return p
