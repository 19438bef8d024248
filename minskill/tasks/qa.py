"""Single-turn question answering: a built-in generated set and JSONL loading.

Built-in set (no download). Four task types, each answered by one number and scored by the lenient
final-answer check (`verifiers.final_answer_match`):

* `counting`   — count how often a word occurs in a short list given in the question;
* `lookup`     — facts about 3-4 fictional entities are given; ask for one entity's number;
* `arithmetic` — one-digit addition and subtraction (a + b, a - b with a >= b; 155 problems);
* `conversion` — unit conversion from a larger to a smaller unit (value 1-25 times a factor such as
  60 min/h, 100 cm/m, 12 items/dozen; 225 problems).
(Held-out draws larger than the split extend both: below.)

They are chosen so that the offline default model (SmolLM2-135M-Instruct) scores between 0 and 1 and
a skill can carry what it lacks: a procedure and an answer pattern (counting, arithmetic), a
conversion table (conversion), or a way to find the right fact (lookup). Measured (greedy, held-out
split, seed 0, 50 tasks per type; counting / lookup / arithmetic / conversion / all):

    no skill (the model's default system prompt)      .14 / .26 / .54 / .14 / .27
    base_skills/qa (worked examples per type)         .28 / .30 / .60 / .32 / .38   (paired +43/-22)

Train and held-out sets are disjoint by problem key (see base.py); arithmetic (155 problems) and
conversion (225) are small spaces, so `n` per type is capped by what the split holds: on train, 74
and 100; on held-out, 81 and 125 of them, then a held-out extension that no training task comes
from, drawn only when more are asked for (an evaluation sized by a power computation needs a few
hundred a type): arithmetic with operands up to 19 (455 more problems: a + b, a − b with a ≥ b,
one of them 10-19), conversion of 26-60 units (315 more). A draw of up to 81 / 125 held-out tasks
is what it was without the extension; a larger one holds those first, then the extension's (harder
for arithmetic: every row of an evaluation sees the same tasks, so its paired differences hold).

JSONL. One JSON object a line, either GAIA's metadata.jsonl format {"task_id", "Question", "Level",
"Final answer", "file_name"?, "Annotator Metadata"?} (verifier "gaia", type "level<Level>") or
{"question", "answer", "type"?, "id"?, "verifier"?, "split"?, "file_name"?}. Lines without an
explicit split are assigned by a stable hash of their id. The file is UTF-8 (a byte order mark is
allowed). A malformed line (bad UTF-8 or JSON, missing fields, a type that cannot name a skill
folder: see base.check_task_type, a `file_name` outside the file's folder) raises ValueError naming
the file and line number, and a file holding no task raises ValueError naming the file.

The prompt of a JSONL task (`Task.prompt`, what the task model is shown; `Task.question` stays the
question, which retrieval, MASA's teacher and Skill-R1's editor quote), as GAIA runs it:
* a task of the `gaia` verifier starts with GAIA's published system prompt (GAIA_PROMPT: "... finish
  your answer with the following template: FINAL ANSWER: [YOUR FINAL ANSWER] ..."), then the
  question;
* a `file_name` is read from beside the JSONL (a path that resolves outside its folder is refused):
  a text file (UTF-8, no NUL byte) is put into the prompt, its first `file_chars` characters
  (default FILE_CHARS); any other file is named with its size; a missing file is named as not
  available, with a TaskWarning naming the line and the task.
A task with neither (a plain line, another verifier, no file) has no prompt of its own: its question
is it.

Hidden answers. GAIA's test split gives every task the "Final answer" "?" (GAIA's authors keep
the answers); GAIA's scorer would compare a reply with "?" like with any answer, and call a blank
one right. A task of the `gaia` verifier whose answer is hidden ("?", blank or missing:
`is_hidden_answer`) is refused as FILE:LINE, since nothing can score it, unless the caller takes
such tasks (`hidden_answers=True`; the evaluation command does): then it loads with answer None,
is answered and never scored, and `gaia_submission` makes the lines GAIA's leaderboard takes
instead, {"task_id", "model_answer", "reasoning_trace"}, model_answer being the bare answer the
`gaia` verifier reads of the reply; `withhold_hidden` keeps such tasks' rollouts out of a run's
scores and hands those lines to the caller's writer.
"""
from __future__ import annotations

