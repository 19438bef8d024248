"""Run folders: what the three scripts do before they write into `--out`.

A run folder holds a run's checkpoint, metrics and results. A second command pointed at the same folder
must not silently replace them, so every script that writes one follows one rule:

    --out empty or absent          start a run there
    --out holds anything, --resume continue the run it holds (the script checks it is one)
    --out holds anything, --overwrite
                                   a run folder (below): delete what it holds (except `keep`), then start a
                                   run there; anything else: refuse, deleting nothing
    --out holds anything, neither  refuse, naming the folder and both flags; nothing is written

`check_run_folder` applies the rule without touching the disk, so a script can refuse before it loads
a model; `open_run_folder` applies it again, then clears (with --overwrite) and creates the folder, writes
its marker RUN_MARKER (`.minskill-run`) when it starts a run, then `clean_staging` undoes what a killed
earlier run left half-written; a script calls it at the moment it writes its first file. Both raise
`RunFolderError`, a `SystemExit` whose message is the refusal, so a script's `main` needs no handler of its own.

Resuming: the one policy of all three scripts, applied by `resume_flags` (for users: docs/formats.md,
"Resuming a run"). --resume continues the run that --out holds with the settings it saved: a flag not given takes the
saved value; a flag given that differs from the saved value is a RunFolderError naming each such flag with
both values, unless the script declares it may change on resume (where and how fast the run goes: endpoints,
API keys, concurrency, timeouts, budgets, step counts, output cadence). --out, --resume and --overwrite say
which run and how to open it, never a saved setting. What each script declares: train_grpo.py, every flag but
RESUME_MUST_MATCH; evolve_masa.py, RESUMABLE_OVERRIDES; `rewrite.py train`, RESUME_MAY_CHANGE (the flags of
minskill.sft.RUN_SETTINGS, the device, the data files' paths). The data are checked apart: train_grpo.py
reads the saved suite, evolve_masa.py refuses other gate tasks, `rewrite.py train` other training records.
`given_flags` says which flags a command line gave explicitly.

--overwrite deletes, so it clears only what is certainly a run (`check_overwrite`): a folder holding the marker,
given by its own name (not a symbolic link: the link's target is what would be emptied), that is not the home
or root folder, the current folder or one above it, and holds no `.git` (a work tree). A folder written
before runs had the marker is refused too; delete it by hand. A folder holding nothing but the marker counts
as empty.

What a run folder holds is written here too, once for both trainers and all three scripts (the files in
it: minskill/files.py):

* `save_checkpoint(folder, model, tokenizer, state)`: model + tokenizer in HF layout and `trainer_state.pt`
  (the caller's state plus the RNG states; a LoRA-adapted model is written merged, with its adapter alone
  in `adapter/`, PEFT's layout: minskill.nn.lora.save_lora_model), built in `.tmp-NAME-*` and swapped in by renames
  (NAME → `.old-NAME`, tmp → NAME, drop `.old-NAME`). `recover_checkpoint(folder)`, called before a
  checkpoint is read or written, undoes what a kill between those renames left: the old checkpoint comes
  back when the new one never arrived, and stale staging folders are removed. So at every moment one
  complete checkpoint exists under NAME or `.old-NAME`.
  Before it writes anything it checks the disk holds the new checkpoint beside the old one (`checkpoint_bytes`,
  `check_disk_space`: a DiskSpaceError names the folder, the need and the free space). With `keep=N` (> 1) the
  replaced checkpoint moves to `NAME-step-S` (S = its trainer state's step) and only the newest N - 1 of those
  stay: NAME is always the newest, what --resume and --eval read.
* `rng_state()` / `set_rng_state(state)`: Python's and torch's generators (CUDA's too where present), so a
  resumed run draws the same numbers as an uninterrupted one.
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Collection, Sequence

import torch

from minskill.files import write_text_atomic
from minskill.nn.lora import has_lora, save_lora_model
from minskill.nn.weights import save_pretrained
from minskill.skillsets import recover_saves

TRAINER_STATE = "trainer_state.pt"
RUN_MARKER = ".minskill-run"     # written in every run folder a run starts in: what --overwrite may clear


RUN_FOLDER_FLAGS = ("out", "resume", "overwrite")   # which run and how to open it: never a saved setting


class RunFolderError(SystemExit):
    """A refused --out. Subclasses SystemExit: an uncaught refusal prints the message and exits with 1."""


def _entries(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name != RUN_MARKER)


def check_overwrite(out: str | Path, script: str) -> None:
    """Refuse (RunFolderError) to --overwrite `out` unless it is certainly a minskill run folder (module
    docstring). Writes nothing."""
    out = Path(out)
    if out.is_symlink():
        raise RunFolderError(f"{script}: --overwrite refuses to clear {out}: it is a symbolic link (to "
                             f"{out.resolve()}); give the run folder itself as --out")
    real, cwd = out.resolve(), Path.cwd().resolve()
    if real in (Path.home().resolve(), Path(real.anchor)) or cwd.is_relative_to(real):
        raise RunFolderError(f"{script}: --overwrite refuses to clear {real} (the home or root folder, or the "
                             f"current folder or one above it); choose a run folder for --out")
    if (real / ".git").exists():
        raise RunFolderError(f"{script}: --overwrite refuses to clear {real}: it holds .git (a git work tree, "
                             f"not a run); choose a run folder for --out")
    if not (real / RUN_MARKER).is_file():
        raise RunFolderError(f"{script}: --overwrite refuses to clear {real}: it is not a minskill run folder "
                             f"(no {RUN_MARKER}, the file every run writes in the folder it starts in); delete "
                             f"what it holds yourself, or choose another --out")


def check_run_folder(out: str | Path, resume: bool, overwrite: bool, script: str) -> None:
    """Refuse `out` (RunFolderError) unless the rule in the module docstring allows it. Writes nothing."""
    out = Path(out)
    if resume and overwrite:
        raise RunFolderError(f"{script}: --resume and --overwrite contradict each other (continue the run in "
                             f"{out}, or replace it: choose one)")
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"{script}: --out {out} is a file, not a folder")
    if resume or not out.is_dir():
        return
    held = _entries(out)
    if not held:
        return
    if overwrite:
        check_overwrite(out, script)   # a mistyped --out must not wipe a home folder, a source tree, a link's target
        return
    shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
    raise RunFolderError(f"{script}: --out {out} is not empty (it holds {shown}): pass --resume to continue "
                         f"the run it holds, --overwrite to replace it, or choose another --out")


def open_run_folder(out: str | Path, resume: bool, overwrite: bool, script: str,
                    keep: tuple[str, ...] = ()) -> Path:
    """check_run_folder, then (with --overwrite) delete every entry of `out` but those named in `keep`,
    then create `out` and (unless resuming: that run writes nothing before it is checked) its RUN_MARKER.
    Returns it as a Path."""
    out = Path(out)
    check_run_folder(out, resume, overwrite, script)
    if overwrite and out.is_dir():
        for entry in out.iterdir():
            if entry.name not in (*keep, RUN_MARKER):
                _remove(entry)
    out.mkdir(parents=True, exist_ok=True)
    if not resume and not (out / RUN_MARKER).is_file():
        write_text_atomic(out / RUN_MARKER, f"A minskill run folder (started by {script}). --overwrite clears "
                                            f"only folders holding this file.\n")
    clean_staging(out)
    return out


def clean_staging(folder: str | Path) -> list[Path]:
    """Undo what writes killed mid-way left in `folder`, before anything writes there again:
    a checkpoint caught between its renames is put back (`recover_checkpoint`), so is a skill set
    (`skillsets.recover_saves`), and `.tmp-*` entries (staging of checkpoints and atomic writes, never read)
    are deleted. Returns the entries that were removed or moved."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    before = set(folder.iterdir())
    for old in sorted(before):
        if old.name.startswith(".old-") and old.is_dir():
            recover_checkpoint(folder / old.name[len(".old-"):])
    recover_saves(folder)
    for entry in before:
        if entry.name.startswith(".tmp-") and entry.exists():
            _remove(entry)
    return sorted(before - set(folder.iterdir()))


