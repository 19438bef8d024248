"""Run folders: what the three scripts do before they write into `--out`.

A run folder holds a run's checkpoint, metrics and results. A second command pointed at the same folder
must not silently replace them, so every script that writes one follows one rule:

    --out empty or absent          start a run there
    --out holds anything, --resume continue the run it holds (the script checks it is one)
    --out holds anything, --overwrite
                                   delete what it holds (except `keep`), then start a run there
    --out holds anything, neither  refuse, naming the folder and both flags; nothing is written

`check_run_folder` applies the rule without touching the disk, so a script can refuse before it loads
a model; `open_run_folder` applies it again and then clears (with --overwrite) and creates the folder,
so a script calls it at the moment it writes its first file. Both raise `RunFolderError`, a
`SystemExit` whose message is the refusal, so a script's `main` needs no handler of its own.
"""
from __future__ import annotations

import shutil
from pathlib import Path


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
            if entry.name in keep:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out