import codecs
import json
import sys
import warnings
from pathlib import Path

from .base import (Task, TaskWarning, check_split, check_task_type, counts_per_type, interleave,
                   rng_for, split_of,
                   stable_hash, task_id)
from .verifiers import VERIFIERS, gaia_final_answer

TASK_TYPES = ("counting", "lookup", "arithmetic", "conversion")
DEFAULT_PER_TYPE = 50
# The task types of GAIA's metadata.jsonl ("level<Level>"): base_skills/gaia/ holds their base
# skills.
GAIA_TYPES = ("level1", "level2", "level3")
# GAIA's system prompt, as published with the benchmark (paper, Figure 2; the leaderboard).
GAIA_PROMPT = ("You are a general AI assistant. I will ask you a question. Report your thoughts, "
               "and finish your answer with the following template: FINAL ANSWER: [YOUR FINAL "
               "ANSWER]. YOUR FINAL ANSWER should be a number OR as few words as possible OR a "
               "comma separated list of numbers and/or strings. If you are asked for a number, "
               "don't use comma to write your number neither use units such as $ or percent sign "
               "unless specified otherwise. If you are asked for a string, don't use articles, "
               "neither abbreviations (e.g. for cities), and write the digits in plain text unless "
               "specified otherwise. If you are asked for a comma separated list, apply the above "
               "rules depending of whether the element to be put in the list is a number or a "
               "string.")
FILE_CHARS = 8000   # characters of a task's text file put into its prompt (~2,000 tokens)
HIDDEN_ANSWER = "?"   # the "Final answer" of every task of GAIA's test split
GAIA_SUBMISSION = "submission.jsonl"   # the file of gaia_submission's lines in a run's --out

# --------------------------------------------------------------------------- generated problems

_COUNT_WORDS = {  # singular -> plural, grouped so one list mixes words of one kind
    "animals": [("cow", "cows"), ("pig", "pigs"), ("hen", "hens"), ("goat", "goats"),
                ("duck", "ducks")],
    "fruits": [("apple", "apples"), ("pear", "pears"), ("plum", "plums"), ("lemon", "lemons"),
               ("peach", "peaches")],
    "colors": [("red", "red"), ("blue", "blue"), ("green", "green"), ("yellow", "yellow"),
               ("white", "white")],
}
_COUNT_TEMPLATES = {
    "animals": ("A farm has these animals: {items}. How many {plural} are on the farm?",
                "Here is a list of animals: {items}. How many {plural} are in the list?"),
    "fruits": ("A basket holds: {items}. How many {plural} are in the basket?",
               "Here is a list of fruits: {items}. How many {plural} are in the list?"),
    "colors": ("The balls in a bag are: {items}. How many {plural} balls are in the bag?",
               "Here is a list of ball colors: {items}. How many {plural} balls are there?"),
}

_SYLLABLES = ["zor", "vek", "mil", "bra", "quo", "tan", "lix", "dro", "fen", "sul", "gar", "pim",
              "rok", "nel", "thu", "wex", "jal", "kor", "bim", "yul"]
_LOOKUP_KINDS = [  # (noun, attribute plural, fact template, question template)
    ("planet", "moons", "The planet {name} has {value} moons.", "How many moons does {name} have?"),
    ("castle", "towers", "The castle {name} has {value} towers.",
     "How many towers does {name} have?"),
    ("creature", "legs", "The creature {name} has {value} legs.",
     "How many legs does {name} have?"),
    ("island", "lakes", "The island {name} has {value} lakes.", "How many lakes does {name} have?"),
    ("robot", "arms", "The robot {name} has {value} arms.", "How many arms does {name} have?"),
]

_ARITH_TEMPLATES = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "How much is {a} {op} {b}?")
_ARITH_WORDS = {"+": ("What is {a} plus {b}?", "Add {a} and {b}."),
                "-": ("What is {a} minus {b}?", "Subtract {b} from {a}.")}