def _remove(entry: Path) -> None:
    """Delete a file, a link (never what it points to) or a whole folder."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ resume

def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The dests of the arguments `argv` (None: sys.argv[1:]) gives explicitly: argv parsed a second time by a
    copy of `parser` (its sub-commands too) in which every default is argparse.SUPPRESS, so an argument that was
    not given leaves no attribute, even one given with its default value."""
    probe = copy.deepcopy(parser)
    stack = [probe]
    while stack:
        p = stack.pop()
        p._defaults.clear()             # set_defaults(func=...) of a sub-command
        for action in p._actions:
            action.default = argparse.SUPPRESS
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return set(vars(probe.parse_known_args(argv)[0]))


def _comparable(value):
    """JSON keeps a tuple as a list: compare both as tuples."""
    return tuple(_comparable(v) for v in value) if isinstance(value, (list, tuple)) else value


def resume_flags(args: argparse.Namespace, saved: dict, given: set[str], may_change: Collection[str],
                 script: str) -> list[str]:
    """The resume policy (module docstring) applied to `args` in place: every setting in `saved` (the flags the
    run saved, by dest) that `given` lacks takes its saved value; a given one that differs is a RunFolderError
    naming each such flag with both values, unless it is in `may_change`. RUN_FOLDER_FLAGS are left as given.
    Returns "--flag saved -> given" for each may-change flag given anew."""
    refused, changed = [], []
    for name, value in saved.items():
        if name in RUN_FOLDER_FLAGS or not hasattr(args, name):
            continue
        if name not in given:
            setattr(args, name, value)
        elif _comparable(getattr(args, name)) != _comparable(value):
            (changed if name in may_change else refused).append(
                f"--{name.replace('_', '-')} {value!r} -> {getattr(args, name)!r}")
    if refused:
        raise RunFolderError(f"{script}: --resume continues the run in --out with the settings it saved, and these "
                             f"flags differ from them (saved -> given): {', '.join(refused)}; drop them to take "
                             f"the saved values, or start a new run in another --out")
    return changed


