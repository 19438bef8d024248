"""A teacher prompt that its server refuses as too long for its context: recognised, trimmed and asked again.

A teacher behind llama.cpp with 2,048 tokens per slot answers a 2,103-token prompt with HTTP 400; that one prompt
must not end a MASA run. `ask_fitting` wraps one teacher step (minskill.masa.search.ask_teacher): its prompt is
a builder of a trim level, prompt(trim=0) the whole prompt; a refusal for its length (`is_context_refusal`)
builds it again at the next level and asks again. Each builder shows fewer of its lists at each level (`trimmed`:
the history first, then the examples) and raises NothingToTrim when it has nothing left to drop; then the step is
skipped and logged as a reply that does not parse is.

    level k of a list of n items shows its first  n >> k  items  (k = 0: all; after n.bit_length() levels: none)

This is the machinery around a teacher call, as the client's retries are: at trim level 0 (every prompt that fits)
the prompt is the builder's whole prompt and the step is ask_teacher's, unchanged.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

from minskill.masa.teacher import TeacherReplyError
from minskill.serve.caching import BudgetExhausted
from minskill.serve.client import ChatError
from minskill.tasks.base import (CONTEXT_REFUSAL,  # noqa: F401 (the agent loop's too)
                                 is_context_refusal)


class NothingToTrim(Exception):
    """A prompt builder was asked for a trim level past its last: the prompt cannot be made shorter."""


def trim_levels(items: list) -> int:
    """How many trim levels `items` has before none of it is left (`trimmed` halves it at each)."""
    return len(items).bit_length()


def trimmed(items: list, trim: int, *more: list) -> list:
    """The first of `items` a prompt shows at trim level `trim`: all at 0, half as many (rounded down) at each
    level, none after `trim_levels(items)`. Past that come the levels of the lists in `more` (trimmed after it, by
    the caller); past theirs too, NothingToTrim: nothing is left to drop."""
    if trim > trim_levels(items) + sum(map(trim_levels, more)):
        raise NothingToTrim(f"trim level {trim}: nothing left to drop")
    return items[:len(items) >> trim]


def ask_fitting(ask_teacher: Callable[..., Any], teacher, prompt: Callable[..., list[dict]],
                parse: Callable[[str], Any], *, what: str, on_skip: Callable[[dict], None] | None = None,
                on_trim: Callable[[dict], None] | None = None, **kwargs):
    """ask_teacher(teacher, prompt(trim=0), parse, what=, on_skip=, **kwargs): one teacher step (the search's
    ask_teacher, passed in), asked again on prompt(trim=1), (trim=2), ... while the server refuses the prompt as
    too long; `on_trim` gets {"what",
    "trim", "errors"} once one fits. When nothing is left to drop (NothingToTrim) the step is skipped as a reply
    that does not parse is: `on_skip` gets {"what", "attempts", "errors", "last_reply", "reason": "prompt too
    long"}, and None is returned. A budget spent before the retry of a reply that did not parse skips the step
    too ("reason": "budget spent": those replies were paid for), then BudgetExhausted passes on, as any other
    failure does."""
    refusals = []
    for trim in itertools.count():
        try:
            messages = prompt(trim=trim)
        except NothingToTrim:
            break
        asked = RecordingTeacher(teacher)
        try:
            result = ask_teacher(asked, messages, parse, what=what, on_skip=on_skip, **kwargs)
        except ChatError as error:
            if not is_context_refusal(error):
                raise
            chars = sum(len(m["content"]) for m in messages)   # a retry's conversation holds more
            refusals.append(f"trim level {trim} (a prompt of {chars} characters): HTTP 400: {error.message}"[:600])
            continue
        except BudgetExhausted:
            if asked.replies and on_skip is not None:
                on_skip({"what": what, "attempts": len(asked.replies), "last_reply": asked.replies[-1][:1000],
                         "errors": [reply_error(parse, r) for r in asked.replies], "reason": "budget spent"})
            raise
        if refusals and on_trim is not None:
            on_trim({"what": what, "trim": trim, "errors": refusals})
        return result
    if on_skip is not None:
        on_skip({"what": what, "attempts": len(refusals), "errors": refusals, "last_reply": "",
                 "reason": "prompt too long"})
    return None


class RecordingTeacher:
    """A teacher that keeps its replies (ask_fitting: those of a step that a spent budget cut short)."""

    def __init__(self, teacher):
        self.teacher, self.replies = teacher, []

    def chat(self, messages, **kwargs):
        result = self.teacher.chat(messages, **kwargs)
        self.replies.append(result.texts[0] if result.texts else "")
        return result


def reply_error(parse: Callable[[str], Any], reply: str) -> str:
    """Why `reply` did not parse (the error ask_teacher recorded for it)."""
    try:
        parse(reply)
    except TeacherReplyError as e:
        return str(e)[:500]
    return ""