_CONVERSIONS = [  # (big unit plural, big unit singular, small unit plural, factor)
    ("hours", "hour", "minutes", 60), ("minutes", "minute", "seconds", 60),
    ("days", "day", "hours", 24),
    ("weeks", "week", "days", 7), ("years", "year", "months", 12),
    ("meters", "meter", "centimeters", 100),
    ("kilometers", "kilometer", "meters", 1000), ("kilograms", "kilogram", "grams", 1000),
    ("dozen", "dozen", "eggs", 12),
]
_CONV_TEMPLATES = ("How many {small} are in {value} {big}?", "Convert {value} {big} to {small}.")


def _heldout_extension(task_type: str) -> list[tuple[str, dict]]:
    """Held-out problems beyond the split's own (module docstring): outside the space that
    split_of divides between train and held-out, so no training task is one of them."""
    if task_type == "arithmetic":
        own = {key for key, _ in _arithmetic_problems()}
        return [(key, p) for key, p in _arithmetic_problems(range(20)) if key not in own]
    return _conversion_problems(range(26, 61))


def _arithmetic_problems(operands: range = range(10)) -> list[tuple[str, dict]]:
    problems = []
    for a in operands:
        for b in operands:
            problems.append((f"arithmetic|{a}+{b}", {"a": a, "op": "+", "b": b, "answer": a + b}))
            if a >= b:
                problems.append((f"arithmetic|{a}-{b}",
                                 {"a": a, "op": "-", "b": b, "answer": a - b}))
    return problems


def _conversion_problems(values: range = range(1, 26)) -> list[tuple[str, dict]]:
    problems = []
    for big, big_one, small, factor in _CONVERSIONS:
        for value in values:
            problems.append((f"conversion|{value} {big}->{small}",
                             {"big": big_one if value == 1 else big, "small": small, "value": value,
                              "answer": value * factor}))
    return problems


def _arithmetic_question(p: dict, rng) -> str:
    templates = _ARITH_TEMPLATES + _ARITH_WORDS[p["op"]]
    return rng.choice(templates).format(**p)


def _conversion_question(p: dict, rng) -> str:
    return rng.choice(_CONV_TEMPLATES).format(**p)


def _counting_problem(rng) -> tuple[str, str, str]:
    kind = rng.choice(sorted(_COUNT_WORDS))
    words = rng.sample(_COUNT_WORDS[kind], 3)
    target, target_plural = words[0]
    count = rng.randint(1, 4)
    others = [rng.choice(words[1:])[0] for _ in range(rng.randint(2, 4))]
    items = [target] * count + others
    rng.shuffle(items)
    question = rng.choice(_COUNT_TEMPLATES[kind]).format(items=", ".join(items),
                                                         plural=target_plural)
    return question, str(count), question  # the key is the question itself


def _entity_name(rng) -> str:
    return "".join(rng.sample(_SYLLABLES, 2)).capitalize()


def _lookup_problem(rng) -> tuple[str, str, str]:
    _, _, fact, ask = rng.choice(_LOOKUP_KINDS)
    k = rng.randint(3, 4)
    names = []
    while len(names) < k:
        name = _entity_name(rng)
        if name not in names:
            names.append(name)
    values = rng.sample(range(2, 10), k)
    target = rng.randrange(k)
    facts = " ".join(fact.format(name=n, value=v) for n, v in zip(names, values))
    question = f"{facts} {ask.format(name=names[target])}"
    return question, str(values[target]), question


def generate_qa(split: str = "train", seed: int = 0, n: int | None = None,
                types: tuple[str, ...] = TASK_TYPES) -> list[Task]:
    """The built-in qa tasks of one split: `n` in total (default 50 per type), types interleaved."""
    check_split(split, allow_all=False)
    per_type = counts_per_type(types, TASK_TYPES, n, DEFAULT_PER_TYPE, "qa task types")
    return interleave({t: _generate_type(t, split, seed, per_type[t]) for t in types}, types)