# ------------------------------------------------------------------------------------------ checkpoints

def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _as_tuple(value):
    """random.setstate needs tuples; a state that went through JSON comes back as lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def set_rng_state(state: dict) -> None:
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def recover_checkpoint(folder: str | Path) -> None:
    """Finish or undo a save_checkpoint that a kill interrupted (see the module docstring)."""
    folder = Path(folder)
    old = folder.with_name(f".old-{folder.name}")
    if old.is_dir() and not folder.exists():
        os.replace(old, folder)       # killed between the two renames: the old checkpoint is the one
    elif old.is_dir():
        shutil.rmtree(old)            # killed after the swap, before the clean-up
    for stale in folder.parent.glob(f".tmp-{folder.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def save_checkpoint(folder: str | Path, model, tokenizer, state: dict | None = None, keep: int = 1) -> Path:
    """Write model + tokenizer (HF layout; with LoRA merged, plus adapter/) and, when `state` is given, trainer_state.pt = state plus
    {"rng": rng_state()} into `folder`, replacing an earlier checkpoint there atomically. First checks that the disk
    holds it (`check_disk_space`). keep > 1: the checkpoint it replaces moves to NAME-step-S (S: its saved step), and
    of those only the newest keep - 1 stay (`older_checkpoints`)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_checkpoint(folder)
    check_disk_space(folder, checkpoint_bytes(model, state))
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".tmp-{folder.name}-"))
    old = folder.with_name(f".old-{folder.name}")
    try:
        if has_lora(model):
            save_lora_model(model, tmp)   # merged in HF layout, and the adapter alone in tmp/adapter (PEFT)
        else:
            save_pretrained(model, tmp)
        tokenizer.save_pretrained(tmp)
        if state is not None:
            torch.save({**state, "rng": rng_state()}, tmp / TRAINER_STATE)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _retire(old, folder, keep)
    return folder


