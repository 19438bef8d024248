"""Run folders: what the three scripts do before they write into `--out`.

A run folder holds a run's checkpoint, metrics and results. A second command pointed at the same folder
must not silently replace them, so every script that writes one follows one rule:

    --out empty or absent          start a run there
    --out holds anything, --resume continue the run it holds (the script checks it is one)
    --out holds anything, --overwrite
                                   delete what it holds (except `keep`), then start a run there
    --out holds anything, neither  refuse, naming the folder and both flags; nothing is written

`check_run_folder` applies the rule without touching the disk, so a script can refuse before it loads
a model; `open_run_folder` applies it again, then clears (with --overwrite) and creates the folder, then
`clean_staging` undoes what a killed earlier run left half-written; a script calls it at the moment it
writes its first file. Both raise `RunFolderError`, a `SystemExit` whose message is the refusal, so a
script's `main` needs no handler of its own.

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
  or one that does not parse is an error naming `where`.
* `append_jsonl` / `read_jsonl`: the logs that runs append to (metrics, trajectories, the call cache);
  the reader takes a byte order mark, drops a torn last line and names FILE:LINE for any other bad line.
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
from minskill.skillsets import recover_saves

TRAINER_STATE = "trainer_state.pt"


class RunFolderError(SystemExit):
    """A refused --out. Subclasses SystemExit: an uncaught refusal prints the message and exits with 1."""


def _entries(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


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
        # a mistyped --out must not wipe a home folder or a source tree
        protected = {Path.home().resolve(), Path.cwd().resolve(), Path(out.resolve().anchor)}
        if out.resolve() in protected:
            raise RunFolderError(f"{script}: --overwrite refuses to clear {out.resolve()} (the current, home or "
                                 f"root folder); choose a run folder for --out")
        return
    shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
    raise RunFolderError(f"{script}: --out {out} is not empty (it holds {shown}): pass --resume to continue "
                         f"the run it holds, --overwrite to replace it, or choose another --out")


def open_run_folder(out: str | Path, resume: bool, overwrite: bool, script: str,
                    keep: tuple[str, ...] = ()) -> Path:
    """check_run_folder, then (with --overwrite) delete every entry of `out` but those named in `keep`,
    then create `out`. Returns it as a Path."""
    out = Path(out)
    check_run_folder(out, resume, overwrite, script)
    if overwrite and out.is_dir():
        for entry in out.iterdir():
            if entry.name not in keep:
                _remove(entry)
    out.mkdir(parents=True, exist_ok=True)
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


def load_trainer_state(folder: str | Path, restore_rng: bool = True) -> dict:
    """trainer_state.pt of a checkpoint (recovered first); restores the RNG states it holds unless told not."""
    folder = Path(folder)
    recover_checkpoint(folder)
    path = folder / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a training checkpoint (no {TRAINER_STATE})")
    state = torch.load(path, map_location="cpu", weights_only=True)
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
