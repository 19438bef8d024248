"""One rollout's record (`Trajectory`), its JSONL file, and the two pieces both kinds of rollout
build it with: the messages under a skill (`with_system`) and a failed request's `.error` text.
Trajectories are appended to a run's trajectories.jsonl as they finish; `load_trajectories` reads
them back (docs/rollouts.md)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from minskill.files import read_jsonl


@dataclass
class Trajectory:
    task_id: str
    task_type: str
    messages: list[dict]                 # the conversation (system prompt, user turns, model
                                         # replies)
    actions: list[str] = field(default_factory=list)        # multi-turn: the parsed actions sent to
                                                            # the env
    observations: list[str] = field(default_factory=list)   # multi-turn: reset() observation, then
                                                            # one per step
    reply: str = ""                      # single-turn: the model's answer; multi-turn: its last raw
                                         # reply
    reward: float = 0.0
    success: bool = False
    steps: int = 0                       # model turns (1 for a single-turn task)
    nothing_happens: int = 0             # steps answered with exactly "Nothing happens."
    error: str | None = None             # HTTP / verifier / environment failure; None when the run
                                         # was clean
    sample: int = 0                      # index of this rollout among the n of its task
    reasoning: str = ""                  # what the model thought before its answer
                                         # (client.split_reasoning), kept
    #                                      for the report; never scored (multi-turn: each step's,
    # blank-line apart)
    trimmed: int = 0                     # multi-turn: prompts the task model refused as too long
                                         # for its context,
    #                                      each sent again with half the past exchanges (module
    # docstring)
    history_kept: int | None = None      # the past exchanges its prompts were cut to by those
                                         # refusals (None: never)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict) -> "Trajectory":
        known = {f.name for f in fields(cls)}
        missing = {"task_id", "task_type", "messages"} - set(record)
        if missing:
            raise ValueError(f"trajectory record lacks field(s) {sorted(missing)}: "
                             f"{str(record)[:200]}")
        return cls(**{k: v for k, v in record.items() if k in known})


def load_trajectories(path) -> list[Trajectory]:
    """Read a trajectories JSONL file (see read_jsonl); a record that is not a trajectory is an
    error naming the file and line."""
    out = []
    for lineno, record in read_jsonl(path):
        try:
            out.append(Trajectory.from_json(record))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    return out


def with_system(system: str, messages: list[dict]) -> list[dict]:
    """`messages` after `system` as the system message; none when there is no skill (""): the chat
    template's own default applies."""
    return ([{"role": "system", "content": system}] if system else []) + messages


def chat_error(result) -> str:
    """A failed request (an exception) as a trajectory's `.error`."""
    return f"{type(result).__name__}: {result}"