class DiskSpaceError(SystemExit):
    """A checkpoint the disk cannot hold, refused before anything is written (a SystemExit, like RunFolderError)."""


def _size(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def _tensor_bytes(obj, seen: set) -> int:
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, dict):
        obj = list(obj.values())
    return sum(_tensor_bytes(v, seen) for v in obj) if isinstance(obj, (list, tuple)) else 0


def checkpoint_bytes(model, state: dict | None = None) -> int:
    """What save_checkpoint writes, estimated from above: the weights as saved (each parameter once, in its dtype;
    with LoRA the merged model in float32 plus the adapter), the tensors of `state` (each storage once: what
    torch.save writes), and 64 MiB + 2% for the tokenizer, the configs and the pickled rest."""
    params = list(model.parameters())     # a tied embedding is one parameter
    if has_lora(model):
        weights = sum(4 * p.numel() for p in params)
    else:
        weights = sum(p.numel() * p.element_size() for p in params)
    total = weights + (_tensor_bytes(state, set()) if state is not None else 0)
    return total + 64 * 2 ** 20 + total // 50


def check_disk_space(folder: str | Path, need: int) -> None:
    """DiskSpaceError naming the folder, the space a save needs and the space free, when the disk lacks it. The
    earlier checkpoint stays until the new one is complete, so the new one must fit beside it."""
    free = shutil.disk_usage(Path(folder).parent).free
    if free < need:
        raise DiskSpaceError(f"{folder}: not saved: the checkpoint needs about {_size(need)} and "
                             f"{Path(folder).parent} has {_size(free)} free. The previous checkpoint is kept; free "
                             f"some space (or keep fewer checkpoints) and continue with --resume")


def older_checkpoints(folder: str | Path) -> list[Path]:
    """The NAME-step-S folders beside checkpoint `folder` (what keep > 1 leaves), newest first."""
    folder = Path(folder)
    found = [(int(p.name.rsplit("-", 1)[1]), p) for p in folder.parent.glob(f"{folder.name}-step-*")
             if p.name.rsplit("-", 1)[1].isdigit() and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def _retire(old: Path, folder: Path, keep: int) -> None:
    """The checkpoint a save replaced (now `old`): deleted, or with keep > 1 renamed NAME-step-S; then only the
    newest keep - 1 of those stay."""
    if keep > 1 and (old / TRAINER_STATE).is_file():
        try:
            step = int(torch.load(old / TRAINER_STATE, map_location="cpu", weights_only=True, mmap=True)["step"])
        except Exception:   # no readable step: it cannot be named, so it goes
            step = None
        if step is not None:
            target = folder.with_name(f"{folder.name}-step-{step}")
            shutil.rmtree(target, ignore_errors=True)   # a run resumed before step S saves S again
            os.replace(old, target)
    shutil.rmtree(old, ignore_errors=True)
    for stale in older_checkpoints(folder)[max(keep - 1, 0):]:
        shutil.rmtree(stale, ignore_errors=True)


def load_trainer_state(folder: str | Path, restore_rng: bool = True, required: tuple[str, ...] = (),
                       mmap: bool = False) -> dict:
    """trainer_state.pt of a checkpoint (recovered first); restores the RNG states it holds unless told not.
    A file that cannot be read (truncated, say), or is not a dict holding the `required` keys, is a ValueError
    naming it. mmap: its tensors are mapped from the file, not read (to look at the saved flags only)."""
    folder = Path(folder)
    recover_checkpoint(folder)
    path = folder / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a training checkpoint (no {TRAINER_STATE})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for a damaged file
        raise ValueError(f"{path}: damaged, cannot be read ({type(e).__name__}: "
                         f"{str(e).split('. ')[0][:200] or 'the file ends early'})") from None
    missing = [key for key in required if key not in state] if isinstance(state, dict) else None
    if missing is None or missing:
        raise ValueError(f"{path}: not a trainer state (" + (f"no {', '.join(map(repr, missing))}" if missing
                         else f"a {type(state).__name__}, not a dict") + ")")
    if restore_rng and "rng" in state:
        set_rng_state(state["rng"])
    return state
