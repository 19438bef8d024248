"""Run folders: what the three scripts do before they write into `--out`.

A run folder holds a run's checkpoint, metrics and results. A second command pointed at the same
folder must not silently replace them, so every script that writes one follows one rule:

    --out empty or absent          start a run there
    --out holds anything, --resume continue the run it holds (the script checks it is one)
    --out holds anything, --overwrite
                                   a run folder (below): delete what it holds (except `keep`), then
                                   start a run there; anything else: refuse, deleting nothing
    --out holds anything, neither  refuse, naming the folder and both flags; nothing is written

`check_run_folder` applies the rule without touching the disk, so a script can refuse before it
loads a model; `open_run_folder` applies it again, then clears (with --overwrite) and creates the
folder, writes its marker RUN_MARKER (`.minskill-run`) when it starts a run, then `clean_staging`
undoes what a killed earlier run left half-written; a script calls it at the moment it writes its
first file. Both raise `RunFolderError`, a `SystemExit` whose message is the refusal, so a script's
`main` needs no handler of its own. A run writes no file through a symbolic link, so both refuse a
folder to continue (--resume), or what --overwrite would keep, that holds one (`_first_link`);
files.open_append refuses one met later.

The marker is a JSON file: the script that started the run, the folder's inode (what ties the marker
to the folder it was written in: a marker copied or planted elsewhere does not match), and the flags
the run was started with (API keys left out). A run killed before it saved anything to resume from
(its first checkpoint, state.json) holds only what it began writing: --resume starts it again from
the beginning, in place, with those flags (`started_flags`: None when `script` started no run there,
which leaves nothing to resume), and says so (`restart_flags`, `restart_note`); nothing in the
folder is deleted.

Resuming: the one policy of all three scripts, applied by `resume_flags` (for users:
docs/formats.md, "Resuming a run"). --resume continues the run that --out holds with the settings it
saved: a flag not given takes the saved value; a flag given that differs from the saved value is a
RunFolderError naming each such flag with both values, unless the script declares it may change on
resume (where and how fast the run goes: endpoints, API keys, concurrency, timeouts, budgets, step
counts, output cadence). --out, --resume and --overwrite say which run and how to open it, never a
saved setting. What each script declares: train_grpo.py, every flag but RESUME_MUST_MATCH;
evolve_masa.py, RESUMABLE_OVERRIDES; `rewrite.py train`, RESUME_MAY_CHANGE (the flags of
minskill.sft.RUN_SETTINGS, the device, the data files' paths). The data are checked apart:
train_grpo.py reads the saved suite, evolve_masa.py refuses other gate tasks, `rewrite.py train`
other training records. `given_flags` says which flags a command line gave explicitly.

--overwrite deletes, so it clears only what is certainly a run (`check_overwrite`), the path
resolved before any check: a folder given by its own name (not a symbolic link, nor reached through
one by `LINK/sub/..`: the link's target is what would be emptied), that is not the home or root
folder, the current folder or one above it, holds no `.git` at any depth (a work tree), and holds
the marker of a run started in it (`_marker_problem`: a regular file, not a link, of this user,
whose inode matches). A folder written before runs had this marker is refused too; delete it by
hand. A folder holding nothing but the marker counts as empty.

What a run folder holds is written here too, once for both trainers and all three scripts (the files
in it: minskill/files.py):

* `save_checkpoint(folder, model, tokenizer, state)`: model + tokenizer in HF layout and
  `trainer_state.pt` (the caller's state plus the RNG states; a LoRA-adapted model is written
  merged, with its adapter alone in `adapter/`, PEFT's layout: minskill.nn.lora.save_lora_model),
  built in `.tmp-NAME-*` and swapped in by renames (NAME → `.old-NAME`, tmp → NAME, drop
  `.old-NAME`). `recover_checkpoint(folder)`, called before a checkpoint is read or written, undoes
  what a kill between those renames left: the old checkpoint comes back when the new one never
  arrived, and stale staging folders are removed. So at every moment one complete checkpoint exists
  under NAME or `.old-NAME`. Before it writes anything it checks the disk holds the new checkpoint
  beside the old one (`checkpoint_bytes`, `check_disk_space`: a DiskSpaceError names the folder, the
  need and the free space). With `keep=N` (> 1) the replaced checkpoint moves to `NAME-step-S` (S =
  its trainer state's step) and only the newest N - 1 of those stay: NAME is always the newest, what
  --resume and --eval read.
* `rng_state()` / `set_rng_state(state)`: Python's and torch's generators (CUDA's too where
  present), so a resumed run draws the same numbers as an uninterrupted one.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Collection, Sequence

import torch

from minskill.files import write_text_atomic
from minskill.nn.lora import has_lora, save_lora_model
from minskill.nn.weights import save_pretrained
from minskill.skillsets import recover_saves

TRAINER_STATE = "trainer_state.pt"
RUN_MARKER = ".minskill-run"     # written in every run folder a run starts in: what --overwrite may
                                 # clear


RUN_FOLDER_FLAGS = ("out", "resume", "overwrite")   # which run and how to open it: never a saved
                                                    # setting


class RunFolderError(SystemExit):
    """A refused --out. Subclasses SystemExit: an uncaught refusal prints the message and exits with
    1."""


def check_run_folder(out: str | Path, resume: bool, overwrite: bool, script: str,
                     resumable: bool = True) -> None:
    """Refuse `out` (RunFolderError) unless the rule in the module docstring allows it. Writes
    nothing. resumable=False: `script` has no --resume, so a refusal does not offer it."""
    out = Path(out)
    if resume and overwrite:
        raise RunFolderError(f"{script}: --resume and --overwrite contradict each other (continue "
                             f"the run in {out}, or replace it: choose one)")
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"{script}: --out {out} is a file, not a folder")
    if resume and out.is_dir():
        _refuse_links(out, script)     # the run goes on writing there
    if resume or not out.is_dir():
        return
    held = _entries(out)
    if not held:
        return
    if overwrite:
        check_overwrite(out, script)   # a mistyped --out must not wipe a home folder, a source
                                       # tree, a link's target
        return
    shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
    resume_it = "--resume to continue the run it holds, " if resumable else ""
    raise RunFolderError(f"{script}: --out {out} is not empty (it holds {shown}): pass {resume_it}"
                         f"--overwrite to replace it, or choose another --out")


def check_overwrite(out: str | Path, script: str) -> None:
    """Refuse (RunFolderError) to --overwrite `out` unless it is certainly a minskill run folder
    (module docstring). Writes nothing."""
    given = Path(out)
    real, cwd = given.resolve(), Path.cwd().resolve()
    refuse = f"{script}: --overwrite refuses to clear {real}"
    if real in (Path.home().resolve(), Path(real.anchor)) or cwd.is_relative_to(real):
        raise RunFolderError(f"{refuse} (the home or root folder, or the current folder or one "
                             f"above it); choose a run folder for --out")
    named = Path(os.path.normpath(given.absolute()))     # LINK/sub/.. names LINK
    if named.resolve() != real or named.parent.resolve() / named.name != real:
        raise RunFolderError(f"{script}: --overwrite refuses to clear {given}: it is a symbolic "
                             f"link, or is reached through one (to {real}); give the run folder "
                             f"itself as --out")
    git = _first_named(real, ".git")
    if git is not None:
        raise RunFolderError(f"{refuse}: it holds {git.relative_to(real)} (a git work tree, not a "
                             f"run); choose a run folder for --out")
    problem = _marker_problem(real)
    if problem is not None:
        raise RunFolderError(f"{refuse}: it is not a minskill run folder ({problem}); delete what "
                             f"it holds yourself, or choose another --out")


def open_run_folder(out: str | Path, resume: bool, overwrite: bool, script: str,
                    keep: tuple[str, ...] = (), settings: dict | None = None) -> Path:
    """check_run_folder, then refuse a symbolic link among what stays, then (with --overwrite)
    delete every entry of `out` but those named in `keep`, then create `out` and write its
    RUN_MARKER: when it starts a run, and on --resume when `settings` (the run's flags, which the
    marker keeps) are given. Returns it as a Path."""
    out = Path(out)
    check_run_folder(out, resume, overwrite, script)
    real = out.resolve()       # what was checked (DIR/sub/.. is DIR, but not once sub is gone)
    if real.is_dir():
        kept = None if resume else keep if overwrite else ()    # (the marker is rewritten)
        _refuse_links(real, script, kept)
        if overwrite:
            for entry in real.iterdir():
                if entry.name not in (*keep, RUN_MARKER):
                    _remove(entry)
    real.mkdir(parents=True, exist_ok=True)
    if not resume or settings is not None:
        mark_run_folder(real, script, settings)
    clean_staging(real)
    return out


def clean_staging(folder: str | Path) -> list[Path]:
    """Undo what writes killed mid-way left in `folder`, before anything writes there again:
    a checkpoint caught between its renames is put back (`recover_checkpoint`), so is a skill set
    (`skillsets.recover_saves`), and `.tmp-*` entries (staging of checkpoints and atomic writes,
    never read) are deleted. Returns the entries that were removed or moved."""
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


def _entries(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name != RUN_MARKER)


def _first_named(folder: Path, name: str) -> Path | None:
    """The first entry called `name` at any depth of `folder` (links not followed), or None."""
    for parent, dirs, files in os.walk(folder):
        if name in dirs or name in files:
            return Path(parent, name)
    return None


def _first_link(folder: Path, names: Collection[str] | None = None) -> Path | None:
    """The first symbolic link at any depth of `folder` (under its entries `names` only, when
    given), or None."""
    for parent, dirs, files in os.walk(folder):
        top = Path(parent) == folder
        for entry in (*dirs, *files):
            wanted = not top or names is None or entry in names
            if wanted and os.path.islink(os.path.join(parent, entry)):
                return Path(parent, entry)
        if top and names is not None:
            dirs[:] = [d for d in dirs if d in names]
    return None


def _refuse_links(out: Path, script: str, names: Collection[str] | None = None) -> None:
    """RunFolderError naming a symbolic link in `out` (under its entries `names` only, when
    given)."""
    link = _first_link(out, names)
    if link is not None:
        target = link.resolve()
        inside = target.is_relative_to(out.resolve())
        raise RunFolderError(f"{script}: --out {out} holds a symbolic link, "
                             f"{link.relative_to(out)} (to {target}"
                             f"{'' if inside else ', which is outside the run folder'}): a run "
                             f"writes no file through a link; remove it, or choose another --out")


# ------------------------------------------------------------------------------------ the marker

def restart_flags(out: str | Path, script: str, say=print) -> dict | None:
    """started_flags; when there are some, `say` tells that the run starts again with them."""
    flags = started_flags(out, script)
    if flags is not None:
        say(restart_note(out))
    return flags


def restart_note(out: str | Path) -> str:
    """What a script says when --resume starts a run again (module docstring)."""
    return (f"--resume: {out} holds nothing to resume from yet (the run stopped before it saved "
            f"any): starting it again from the beginning, with the flags it was started with")


def started_flags(out: str | Path, script: str) -> dict | None:
    """The flags `script` started the run in `out` with (its marker's), when it did (module
    docstring: a run that saved nothing to resume from is started again with them); None when
    `out` holds no run it started."""
    out = Path(out)
    if not out.is_dir() or _marker_problem(out) is not None:
        return None
    marker = _read_marker(out / RUN_MARKER) or {}
    if marker.get("script") != script or not isinstance(marker.get("args"), dict):
        return None
    return marker["args"]


def _marker_problem(folder: Path) -> str | None:
    """Why `folder`'s RUN_MARKER does not show that a run started in it (module docstring), or
    None."""
    path = folder / RUN_MARKER
    try:
        found = path.lstat()
    except FileNotFoundError:
        return f"no {RUN_MARKER}, the file every run writes in the folder it starts in"
    if not stat.S_ISREG(found.st_mode):
        link = stat.S_ISLNK(found.st_mode)
        return f"its {RUN_MARKER} is {'a symbolic link' if link else 'not a regular file'}"
    if hasattr(os, "getuid") and found.st_uid != os.getuid():
        return f"its {RUN_MARKER} belongs to another user"
    marker = _read_marker(path)
    if marker is None or marker.get("inode") != folder.stat().st_ino:
        return (f"its {RUN_MARKER} was not written by a run started in this folder: copied or "
                f"planted there, or written by an older minskill")
    return None


def _read_marker(path: Path) -> dict | None:
    """The marker's JSON object (never read through a link), or None when it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            marker = json.loads(f.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError, RecursionError):   # (bad UTF-8 and bad JSON are ValueErrors)
        return None
    return marker if isinstance(marker, dict) else None


