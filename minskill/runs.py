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

--overwrite deletes, so it clears only what is certainly a run (`check_overwrite`): a folder holding the marker,
given by its own name (not a symbolic link: the link's target is what would be emptied), that is not the home
or root folder, the current folder or one above it, and holds no `.git` (a work tree). A folder written
before runs had the marker is refused too; delete it by hand. A folder holding nothing but the marker counts
as empty.

What a run folder holds is written here too, once for both trainers and all three scripts:

* `atomic_output(path)` (for writers that need a file name: safetensors, file copies) and
  `write_text_atomic` / `write_json_atomic` / `write_jsonl_atomic` on top of it: a temp file in the same
  folder, then `os.replace`, so a reader (or a killed run) sees the old file or the new one, never half.
* `save_checkpoint(folder, model, tokenizer, state)`: model + tokenizer in HF layout and `trainer_state.pt`
  (the caller's state plus the RNG states; a LoRA-adapted model is written merged, with its adapter alone
  in `adapter/`, PEFT's layout: minskill.lora.save_lora_model), built in `.tmp-NAME-*` and swapped in by renames
  (NAME → `.old-NAME`, tmp → NAME, drop `.old-NAME`). `recover_checkpoint(folder)`, called before a
  checkpoint is read or written, undoes what a kill between those renames left: the old checkpoint comes
  back when the new one never arrived, and stale staging folders are removed. So at every moment one
  complete checkpoint exists under NAME or `.old-NAME`.
* `read_json(path, where)`: a JSON file people write or edit (a byte order mark is fine); a missing file
  or one that does not parse (nested too deeply for Python's parser included) is an error naming `where`.
* `append_jsonl` / `read_jsonl`: the logs that runs append to (metrics, trajectories, the call cache);
  the reader takes a byte order mark, drops a torn last line and names FILE:LINE for any other bad line.
* `check_shape(value, shape, where)`: what a reader of a run file (--resume, the report) uses of it has the
  shape it expects, else `ShapeError` (a ValueError) naming `where` (FILE or FILE:LINE) and the field. A
  shape is a type (`float`: any number, `int`: an integer, never a bool; `object`: anything), None (null),
  `[S]` a list of S (`[S, ...]`: at least one; `[S1, S2]`: exactly those two), `{"key": S, "key?": S}` an
  object with those keys (`?`: may be absent; other keys are ignored), `{str: S}` an object of S values,
  and a tuple `(S1, S2)` for either.
* `inside(root, path, what)`: `path` with every symbolic link resolved, refused (ValueError) unless it lies
  in `root` (resolved too): a file name made from a run file's or a model's text never escapes --out.
* `rng_state()` / `set_rng_state(state)`: Python's and torch's generators (CUDA's too where present), so a
  resumed run draws the same numbers as an uninterrupted one.
* `release_freed_memory()`: on glibc, large blocks go to mmap from then on, so memory a training step
  frees is returned to the OS instead of kept in a heap that grows step after step (measured on the
  default run's update: 3.7 GB peak resident after two steps with glibc's default, 3.4 GB with this).
* `lr_factor(step, total, warmup_ratio, min_ratio)`: the multiplier of the peak learning rate at optimizer
  step `step` (0-based), with  w = ceil(warmup_ratio · total)  warmup steps:

      f(step) = (step + 1) / w                                            step < w
      f(step) = min_ratio + (1 − min_ratio) · ½ (1 + cos(π · (step − w) / max(1, total − w)))   otherwise

  so a 3-step run with ratio 0.1 gets [1, 1, 0.5]: the first step is at the peak, the last is not 0.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import random
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from minskill.lora import has_lora, save_lora_model
from minskill.skillsets import TOO_DEEP, recover_saves

TRAINER_STATE = "trainer_state.pt"
RUN_MARKER = ".minskill-run"     # written in every run folder a run starts in: what --overwrite may clear


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


# ------------------------------------------------------------------------------ atomic writes, JSONL

@contextmanager
def atomic_output(path: str | Path):
    """Yield a temp path in `path`'s folder (`.tmp-NAME-*`, what clean_staging removes) for the caller to
    write; on success it replaces `path`, on any exception it is deleted and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes files private (0600); these are ordinary outputs
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically (atomic_output)."""
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def append_jsonl(path, record: dict) -> None:
    """Append one JSON line and flush it to disk (a crash loses at most the line being written)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path) -> list[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file that runs append to (trajectories, the
    target-call cache). UTF-8, a byte order mark allowed; lines end at LF only (JSON text may hold
    U+2028, where str.splitlines would cut). A torn last line (the run was killed mid-write, perhaps inside
    a multi-byte character) is dropped, keeping everything before it; any other line that is not UTF-8 or
    not JSON is an error naming the file and line."""
    lines = Path(path).read_bytes().removeprefix(b"\xef\xbb\xbf").split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    out = []
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
            if line.strip():
                out.append((lineno, json.loads(line)))
        except RecursionError:    # (a torn line cannot be this: it is an error wherever it is)
            raise ValueError(f"{path}:{lineno}: {TOO_DEEP}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if lineno == len(lines):
                break
            what = "not UTF-8" if isinstance(e, UnicodeDecodeError) else "not a JSON line"
            raise ValueError(f"{path}:{lineno}: {what} ({e})") from None
    return out


def read_json(path: str | Path, where: str | None = None, missing: str | None = None):
    """A JSON file that people write or edit (a byte order mark is accepted): FileNotFoundError (`missing`,
    or one naming `where`) when it is absent, ValueError naming `where` when it does not parse."""
    path = Path(path)
    where = where or str(path)
    if not path.is_file():
        raise FileNotFoundError(missing or f"{where}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{where}: {TOO_DEEP}") from None


class ShapeError(ValueError):
    """A run file whose content lacks the shape its reader uses; the message names the file (line) and field."""


def check_shape(value, shape, where: str):
    """`value` when it has `shape` (module docstring), else ShapeError naming `where` and the field."""
    problem = _shape_problem(value, shape, "")
    if problem:
        raise ShapeError(f"{where}: {problem}")
    return value


def _kind_fits(value, shape) -> bool:
    if shape is None:
        return value is None
    if isinstance(shape, (dict, list)):
        return isinstance(value, type(shape))
    if isinstance(value, bool) and shape in (int, float):
        return False
    return isinstance(value, (int, float) if shape is float else shape)


def _describe(shape) -> str:
    if isinstance(shape, tuple):
        return " or ".join(_describe(s) for s in shape)
    return ("null" if shape is None else "an object" if isinstance(shape, dict) else "a list" if isinstance(shape, list)
            else {int: "an integer", float: "a number", str: "a string", bool: "true or false", object: "a value"}
            .get(shape, getattr(shape, "__name__", str(shape))))


def _got(value) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    return f"a list of {len(value)}" if isinstance(value, list) else "an object"


def _shape_problem(value, shape, field: str) -> str | None:
    name = f"field {field}" if field else "the content"
    if isinstance(shape, tuple):
        fitting = [s for s in shape if _kind_fits(value, s)]
        if not fitting:
            return f"{name}: expected {_describe(shape)}, got {_got(value)}"
        return _shape_problem(value, fitting[0], field)
    if not _kind_fits(value, shape):
        return f"{name}: expected {_describe(shape)}, got {_got(value)}"
    if isinstance(shape, list):
        if len(shape) == 2 and shape[1] is Ellipsis:
            if not value:
                return f"{name}: expected a list of at least one item, got an empty list"
            items = [(v, shape[0]) for v in value]
        elif len(shape) > 1:
            if len(value) != len(shape):
                return f"{name}: expected a list of {len(shape)} items, got {_got(value)}"
            items = list(zip(value, shape))
        else:
            items = [(v, shape[0]) for v in value]
        for i, (item, item_shape) in enumerate(items):
            problem = _shape_problem(item, item_shape, f"{field}[{i}]")
            if problem:
                return problem
    elif isinstance(shape, dict):
        for key, item_shape in shape.items():
            if key is str:     # {str: S}: every value
                pairs = list(value.items())
            elif key.rstrip("?") in value:
                pairs = [(key.rstrip("?"), value[key.rstrip("?")])]
            elif key.endswith("?"):
                continue
            else:
                return f"{f'field {field} ' if field else ''}lacks the field {key!r}"
            for k, item in pairs:
                problem = _shape_problem(item, item_shape, f"{field}.{k}" if field and key is not str else
                                         f"{field}[{k[:40]!r}]" if key is str else k)
                if problem:
                    return problem
    return None


def inside(root: str | Path, path: str | Path, what: str = "a path") -> Path:
    """`path` with its symbolic links resolved; ValueError naming `what` unless it lies inside `root` (resolved)."""
    real, base = Path(path).resolve(), Path(root).resolve()
    if not real.is_relative_to(base):
        raise ValueError(f"{what} {str(path)[:200]!r} is outside {root} (it resolves to {real})")
    return real


def write_json_atomic(path: str | Path, obj, indent: int | None = 1) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def write_jsonl_atomic(path: str | Path, records) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


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


def save_checkpoint(folder: str | Path, model, tokenizer, state: dict | None = None) -> Path:
    """Write model + tokenizer (HF layout; with LoRA merged, plus adapter/) and, when `state` is given, trainer_state.pt = state plus
    {"rng": rng_state()} into `folder`, replacing an earlier checkpoint there atomically."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_checkpoint(folder)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".tmp-{folder.name}-"))
    old = folder.with_name(f".old-{folder.name}")
    try:
        if has_lora(model):
            save_lora_model(model, tmp)   # merged in HF layout, and the adapter alone in tmp/adapter (PEFT)
        else:
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if state is not None:
            torch.save({**state, "rng": rng_state()}, tmp / TRAINER_STATE)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return folder


def load_trainer_state(folder: str | Path, restore_rng: bool = True, required: tuple[str, ...] = ()) -> dict:
    """trainer_state.pt of a checkpoint (recovered first); restores the RNG states it holds unless told not.
    A file that cannot be read (truncated, say), or is not a dict holding the `required` keys, is a ValueError
    naming it."""
    folder = Path(folder)
    recover_checkpoint(folder)
    path = folder / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a training checkpoint (no {TRAINER_STATE})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
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


# ------------------------------------------------------------------------------------------ memory

M_MMAP_THRESHOLD = -3     # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 128 * 1024


def release_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 128 KiB (module docstring). glibc raises it by itself, up to 32 MiB,
    each time a large block is freed, after which such blocks stay in the heap; a fixed threshold keeps
    them mmapped. Returns False where there is no glibc (nothing to do)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


# ------------------------------------------------------------------------------------------ lr schedule

def lr_factor(step: int, total: int, warmup_ratio: float = 0.1, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimizer step `step`: linear warmup over
    ceil(warmup_ratio · total) steps, then cosine decay to min_ratio (module docstring)."""
    warmup = math.ceil(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
