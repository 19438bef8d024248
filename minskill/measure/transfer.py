"""The transfer matrix: every skill library scored on every target model, on the same held-out
tasks (MASA's claim that a skill is model-dependent, measured).

    python -m minskill.measure.transfer --suite qa --n-heldout 40 \\
        --libraries base=builtin f32=runs/masa-f32/library \\
        --targets f32=smollm2-135m int8=smollm2-135m:int8 big=http://gpu:8000/v1 \\
        --target-model big=Qwen/Qwen3-8B
    python -m minskill.measure.transfer --resume --out runs/transfer   # only the missing cells

Decisions (arguments, outputs and equations in full: docs/measure.md):
1. Cell (L, F): target F run greedily on the held-out tasks with library L in its system prompt;
   its success rate with a Wilson 95% interval.
2. Each cell is paired task by task with its column's reference, the library with F's label, else
   the first (minskill.paired.compare_tasks: Δ, gained / lost, exact sign test).
3. `--rewriter CKPT` adds a row "L+rw" per library, the rewriter's rewrite of L for F's model
   card, whose reference is L itself: Δ is the rewriter's own effect.
4. transfer.json is written atomically after every cell; --resume scores only the missing cells
   and refuses a change to any flag that defines them.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from minskill import device, paired
from minskill.files import (inside, read_json, write_json_atomic, write_jsonl_atomic,
                            write_text_atomic)
from minskill.masa import data as masa_data, rewriter
from minskill.cli import QUANTIZE_CHOICES, labelled_json_objects
from minskill.measure.transfer_flags import PROG, build_parser
from minskill.measure.transfer_record import (LABEL, REWRITTEN, cell_text, check_matrix,
                                              matrix_table)
from minskill.nn.weights import DEFAULT_MODEL, load_model
from minskill.retrieval import (RetrievalError, check_retrieval_args, retriever_from_args,
                                with_retrieval)
from minskill.rollout import all_failed, fit_to_suite, load_skills, run_rollouts, summarize
from minskill.runs import check_run_folder, given_flags, open_run_folder, resume_flags
from minskill.serve.client import ChatError
from minskill.serve.embedded import embedded_client
from minskill.skills import SkillFormatError
from minskill.skillsets import SkillSet
from minskill.tasks import load_suite

RUN_SETTINGS = ("task_api_key", "task_concurrency", "timeout", "startup_timeout", "device",
                "embed_url")  # --resume may change
NOT_SAVED = ("resume", "overwrite", "out", "task_api_key")      # the flags transfer.json's "args"
                                                                # leaves out


class TransferError(ValueError):
    """A bad argument; the message names it (main turns it into exit status 2)."""


# --------------------------------------------------------------------------------------------------
# Arguments: labels, libraries, targets

@dataclass
class Library:
    label: str
    spec: str                       # what was given: a path, "builtin" or "none"
    skills: SkillSet | None         # None: no system prompt


@dataclass
class Target:
    label: str
    spec: str                       # what was given
    url: str | None = None          # an endpoint; None: the embedded server on model_spec
    model_spec: str | None = None
    quantize: str = "none"
    model: str | None = None        # the name asked for at `url`; after connecting, the served name
    extra_body: dict | None = None  # --task-extra-body: fields merged into every request to it
    card: dict | None = None        # the model card (only with --rewriter)


@dataclass
class MatrixRow:
    """A row of the matrix: a library as given, or (rewritten_from set) its rewrite for each
    target."""
    label: str
    skills_for: dict = field(default_factory=dict)    # target label -> SkillSet | None (None: no
                                                      # prompt)
    rewritten_from: str | None = None
    unparsed: dict = field(default_factory=dict)      # target label -> why the rewrite did not
                                                      # parse


def safe_label(text: str) -> str:
    """A derived label: characters a label may not hold become '-'."""
    label = re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-._+")[:64]
    return label or "x"


def split_label(text: str, flag: str) -> tuple[str | None, str]:
    """'LABEL=VALUE' -> (LABEL, VALUE); a text whose part before '=' is not a label (a path, a URL
    with a query) is unlabelled: (None, text)."""
    head, sep, tail = text.partition("=")
    if not sep or not LABEL.fullmatch(head):
        if sep and "/" not in head and ":" not in head:
            raise TransferError(f"{flag} {text!r}: {head!r} is not a label (1-64 of letters, "
                                f"digits, ._+-, starting with a letter or digit)")
        return None, text
    if not tail:
        raise TransferError(f"{flag} {text!r}: nothing after '='")
    return head, tail


def label_map(items: list[str] | None, flag: str, labels: list[str]) -> dict[str, str]:
    """--target-model / --model-card: LABEL=VALUE pairs, each LABEL one of `labels`."""
    out = {}
    for item in items or []:
        label, value = split_label(item, flag)
        if label is None or label not in labels:
            raise TransferError(f"{flag} {item!r}: expected LABEL=VALUE with LABEL one of the "
                                f"targets ({', '.join(labels)})")
        out[label] = value
    return out


def in_out(out: Path, *parts: str) -> Path:
    """OUT/parts...: a TransferError unless it resolves inside OUT (no link inside OUT leads a
    write elsewhere)."""
    try:
        inside(out, Path(out, *parts), "the output path")
    except ValueError as e:
        raise TransferError(str(e)) from None
    return Path(out, *parts)


def unique(labels: list[str], flag: str) -> None:
    seen = [x for i, x in enumerate(labels) if x in labels[:i]]
    if seen:
        raise TransferError(f"{flag}: the label {seen[0]!r} is given twice (labels name rows, "
                            f"columns and files)")


def digest(skills: SkillSet | None) -> str | None:
    """A fingerprint of a library's skills: --resume refuses a library that changed since its cells
    were scored."""
    text = None if skills is None else json.dumps(skills.to_json(), sort_keys=True)
    return text and hashlib.sha256(text.encode()).hexdigest()[:16]


def suite_name(suite: str) -> str:
    return Path(suite).stem if suite.endswith(".jsonl") else suite


def load_library(text: str, suite: str) -> Library:
    """One --libraries argument (module docstring)."""
    label, spec = split_label(text, "--libraries")
    if spec.lower() in ("builtin", "base", "none"):
        kind = "none" if spec.lower() == "none" else "builtin"
        try:
            skills = load_skills("none" if kind == "none" else "base", suite)
        except FileNotFoundError:
            raise TransferError(f"--libraries {text!r}: the suite {suite!r} has no built-in base "
                                f"skills; give a folder or .json") from None
        return Library(label or kind, spec, skills)
    path = Path(spec)
    if not path.exists():
        raise TransferError(f"--libraries {text!r}: no such folder or file {spec!r} (or use "
                            f"builtin / none)")
    if path.is_file() and path.suffix.lower() != ".json":
        raise TransferError(f"--libraries {text!r}: expected an Agent Skills folder or a MASA "
                            f".json file")
    try:
        skills = fit_to_suite(SkillSet.load(path), suite, f"--libraries {text!r}")
    except (SkillFormatError, ValueError, OSError) as e:
        raise TransferError(f"--libraries {text!r}: not a skill library ({e})") from None
    name = path.parent.name if path.stem == "library" and path.parent.name else path.stem
    return Library(label or safe_label(name), spec, skills)


def parse_target(text: str) -> Target:
    """One --targets argument: a URL, or an embedded model spec with an optional :QUANTIZE
    suffix."""
    label, spec = split_label(text, "--targets")
    if spec.startswith(("http://", "https://")):
        netloc = urlparse(spec).netloc
        if not netloc:
            raise TransferError(f"--targets {text!r}: not a URL (expected http://HOST:PORT/v1)")
        return Target(label or safe_label(netloc), spec, url=spec.rstrip("/"))
    model_spec, quantize = spec, "none"
    head, sep, tail = spec.rpartition(":")
    if sep and tail in QUANTIZE_CHOICES:
        model_spec, quantize = head, tail
    if model_spec != DEFAULT_MODEL and not (Path(model_spec) / "config.json").is_file():
        raise TransferError(f"--targets {text!r}: {model_spec!r} is neither an http(s):// URL, nor "
                            f"{DEFAULT_MODEL!r}, nor a folder holding a Hugging Face checkpoint "
                            f"(config.json); a suffix may be one of "
                            f":{', :'.join(QUANTIZE_CHOICES)}")
    return Target(label or safe_label(spec), spec, model_spec=model_spec, quantize=quantize)


def load_targets(args) -> list[Target]:
    targets = [parse_target(t) for t in args.targets]
    labels = [t.label for t in targets]
    unique(labels, "--targets")
    for label, model in label_map(args.target_model, "--target-model", labels).items():
        target = targets[labels.index(label)]
        if target.url is None:
            raise TransferError(f"--target-model {label}={model}: target {label!r} is the embedded "
                                f"server, which serves one model; a model name is for a URL target")
        target.model = model
    for label, body in labelled_json_objects(args.task_extra_body, labels, "--task-extra-body",
                                             TransferError).items():
        targets[labels.index(label)].extra_body = body
    if args.model_card and not args.rewriter:
        raise TransferError("--model-card is for --rewriter (the card the rewriter adapts a "
                            "library to)")
    if args.rewriter and not args.resume:     # on --resume the rewrites are read back: no cards
                                              # needed
        cards = label_map(args.model_card, "--model-card", labels)
        for target in targets:
            if target.label not in cards and target.url is not None:
                raise TransferError(f"--rewriter: target {target.label!r} is a URL; give its model "
                                    f"card with --model-card {target.label}=PATH")
            spec = cards.get(target.label, target.model_spec)
            try:
                target.card = rewriter.load_model_card(spec)
            except (OSError, ValueError, RuntimeError) as e:
                raise TransferError(f"--model-card {target.label}={spec}: {e}") from None
    return targets


def load_heldout_tasks(args) -> list:
    """The held-out tasks (the split and selection evolve_masa.py's held-out table uses)."""
    if args.n_heldout < 1:
        raise TransferError(f"--n-heldout {args.n_heldout}: need at least one task")
    try:
        tasks = load_suite(args.suite, split="heldout", seed=args.task_seed, n=args.n_heldout)
    except (ValueError, FileNotFoundError) as e:
        raise TransferError(f"--suite {args.suite}: {e}") from None
    if not tasks:
        raise TransferError(f"--suite {args.suite}: no held-out tasks")
    return tasks


def target_task_description(args) -> str:
    """--task (a suite's name stands for its description), else the description evolve_masa.py's
    SFT records hold for --suite with its defaults, else (no train tasks) its held-out tasks
    described (minskill.masa.data)."""
    if args.task:
        return masa_data.task_description(args.task, args.task_seed)
    try:
        return masa_data.sft_task_description(args.suite, args.task_seed)
    except ValueError:
        return masa_data.suite_description(load_heldout_tasks(args), suite_name(args.suite))


# --------------------------------------------------------------------------------------------------
# The rewriter (minskill/masa/rewriter.py, shared with rewrite.py apply)

def rewritten_rows(args, libraries: list[Library], targets: list[Target],
                   out: Path) -> list[MatrixRow]:
    """One "L+rw" row per library with skills: the rewriter's greedy rewrite of L for each target's
    card, validated and saved in OUT/rewritten/F/L/ (what does not parse:
    OUT/rewritten/F/L.raw.txt)."""
    import torch
    device.set_up_device(args.device)   # --device, resolved at parse time (minskill.cli); TF32 on
                                        # CUDA
    model, tokenizer = load_model(rewriter.resolve_rewriter(args.rewriter), dtype=torch.float32,
                                  device=args.device)
    model.eval()
    task, rows = target_task_description(args), []
    for library in (lib for lib in libraries if lib.skills is not None):
        row = MatrixRow(library.label + REWRITTEN, rewritten_from=library.label)
        for target in targets:
            started = time.time()
            text, finish = rewriter.rewrite_with_model(
                model, tokenizer, target.card, library.skills, task, args.rewriter_max_tokens,
                0.0, args.seed, json_schema=args.rewriter_json_schema == "on")
            where = in_out(out, "rewritten", target.label, library.label)
            try:
                skills = rewriter.parse_rewriter_output(text,
                                                        finish).carry_resources(library.skills)
                row.skills_for[target.label] = rewriter.save_skills_validated(skills, where)
                outcome = f"wrote {where}"
            except ValueError as e:
                write_text_atomic(where.parent / f"{library.label}.raw.txt", text)
                row.unparsed[target.label] = str(e)
                outcome = (f"did not parse ({e}); raw text in "
                           f"{where.parent / (library.label + '.raw.txt')}")
            log(f"[rewrite] {library.label} for {target.label}: {outcome}  "
                f"{time.time() - started:.1f}s")
        rows.append(row)
    del model
    return rows


# --------------------------------------------------------------------------------------------------
# Scoring

STARTED = time.time()    # the run's clock; --resume sets it back by the seconds of the earlier
                         # sessions


def log(line: str) -> None:
    elapsed = int(time.time() - STARTED)
    print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def connect(targets: list[Target], args):
    """{target label: ChatClient}: URL targets directly, embedded ones through one server per
    distinct (model spec, quantisation, extra body), all stopped when the block exits. Each client
    knows its model's name."""
    with contextlib.ExitStack() as stack:
        servers, clients = {}, {}
        for target in targets:
            kw = dict(max_workers=args.task_concurrency, timeout=args.timeout,
                      extra_body=target.extra_body)
            if target.url is not None:
                client = stack.enter_context(embedded_client(url=target.url, model=target.model,
                                                             api_key=args.task_api_key, **kw))
                client.resolve_model()        # an unreachable endpoint fails here, before any cell
            else:
                key = (target.model_spec, target.quantize,
                       json.dumps(target.extra_body, sort_keys=True))
                if key not in servers:
                    log(f"starting the embedded server: {target.model_spec} (quantize "
                        f"{target.quantize}, device {args.device})")
                    servers[key] = stack.enter_context(embedded_client(
                        model_spec=target.model_spec, quantize=target.quantize,
                        startup_timeout=args.startup_timeout,
                        server_args=("--max-batch", str(args.task_concurrency)),
                        device=args.device, **kw))
                client = servers[key]
            target.model = client.model
            clients[target.label] = client
        yield clients


def reference_of(row: MatrixRow, rows: list[MatrixRow], target: Target) -> str:
    """The row a cell is paired against (module docstring)."""
    if row.rewritten_from is not None:
        return row.rewritten_from
    plain = [r.label for r in rows if r.rewritten_from is None]
    return target.label if target.label in plain else plain[0]


def score_cell(client, tasks: list, skills, args, retriever) -> tuple[list, dict, list[float]]:
    """(trajectories, summary, per-task reward in task order) of one cell."""
    trajectories = run_rollouts(client, tasks, with_retrieval(skills, retriever), n=1,
                                temperature=0.0, max_tokens=args.task_max_tokens, seed=args.seed,
                                skill_max_tokens=args.skill_max_tokens)
    by_task = {t.task_id: float(t.reward) for t in trajectories}
    return trajectories, summarize(trajectories,
                                   lam_nh=0.0), [by_task.get(t.id, 0.0) for t in tasks]


def paired_to(rewards: list[float], reference: list[float]) -> dict:
    """The paired difference of a cell to its reference cell (paired.compare_tasks: the task is the
    unit)."""
    result = paired.compare_tasks(reference, rewards, draws=2000, seed=0)
    return {"diff": result["difference"], "gained": result["gained"], "lost": result["lost"],
            "p": result["p"], "ci95": list(result["ci95"])}


def cell_record(row: MatrixRow, target: Target, reference: str, summary: dict | None, rewards,
                ref_rewards) -> dict:
    record = {"library": row.label, "target": target.label, "reference": reference,
              "trajectories": f"trajectories/{target.label}/{row.label}.jsonl" if summary else None,
              "skills": f"rewritten/{target.label}/{row.label[:-len(REWRITTEN)]}"
              if row.rewritten_from else None}
    if summary is None:
        return {**record, "status": "not parsed", "note": row.unparsed.get(target.label), "n": 0,
                "success": None, "ci95": None, "rewards": None, "paired": None}
    return {**record, "status": "scored", "n": summary["n"], "success": summary["success_rate"],
            "successes": round(summary["success_rate"] * summary["n"]),
            "ci95": summary["success_ci95"], "errors": summary["errors"],
            "per_type": {k: v["success_rate"] for k, v in summary["per_type"].items()},
            "rewards": rewards,
            "paired": None if reference == row.label else paired_to(rewards, ref_rewards)}


def column_order(rows: list[MatrixRow], target: Target) -> list[MatrixRow]:
    """A column's rows with its reference first, so every later cell can show its Δ at once."""
    first = reference_of(rows[0], rows, target)
    return sorted(rows, key=lambda r: (r.label != first, r.rewritten_from is not None))


def score_matrix(run: dict, rows: list[MatrixRow], targets: list[Target], tasks: list, args,
                 out: Path, clients) -> None:
    """Every cell that run["cells"] lacks, column by column; transfer.json saved after each. A cell
    it holds (--resume) is kept, unless its trajectories file is gone; at the end the cells are in
    the scoring order."""
    order = [(row, target) for target in targets for row in column_order(rows, target)]
    position = {(row.label, target.label): i for i, (row, target) in enumerate(order)}
    kept = {(c["library"], c["target"]): c for c in run["cells"] if (c["library"],
                                                                     c["target"]) in position
            and (c["trajectories"] is None or (c["trajectories"]
                                               == f"trajectories/{c['target']}/{c['library']}.jsonl"
                                               and (out / c["trajectories"]).is_file()))}
    run["cells"] = list(kept.values())
    if args.resume:
        log(f"resuming {out}: {len(kept)} of {len(order)} cells kept, {len(order) - len(kept)} to "
            f"score")
    rewards, retrievers = {}, {}     # (library, target) -> per-task rewards; target label ->
                                     # Retriever | None
    for done, (row, target) in enumerate(order, 1):
        key, reference = (row.label, target.label), reference_of(row, rows, target)
        if key in kept:
            rewards[key] = kept[key]["rewards"]
            continue
        started, client, summary = time.time(), clients[target.label], None
        if target.label not in row.unparsed:
            if target.label not in retrievers:
                retrievers[target.label] = retriever_from_args(args, client, args.task_api_key)
            trajectories, summary, rewards[key] = score_cell(client, tasks,
                                                             row.skills_for[target.label], args,
                                                             retrievers[target.label])
            write_jsonl_atomic(in_out(out, "trajectories", target.label, f"{row.label}.jsonl"),
                               [t.to_json() for t in trajectories])
            if failed := all_failed(trajectories):   # no cell of 0s: stop unsaved (main: exit 1),
                # --resume scores it
                raise RuntimeError(f"{row.label} on target {target.label}: {failed}")
        cell = cell_record(row, target, reference, summary, rewards.get(key),
                           rewards.get((reference, target.label)))
        run["cells"].append(cell)
        save_run(run, out)
        log(f"[{done}/{len(order)}] {row.label} on {target.label}: {cell_text(cell)}  "
            f"{time.time() - started:.1f}s")
    run["cells"].sort(key=lambda c: position[(c["library"], c["target"])])


def save_run(run: dict, out: Path) -> None:
    """transfer.json, with the seconds of all the run's sessions so far (STARTED)."""
    run["seconds"] = round(time.time() - STARTED, 1)
    write_json_atomic(out / "transfer.json", run)


# --------------------------------------------------------------------------------------------------
# --resume (module docstring)

def resume_args(argv: list[str], args) -> tuple[argparse.Namespace, dict]:
    """--resume: (the saved run's arguments with the run settings given now, the saved
    transfer.json). A flag that defines the cells may be given only with its saved value; of
    --targets, only a URL's URL."""
    if not args.out or args.overwrite:
        raise TransferError("--resume needs --out OUT, the folder of the run to continue"
                            if not args.out else
                            "--resume and --overwrite contradict each other (continue the run, or "
                            "replace it)")
    path = Path(args.out) / "transfer.json"
    try:   # (a file edited by hand or damaged: ShapeError, naming the field)
        run = read_json(path, f"--resume: {path}", missing=f"--resume: no transfer matrix to "
                        f"continue in {args.out} (no transfer.json: a run writes it once its "
                        f"targets answer; else: --overwrite)")
        if not (isinstance(run, dict) and run.get("kind") == "transfer"
                and isinstance(run.get("args"), dict)
                and isinstance(run.get("targets"), list) and isinstance(run.get("cells"), list)):
            raise TransferError(f"--resume: {path} is not a transfer matrix that can be continued "
                                f"(no saved arguments)")
        check_matrix(run, f"--resume: {path}", resume=True)
    except (FileNotFoundError, ValueError) as e:
        raise TransferError(str(e)) from None
    saved, given = run["args"], given_flags(build_parser(), argv)
    resumed = argparse.Namespace(**vars(args))
    try:   # the one resume policy (minskill.runs): a flag that defines the cells only with its
           # saved value
        resume_flags(resumed, {k: v for k, v in saved.items() if k != "targets"}, given,
                     RUN_SETTINGS, PROG)
    except SystemExit as e:
        raise TransferError(str(e).removeprefix(f"{PROG}: ")) from None
    wanted, old = args.targets if "targets" in given else saved["targets"], run["targets"]
    new = [parse_target(t) for t in wanted]
    if len(new) != len(old) or any(n.label != o["label"] or (n.url is None) != (o["url"] is None)
                                   or (n.url is None and n.spec != o["spec"])
                                   for n, o in zip(new, old)):
        raise TransferError(f"--resume: --targets {' '.join(wanted)} contradicts the saved run's "
                            f"--targets {' '.join(saved['targets'])}: give the same labels in the "
                            f"same order, each embedded target with its saved spec; only a URL "
                            f"target's URL may change (LABEL=URL)")
    saved["targets"] = [f"{t.label}={t.spec}" for t in new]      # a moved URL is the one a later
                                                                 # resume uses
    run.setdefault("resumed", []).append(command_line(argv))
    resumed.targets, resumed.resume = saved["targets"], True
    return resumed, run


def check_resumable(run: dict, tasks: list, libraries: list[Library]) -> None:
    """--resume: the held-out tasks and the libraries are the ones the saved cells were scored
    on."""
    if ([t.id for t in tasks] != run["task_ids"]
            or [str(t.question)[:300] for t in tasks] != run["questions"]):
        raise TransferError(f"--resume: the held-out task ids (or questions) of --suite "
                            f"{run['suite']} are not the saved run's ({len(tasks)} now: "
                            f"{' '.join(t.id for t in tasks[:3])} ...; {run['n_tasks']} saved: "
                            f"{' '.join(run['task_ids'][:3])} ...): the suite changed")
    saved = {r["label"]: r.get("digest") for r in run["libraries"] if r["rewritten_from"] is None}
    changed = [f"{lib.label}={lib.spec}" for lib in libraries
               if saved.get(lib.label, "") != digest(lib.skills)]
    if changed or len(saved) != len(libraries):
        raise TransferError(f"--resume: --libraries {' '.join(changed) or '(their labels)'}: not "
                            f"the skills the saved cells were scored with (a library changed since "
                            f"the run)")


def saved_rows(run: dict, libraries: list[Library], targets: list[Target],
               out: Path) -> list[MatrixRow]:
    """--resume: the saved run's rows; a rewritten row's skills read back from
    OUT/rewritten/F/L/."""
    rows, skills = [], {lib.label: lib.skills for lib in libraries}
    for r in run["libraries"]:
        row = MatrixRow(r["label"], rewritten_from=r["rewritten_from"],
                  unparsed=dict(r.get("unparsed") or {}))
        for target in (t for t in targets if t.label not in row.unparsed):
            where = in_out(out, "rewritten", target.label, str(row.rewritten_from))
            try:
                row.skills_for[target.label] = (SkillSet.load(where) if row.rewritten_from
                                                else skills[row.label])
            except (SkillFormatError, ValueError, OSError) as e:
                raise TransferError(f"--resume: the rewritten library {where} does not load "
                                    f"({e})") from None
        rows.append(row)
    return rows


def check_models(run: dict, targets: list[Target]) -> None:
    """--resume, once connected: each target serves the model its saved column was scored on."""
    for target, saved in zip(targets, run["targets"]):
        if target.model != saved["model"]:
            raise TransferError(f"--resume: --targets {target.label}={target.spec} serves the "
                                f"model {target.model!r}, but the saved column {target.label} was "
                                f"scored on {saved['model']!r}")
        saved.update(spec=target.spec, url=target.url)


# --------------------------------------------------------------------------------------------------
# The command

def set_up(args, saved: dict | None) -> tuple[list[Library], list[Target], list, Path]:
    """Checked before any model starts: libraries, targets (cards), tasks, the folder; --resume:
    check_resumable."""
    tasks = load_heldout_tasks(args)
    libraries = [load_library(x, args.suite) for x in args.libraries]
    unique([lib.label for lib in libraries], "--libraries")
    clash = next((lib.label for lib in libraries if args.rewriter
                  and lib.label.endswith(REWRITTEN)), None)
    if clash:
        raise TransferError(f"--libraries: the label {clash!r} ends with {REWRITTEN!r}, which "
                            f"names the rewriter's rows; choose another label")
    targets, out = load_targets(args), Path(args.out
                                            or f"runs/transfer-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        check_retrieval_args(args)
        check_run_folder(out, args.resume, args.overwrite, PROG)
    except (RetrievalError, SystemExit) as e:
        raise TransferError(str(e).removeprefix(f"{PROG}: ")) from None
    if saved is not None:
        check_resumable(saved, tasks, libraries)
    return libraries, targets, tasks, out


def command_line(argv: list[str]) -> str:
    """The command as run, --api-key's value hidden (transfer.json is shared; the key is not
    saved)."""
    words = ["--api-key=***" if str(w).startswith("--api-key=") else str(w) for w in argv]
    return f"{PROG} " + " ".join("***" if i and words[i - 1] == "--api-key" else w
                                 for i, w in enumerate(words))


def run_record(args, rows: list[MatrixRow], libraries: list[Library], targets: list[Target],
               tasks: list, argv) -> dict:
    by_label = {lib.label: lib for lib in libraries}
    return {"version": 1, "kind": "transfer", "complete": False, "suite": args.suite,
            "suite_name": suite_name(args.suite), "split": "heldout", "task_seed": args.task_seed,
            "n_tasks": len(tasks), "task_ids": [t.id for t in tasks],
            "task_types": [t.type for t in tasks],
            "questions": [str(t.question)[:300] for t in tasks], "rewriter": args.rewriter,
            "libraries": [{"label": r.label, "rewritten_from": r.rewritten_from,
                           "unparsed": r.unparsed, **({"spec": by_label[r.label].spec,
                                                       "digest": digest(by_label[r.label].skills)}
                              if r.rewritten_from is None
                              else {"spec": f"{args.rewriter} on {r.rewritten_from}"})}
                          for r in rows],
            "targets": [{"label": t.label, "spec": t.spec, "url": t.url, "model_spec": t.model_spec,
                         "quantize": t.quantize, "model": t.model,
                         "card": t.card} for t in targets],
            "cells": [], "max_tokens": args.task_max_tokens, "retrieve": args.retrieve,
            "command": command_line(argv), "args": {k: v for k, v in vars(args).items()
                                                    if k not in NOT_SAVED}}


def main(argv=None) -> int:
    global STARTED
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():   # `kill` / `timeout`: stop the
                                                                # servers too
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    saved = out = None
    try:
        if args.resume:
            args, saved = resume_args(argv, args)
            if saved.get("complete"):
                print(
                    write_text_atomic(
                        Path(args.out) / "table.md", matrix_table(saved) + "\n"
                    ).read_text(),
                    end="",
                )
                log(f"nothing to do: all {len(saved['cells'])} cells of {args.out} are scored "
                    f"(table.md rewritten)")
                return 0
        elif not (args.libraries and args.targets):
            raise TransferError("--libraries and --targets are required (or --resume --out OUT to "
                                "continue a run)")
        libraries, targets, tasks, out = set_up(args, saved)
        out = open_run_folder(out, args.resume, args.overwrite, PROG)
        STARTED = time.time() - float((saved or {}).get("seconds") or 0.0)
        # --resume: rewrites read back
        rows = saved_rows(saved, libraries, targets, out) if saved else [
            MatrixRow(lib.label, {t.label: lib.skills for t in targets}) for lib in libraries]
        rows += rewritten_rows(args, libraries, targets, out) if args.rewriter and not saved else []
        log(f"transfer matrix -> {out}: {len(rows)} libraries × {len(targets)} targets on "
            f"{len(tasks)} held-out {suite_name(args.suite)} tasks")
        with connect(targets, args) as clients:
            run = saved or run_record(args, rows, libraries, targets, tasks, argv)
            if saved:
                check_models(run, targets)
            save_run(run, out)
            score_matrix(run, rows, targets, tasks, args, out, clients)
    except TransferError as e:
        parser.error(str(e))
    # Ctrl-C, a failing endpoint
    except (ChatError, RetrievalError, RuntimeError, KeyboardInterrupt) as e:
        stop = "INTERRUPTED" if isinstance(e, KeyboardInterrupt) else f"FAILED: {e}"
        log(f"{stop}. " + (f"The finished cells are saved; continue with: {PROG} --resume --out "
                           f"{out}" if out and
                           (out / "transfer.json").is_file()
                           else "No transfer.json was written: nothing to resume"))
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    run["complete"] = True
    save_run(run, out)
    print(write_text_atomic(out / "table.md", matrix_table(run) + "\n").read_text(), end="")
    print(f"\nwrote {out}/transfer.json, table.md, trajectories/ (report: python -m "
          f"minskill.report {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