def _generate_type(task_type: str, split: str, seed: int, count: int) -> list[Task]:
    rng = rng_for("qa", split, seed, task_type)
    items: list[tuple[str, str, str]] = []  # (key, question, answer)
    if task_type in ("arithmetic", "conversion"):
        pool = _arithmetic_problems() if task_type == "arithmetic" else _conversion_problems()
        pool = [(key, p) for key, p in pool if split_of(key) == split]
        rng.shuffle(pool)
        if split == "heldout" and count > len(pool):   # shuffled by an rng of its own, so that
            extension = _heldout_extension(task_type)  # a draw's first tasks are the smaller draw's
            rng_for("qa-extension", split, seed, task_type).shuffle(extension)
            pool += extension
        if count > len(pool):
            raise ValueError(f"qa/{task_type}: asked for {count} {split} tasks, the split holds "
                             f"only {len(pool)} distinct problems")
        ask = _arithmetic_question if task_type == "arithmetic" else _conversion_question
        items = [(key, ask(p, rng), str(p["answer"])) for key, p in pool[:count]]
    else:
        make = _counting_problem if task_type == "counting" else _lookup_problem
        seen: set[str] = set()
        attempts = 0
        while len(items) < count:
            attempts += 1
            if attempts > 1000 * (count + 10):
                raise RuntimeError(f"qa/{task_type}: could not draw {count} distinct {split} "
                                   "problems")
            question, answer, key = make(rng)
            key = f"{task_type}|{key}"
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            items.append((key, question, answer))
    return [Task(id=task_id(f"qa-{task_type}", key), type=task_type, question=question,
                 answer=answer,
                 verifier="final", metadata={"suite": "qa", "split": split, "seed": seed})
            for key, question, answer in items]


# --------------------------------------------------------------------------- JSONL

def load_jsonl(path: str | Path, split: str = "all", seed: int = 0, n: int | None = None,
               file_chars: int = FILE_CHARS, hidden_answers: bool = False) -> list[Task]:
    """Tasks from a JSONL file in GAIA's or the plain {question, answer, type} format (see the
    module docstring for their prompts, for what is an error, and for hidden answers, which load as
    None with `hidden_answers`)."""
    check_split(split)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")

    def gaia_or_plain_task(record, where: str) -> Task:
        task = _task_from_record(record, where)
        if task.verifier == "gaia" and is_hidden_answer(task.answer):
            if not hidden_answers:
                what = "missing field 'Final answer'" if task.answer is None else repr(task.answer)
                raise ValueError(f"{where}: {what}: the answer of task {task.id} is hidden (as in "
                                 f"GAIA's test split), so nothing can score it; `python -m "
                                 f"minskill.rollout --suite {path} --split all` answers such tasks "
                                 f"into OUT/{GAIA_SUBMISSION} for GAIA's leaderboard")
            task.answer = None
        check_task_type(task.type, where)  # now, not after a whole search when its skills are saved
        prompt = task_prompt(task, path.parent, where, file_chars)
        task.prompt = prompt if prompt != task.question else ""
        return task
    return tasks_from_jsonl(path, split, seed, n, "jsonl", gaia_or_plain_task)


def tasks_from_jsonl(path: Path, split: str, seed: int, n: int | None, stream: str,
                     make_task) -> list[Task]:
    """The tasks of a JSONL task file, one a non-blank line, made by `make_task(record, where)`
    (where: FILE:LINE, for its errors). Ids are unique; a task's split is its metadata's "split"
    (from the record) or split_of(id); the tasks of `split` are kept, shuffled by `seed` on the
    random stream `stream` (0: file order), the first n."""
    tasks, seen_ids = [], set()
    for line_number, line in _lines(path):
        where = f"{path}:{line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
        except RecursionError:   # (a RuntimeError: callers that stop on bad input catch ValueError)
            raise ValueError(f"{where}: not readable JSON: nested too deeply (Python's parser "
                             f"gives up at about 1,000 levels)") from None
        task = make_task(record, where)
        if task.id in seen_ids:
            raise ValueError(f"{where}: duplicate task id {task.id!r}")
        seen_ids.add(task.id)
        task_split = task.metadata["split"] if "split" in task.metadata else split_of(task.id)
        if task_split not in ("train", "heldout"):
            raise ValueError(f"{where}: field 'split' must be 'train' or 'heldout', got "
                             f"{task_split!r:.80}")
        task.metadata.update({"suite": str(path), "line": line_number, "split": task_split})
        if split == "all" or task_split == split:
            tasks.append(task)
    if not seen_ids:
        raise ValueError(f"{path}: no tasks (the file is empty)")
    if seed:
        rng_for(stream, split, seed).shuffle(tasks)
    return tasks if n is None else tasks[:n]