def mark_run_folder(folder: str | Path, script: str, settings: dict | None = None) -> None:
    """Write `folder`'s RUN_MARKER (module docstring), as open_run_folder does when a run starts
    there."""
    folder = Path(folder)
    flags = {k: v for k, v in (settings or {}).items()
             if not k.endswith("api_key")}    # no secret in a dotfile
    write_text_atomic(folder / RUN_MARKER, json.dumps(
        {"about": "a minskill run folder: --overwrite clears only a folder holding this marker",
         "script": script, "folder": str(folder.resolve()), "inode": folder.stat().st_ino,
         "args": flags}, indent=1, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------ resume

def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The dests of the arguments `argv` (None: sys.argv[1:]) gives explicitly: argv parsed a second
    time by a copy of `parser` (its sub-commands too) in which every default is argparse.SUPPRESS,
    so an argument that was not given leaves no attribute, even one given with its default value."""
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


def resume_flags(args: argparse.Namespace, saved: dict, given: set[str],
                 may_change: Collection[str],
                 script: str, parser: argparse.ArgumentParser | None = None,
                 source: str = "the saved flags") -> list[str]:
    """The resume policy (module docstring) applied to `args` in place: every setting in `saved`
    (the flags the run saved, by dest) that `given` lacks takes its saved value; a given one that
    differs is a RunFolderError naming each such flag with both values, unless it is in
    `may_change`. RUN_FOLDER_FLAGS are left as given. With `parser`, a saved value that its flag
    could not have parsed (a file edited by hand) is a RunFolderError naming `source` and the flag.
    Returns "--flag saved -> given" for each may-change flag given anew."""
    actions = {a.dest: a for a in parser._actions} if parser is not None else {}
    refused, changed, mistyped = [], [], []
    for name, value in saved.items():
        if name in RUN_FOLDER_FLAGS or not hasattr(args, name):
            continue
        if name not in given:
            problem = _saved_flag_problem(actions[name], value) if name in actions else None
            if problem:
                mistyped.append(f"--{name.replace('_', '-')} {value!r}"[:200] + f" ({problem})")
            setattr(args, name, value)
        elif _comparable(getattr(args, name)) != _comparable(value):
            (changed if name in may_change else refused).append(
                f"--{name.replace('_', '-')} {value!r} -> {getattr(args, name)!r}")
    if mistyped:
        raise RunFolderError(f"{script}: --resume: {source}: these saved flags are not values the "
                             f"flag takes: {', '.join(mistyped)}; correct them, or start a new run "
                             f"in another --out")
    if refused:
        raise RunFolderError(f"{script}: --resume continues the run in --out with the settings it "
                             "saved, and these flags differ from them (saved -> given): "
                             f"{', '.join(refused)}; drop them to take the saved values, or start "
                             "a new run in another --out")
    return changed


# a flag's value by its `type`, once read back from JSON (a float flag takes an integer too)
_SAVED_KINDS = {int: (int,), float: (int, float), str: (str,), None: (str,)}


def _saved_flag_problem(action: argparse.Action, value) -> str | None:
    """Why a saved `value` is not one `action` could have parsed (a string for a number, a value
    out of its choices, null for a flag that has a default), or None. A flag with a converter of
    its own is not checked."""
    if value is None:
        return None if action.default is None else "null, but the flag has a value"
    if action.nargs == 0:    # store_true, --x/--no-x, counts
        kinds = tuple({type(v) for v in (action.const, action.default) if v is not None}) or (bool,)
        names = {bool: "true or false", int: "an integer"}
        return None if type(value) in kinds else \
            "expected " + " or ".join(names.get(k, k.__name__) for k in kinds)
    if action.type not in _SAVED_KINDS:
        return None      # (a converter of its own may make anything of the text: a list, say)
    many = action.nargs in ("*", "+") or isinstance(action.nargs, int) or \
        isinstance(action, argparse._AppendAction)
    if many and not isinstance(value, list):
        return "expected a list"
    for item in value if many else [value]:
        if isinstance(item, bool) or not isinstance(item, _SAVED_KINDS[action.type]):
            return "expected " + {int: "an integer", float: "a number"}.get(action.type, "a string")
        if action.choices is not None and item not in action.choices:
            return f"not one of {', '.join(map(str, action.choices))}"
    return None


# ------------------------------------------------------------------------------------------
# checkpoints

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
        os.replace(old, folder)       # killed between the two renames: the old checkpoint is the
                                      # one
    elif old.is_dir():
        shutil.rmtree(old)            # killed after the swap, before the clean-up
    for stale in folder.parent.glob(f".tmp-{folder.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def save_checkpoint(folder: str | Path, model, tokenizer, state: dict | None = None,
                    keep: int = 1) -> Path:
    """Write model + tokenizer (HF layout; with LoRA merged, plus adapter/) and, when `state` is
    given, trainer_state.pt = state plus {"rng": rng_state()} into `folder`, replacing an earlier
    checkpoint there atomically. First checks that the disk holds it (`check_disk_space`). keep > 1:
    the checkpoint it replaces moves to NAME-step-S (S: its saved step), and of those only the
    newest keep - 1 stay (`older_checkpoints`)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_checkpoint(folder)
    check_disk_space(folder, checkpoint_bytes(model, state))
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".tmp-{folder.name}-"))
    old = folder.with_name(f".old-{folder.name}")
    try:
        if has_lora(model):
            save_lora_model(model, tmp)   # merged in HF layout, and the adapter alone in
                                          # tmp/adapter (PEFT)
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
    """A checkpoint the disk cannot hold, refused before anything is written (a SystemExit, like
    RunFolderError)."""


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
    """What save_checkpoint writes, estimated from above: the weights as saved (each parameter once,
    in its dtype; with LoRA the merged model in float32 plus the adapter), the tensors of `state`
    (each storage once: what torch.save writes), and 64 MiB + 2% for the tokenizer, the configs and
    the pickled rest."""
    params = list(model.parameters())     # a tied embedding is one parameter
    if has_lora(model):
        weights = sum(4 * p.numel() for p in params)
    else:
        weights = sum(p.numel() * p.element_size() for p in params)
    total = weights + (_tensor_bytes(state, set()) if state is not None else 0)
    return total + 64 * 2 ** 20 + total // 50


