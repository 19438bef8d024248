"""Files that runs write and read: atomic writes, JSON and JSONL, and the shape a reader expects of
them.

Every module that writes a file shares these, and this module imports nothing else from minskill, so
the lowest layers (the model's weights, the server's call cache) use them too.

* `atomic_output(path)` (for writers that need a file name: safetensors, file copies) and
  `write_text_atomic` / `write_json_atomic` / `write_jsonl_atomic` on top of it: a temp file in the
  same folder, then `os.replace`, so a reader (or a killed run) sees the old file or the new one,
  never half.
* `read_json(path, where)`: a JSON file people write or edit (a byte order mark is fine); a missing
  file or one that does not parse (not UTF-8, or nested too deeply for Python's parser, included) is
  an error naming `where`.
* `append_jsonl` / `read_jsonl`: the logs that runs append to (metrics, trajectories, the call
  cache); the reader takes a byte order mark, drops a torn last line and names FILE:LINE for any
  other bad line. Every append opens its file with `open_append`, which never follows a symbolic
  link (`LinkError` naming it): a link planted in a run folder cannot make a run write outside it
  (atomic writes replace a link).
* `check_shape(value, shape, where)`: what a reader of a run file (--resume, the report) uses of it
  has the shape it expects, else `ShapeError` (a ValueError) naming `where` (FILE or FILE:LINE) and
  the field. A shape is a type (`float`: any number, `int`: an integer, never a bool; `object`:
  anything), None (null), `[S]` a list of S (`[S, ...]`: at least one; `[S1, S2]`: exactly those
  two), `{"key": S, "key?": S}` an object with those keys (`?`: may be absent; other keys are
  ignored), `{str: S}` an object of S values, and a tuple `(S1, S2)` for either.
* `inside(root, path, what)`: `path` with every symbolic link resolved, refused (ValueError) unless
  it lies in `root` (resolved too): a file name made from a run file's or a model's text never
  escapes --out.
"""
from __future__ import annotations

import errno
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# RecursionError
TOO_DEEP = "not readable JSON: nested too deeply (Python's parser gives up at about 1,000 levels)"


# ------------------------------------------------------------------------------ atomic writes,
# JSONL

@contextmanager
def atomic_output(path: str | Path):
    """Yield a temp path in `path`'s folder (`.tmp-NAME-*`, what runs.clean_staging removes) for the
    caller to write; on success it replaces `path`, on any exception it is deleted and `path` is
    left as it was."""
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


class LinkError(ValueError):
    """A file a run would write through a symbolic link (module docstring); the message names it."""


def open_append(path: str | Path, binary: bool = False):
    """`path` opened to append (created, 0644, when absent; text: UTF-8), never through a symbolic
    link: a link there is a LinkError naming it. Binary: unbuffered, one write is one write(2)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or Path(path).is_symlink():
            raise LinkError(f"{path} is a symbolic link (to {Path(path).resolve()}): minskill "
                            f"writes no file through a link; remove it") from None
        raise
    return os.fdopen(fd, "ab", buffering=0) if binary else os.fdopen(fd, "a", encoding="utf-8")


def append_jsonl(path, record: dict) -> None:
    """Append one JSON line and flush it to disk (a crash loses at most the line being written)."""
    with open_append(path) as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path) -> list[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file that runs append to
    (trajectories, the target-call cache). UTF-8, a byte order mark allowed; lines end at LF only
    (JSON text may hold U+2028, where str.splitlines would cut). A torn last line (the run was
    killed mid-write, perhaps inside a multi-byte character) is dropped, keeping everything before
    it; any other line that is not UTF-8 or not JSON is an error naming the file and line."""
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
    """A JSON file that people write or edit (a byte order mark is accepted): FileNotFoundError
    (`missing`, or one naming `where`) when it is absent, ValueError naming `where` when it does not
    parse (not UTF-8 included)."""
    path = Path(path)
    where = where or str(path)
    if not path.is_file():
        raise FileNotFoundError(missing or f"{where}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{where}: {TOO_DEEP}") from None


def read_json_object(path: Path, what: str) -> dict:
    """A JSON object that a program wrote (a checkpoint's config.json, an adapter_config.json):
    ValueError naming the file when it is damaged (not UTF-8, not JSON, too deep) or is not an
    object (`what` says what it should be)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(
            f"{path}: damaged, not readable JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not {what} (a JSON {type(value).__name__}, not an object)")
    return value


class ShapeError(ValueError):
    """A run file whose content lacks the shape its reader uses; the message names the file (line)
    and field."""


def check_shape(value, shape, where: str):
    """`value` when it has `shape` (module docstring), else ShapeError naming `where` and the
    field."""
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
    return ("null" if shape is None else "an object" if isinstance(shape, dict) else "a list"
            if isinstance(shape, list)
            else {int: "an integer", float: "a number", str: "a string", bool: "true or false",
                  object: "a value"}
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
                problem = _shape_problem(item, item_shape, f"{field}.{k}" if field
                                         and key is not str else
                                         f"{field}[{k[:40]!r}]" if key is str else k)
                if problem:
                    return problem
    return None


def inside(root: str | Path, path: str | Path, what: str = "a path") -> Path:
    """`path` with its symbolic links resolved; ValueError naming `what` unless it lies inside
    `root` (resolved)."""
    real, base = Path(path).resolve(), Path(root).resolve()
    if not real.is_relative_to(base):
        raise ValueError(f"{what} {str(path)[:200]!r} is outside {root} (it resolves to {real})")
    return real


def write_json_atomic(path: str | Path, obj, indent: int | None = 1) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def write_jsonl_atomic(path: str | Path, records) -> Path:
    return write_text_atomic(path,
                             "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