def is_hidden_answer(answer) -> bool:
    """Whether a GAIA task's answer is hidden: "?" (GAIA's test split), blank or missing."""
    return answer is None or answer.strip() in ("", HIDDEN_ANSWER)


def _lines(path: Path):
    """(number, text) of each non-blank line. Lines end at LF only (JSON text may hold U+2028, where
    str.splitlines would cut); a UTF-8 byte order mark is dropped; bytes that are not UTF-8 are an
    error naming the line."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text ({error.reason} at byte "
                             f"{error.start + 1} of the line)") from None
        if line.strip():
            yield number, line


def _text_field(record: dict, key: str, where: str, required: bool = True) -> str | None:
    value = record.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}: missing field {key!r}")
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise ValueError(f"{where}: field {key!r} is empty")
    return value


def _task_from_record(record, where: str) -> Task:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "Question" in record:  # GAIA
        question = _text_field(record, "Question", where)
        answer = _text_field(record, "Final answer", where, required=False)   # "?": hidden
        identifier = _text_field(record, "task_id", where,
                                 required=False) or f"gaia-{stable_hash(question):012x}"
        level = _text_field(record, "Level", where, required=False) or "unknown"
        metadata = {"level": level}
        _file_name(record, metadata, where)
        return Task(id=identifier, type=f"level{level}", question=question, answer=answer,
                    verifier="gaia", metadata=metadata)
    if "question" in record:
        question = _text_field(record, "question", where)
        answer = _text_field(record, "answer", where)
        identifier = _text_field(record, "id", where,
                                 required=False) or f"qa-{stable_hash(question):012x}"
        task_type = _text_field(record, "type", where, required=False) or "qa"
        verifier = _text_field(record, "verifier", where, required=False) or "final"
        if verifier not in VERIFIERS:
            raise ValueError(f"{where}: unknown verifier {verifier!r}; known: "
                             f"{', '.join(sorted(VERIFIERS))}")
        metadata = {}
        _file_name(record, metadata, where)
        split = record.get("split")
        if split is not None:
            if split not in ("train", "heldout"):
                raise ValueError(f"{where}: field 'split' must be 'train' or 'heldout', got "
                                 f"{split!r}")
            metadata["split"] = split
        env_spec = {}
        if "choices" in record:
            choices = record["choices"]
            if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
                raise ValueError(f"{where}: field 'choices' must be a list of strings")
            env_spec["choices"] = choices
        return Task(id=identifier, type=task_type, question=question, answer=answer,
                    verifier=verifier,
                    env_spec=env_spec, metadata=metadata)
    raise ValueError(f"{where}: a task needs 'question' and 'answer' (or GAIA's 'Question' and "
                     f"'Final answer'); found keys {sorted(record)[:8]}")


def _file_name(record: dict, metadata: dict, where: str) -> None:
    name = _text_field(record, "file_name", where, required=False)
    if name and name.strip():
        metadata["file_name"] = name


# --------------------------------------------------------------------------- task prompts (GAIA's
# way)

def task_prompt(task: Task, folder: Path, where: str, file_chars: int = FILE_CHARS) -> str:
    """The prompt of a JSONL task: GAIA's system prompt for the gaia verifier, the question, its
    file."""
    parts = [GAIA_PROMPT] if task.verifier == "gaia" else []
    parts.append(task.question)
    if task.metadata.get("file_name"):
        parts.append(_attachment(task.metadata["file_name"], folder, where, task.id, file_chars))
    return "\n\n".join(parts)


def _file_beside(name: str, folder: Path, where: str) -> Path:
    """The file `name` names inside `folder`; ValueError when it would lie outside (the name is
    untrusted)."""
    root = folder.resolve()
    file = (root / name).resolve() if "\x00" not in name and not Path(name).is_absolute() else None
    if file is None or file == root or not file.is_relative_to(root):
        raise ValueError(f"{where}: file_name {name!r} is not a file inside the task file's folder "
                         f"{folder} (a task's file lies beside the JSONL, or in a folder below it)")
    return file


def _read_text(file: Path, max_chars: int) -> tuple[str, bool] | None:
    """(its first max_chars characters, whether there is more) when the file is UTF-8 text without a
    NUL byte as far as read; None otherwise."""
    with open(file, "rb") as f:
        raw, more = f.read(4 * max_chars + 4), bool(f.read(1))   # (a character is at most 4 bytes)
    if b"\x00" in raw:
        return None
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(raw.removeprefix(b"\xef\xbb\xbf"),
                                                              final=not more)
    except UnicodeDecodeError:
        return None
    return text[:max_chars], more or len(text) > max_chars


def _attachment(name: str, folder: Path, where: str, identifier: str, max_chars: int) -> str:
    """The prompt's part about a task's file (see the module docstring)."""
    file = _file_beside(name, folder, where)
    if not file.is_file():
        warnings.warn(f"{where}: task {identifier}: its file {name!r} is not in {folder}; the task "
                      "runs without it",
                      TaskWarning)
        return f"(The question comes with a file, {name}, which is not available.)"
    try:
        text = _read_text(file, max_chars)
    except OSError as error:   # (unreadable: permissions, a special file)
        raise ValueError(
            f"{where}: file_name {name!r}: cannot be read ({error.strerror or error})") from None
    if text is None:
        return (f"Attached file: {name} ({file.stat().st_size:,} bytes; not a text file, so not "
                "shown here).")
    body, cut = text
    note = f"\n(The first {max_chars:,} characters of the file.)" if cut else ""
    return f"Attached file: {name}\n```\n{body.rstrip(chr(10))}\n```{note}"


# --------------------------------------------------------------------------- GAIA's leaderboard

def withhold_hidden(trajectories, hidden: set, write) -> list:
    """The trajectories that can be scored. Those of the `hidden` task ids (answers hidden: GAIA's
    test split) cannot: their gaia_submission lines go to `write(lines)`, which writes them and
    returns the file's path (the evaluation command: OUT/submission.jsonl, whole each run), and a
    line on stderr says so."""
    if not hidden:
        return list(trajectories)
    submission = write(gaia_submission(t for t in trajectories if t.task_id in hidden))
    print(f"{len(hidden)} tasks have hidden answers (GAIA's test split), which nothing here can "
          f"score: they are left out of the scores, and {submission} holds their answers for "
          f"GAIA's leaderboard (it takes every task of the split: --split all)", file=sys.stderr)
    return [t for t in trajectories if t.task_id not in hidden]


def gaia_submission(trajectories) -> list[dict]:
    """The lines GAIA's leaderboard takes for rollouts of GAIA tasks (trajectories.Trajectory:
    task_id, sample, reply, reasoning, error), one a task (sorted by task_id, so that a resumed run
    writes the same file), from its first rollout: {"task_id", "model_answer": the bare answer the
    gaia verifier reads of the reply (gaia_final_answer), "reasoning_trace": the model's reasoning
    and reply}; a rollout that failed answers ""."""
    first: dict = {}
    for traj in trajectories:
        if traj.task_id not in first or traj.sample < first[traj.task_id].sample:
            first[traj.task_id] = traj
    return [{"task_id": t.task_id,
             "model_answer": "" if t.error else gaia_final_answer(t.reply or ""),
             "reasoning_trace": "\n\n".join(filter(None, (t.reasoning, t.reply)))}
            for _, t in sorted(first.items())]