def check_disk_space(folder: str | Path, need: int) -> None:
    """DiskSpaceError naming the folder, the space a save needs and the space free, when the disk
    lacks it. The earlier checkpoint stays until the new one is complete, so the new one must fit
    beside it."""
    free = shutil.disk_usage(Path(folder).parent).free
    if free < need:
        raise DiskSpaceError(f"{folder}: not saved: the checkpoint needs about {_size(need)} and "
                             f"{Path(folder).parent} has {_size(free)} free. The previous "
                             "checkpoint is kept; free some space (or keep fewer checkpoints) and "
                             "continue with --resume")


def older_checkpoints(folder: str | Path) -> list[Path]:
    """The NAME-step-S folders beside checkpoint `folder` (what keep > 1 leaves), newest first."""
    folder = Path(folder)
    found = [(int(p.name.rsplit("-", 1)[1]), p) for p in folder.parent.glob(f"{folder.name}-step-*")
             if p.name.rsplit("-", 1)[1].isdigit() and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def _retire(old: Path, folder: Path, keep: int) -> None:
    """The checkpoint a save replaced (now `old`): deleted, or with keep > 1 renamed NAME-step-S;
    then only the newest keep - 1 of those stay."""
    if keep > 1 and (old / TRAINER_STATE).is_file():
        try:
            step = int(torch.load(old / TRAINER_STATE, map_location="cpu", weights_only=True,
                                  mmap=True)["step"])
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
    """trainer_state.pt of a checkpoint (recovered first); restores the RNG states it holds unless
    told not. A file that cannot be read (truncated, say), or is not a dict holding the `required`
    keys, is a ValueError naming it. mmap: its tensors are mapped from the file, not read (to look
    at the saved flags only)."""
    folder = Path(folder)
    recover_checkpoint(folder)
    path = folder / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a training checkpoint (no {TRAINER_STATE})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for a
                            # damaged file
        raise ValueError(f"{path}: damaged, cannot be read ({type(e).__name__}: "
                         f"{str(e).split('. ')[0][:200] or 'the file ends early'})") from None
    missing = [key for key in required if key not in state] if isinstance(state, dict) else None
    if missing is None or missing:
        raise ValueError(f"{path}: not a trainer state ("
                         + (f"no {', '.join(map(repr, missing))}" if missing
                         else f"a {type(state).__name__}, not a dict") + ")")
    if restore_rng and "rng" in state:
        set_rng_state(state["rng"])
    return state
