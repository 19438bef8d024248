"""The characters a JSON string may hold under its schema's `pattern`, `format`, `minLength` and
`maxLength`, for minskill.serve.json_schema's InText frame.

A pattern (and each served format, written here as one) is parsed into a regular expression over
code points and compiled by Thompson's construction into an NFA, made deterministic lazily: a DFA
state is a set of NFA states, numbered as it is first met, and its moves are disjoint ranges of code
points. A TextRule is the product of a string's DFAs (its pattern and its format) with a count of
characters (for the length bounds), and answers what InText asks: the state after a character, and
cost(state): the fewest bytes that still close the string (its closing quote included; None: it
cannot close), by Dijkstra over the product, each move costing the bytes of its cheapest character.

Python's `re` (what jsonschema validates `pattern` with) searches: an unanchored pattern matches
anywhere, so `abc` means "any text holding abc". `\\d`, `\\w` and `\\s` match Unicode characters
there; the rule uses their ASCII part, and their negations (and `[^...]` around them) leave out all
of non-ASCII, so whatever the rule allows, `re` matches. Refused, by name: backreferences,
lookarounds, `\\b`, inline flags, and `^` / `$` anywhere but at the start and end of a branch.
"""
from __future__ import annotations

import heapq
import re
from functools import lru_cache

MAX_CODE = 0x10FFFF
ALL = ((0, MAX_CODE),)
MAX_NFA_STATES = 20_000        # a pattern's size after {m,n} is unrolled
# a pattern's DFA is built whole when the pattern is compiled (at the request, a 400 past these):
# the largest served format (hostname) has 856 states and 2.8M steps of work, an email 454 and 0.9M,
# a date-time 86 and 2k, a uuid 37; patterns users write (phone, slug, url) a few dozen states
MAX_DFA_STATES = 4_096         # states (sets of NFA states) of the DFA
MAX_DFA_WORK = 6_000_000       # NFA edges and states read while the DFA's moves are found
ESCAPES = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F, 0x62: 0x08, 0x66: 0x0C, 0x6E: 0x0A, 0x72: 0x0D,
           0x74: 0x09}         # the byte after a backslash -> the character it writes (no \\u)
_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
_DATE = (r"(\d{3}[1-9]|\d\d[1-9]\d|\d[1-9]\d\d|[1-9]\d{3})"      # (no year 0: Python has none)
         r"-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)"
         r"|02-(0[1-9]|1\d|2[0-8]))")          # (no 29 February: not every year has one)
_HEX4 = "[0-9a-fA-F]{1,4}"
_LABEL = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DURATION_TIME = r"T(\d{1,4}H(\d{1,4}M)?(\d{1,4}S)?|\d{1,4}M(\d{1,4}S)?|\d{1,4}S)"
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


def _ipv6() -> str:
    """Eight groups, or fewer around one `::`."""
    full = f"{_HEX4}(:{_HEX4}){{7}}"
    short = [("" if k == 0 else f"{_HEX4}(:{_HEX4}){{{k - 1}}}") + "::"
             + ("" if j == 0 else f"{_HEX4}(:{_HEX4}){{{j - 1}}}")
             for k in range(8) for j in range(8 - k)]
    return "|".join([full, *short])


# OpenAI strict mode's formats, each as the regex of the texts written for it (a part of what the
# format allows: a date-time with a T and an offset, an IPv6 address without an IPv4 tail, a
# hostname of at most four labels so it stays under 253 characters, a duration's numbers of at most
# four digits so Python's timedelta holds it, ...)
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "duration": rf"P(\d{{1,4}}W|\d{{1,4}}Y(\d{{1,4}}M)?(\d{{1,4}}D)?({_DURATION_TIME})?"
                rf"|\d{{1,4}}M(\d{{1,4}}D)?({_DURATION_TIME})?|\d{{1,4}}D({_DURATION_TIME})?"
                rf"|{_DURATION_TIME})",
    "email": rf"[A-Za-z0-9_+-]+(\.[A-Za-z0-9_+-]+)*@{_LABEL}(\.{_LABEL}){{0,2}}\.[A-Za-z]{{2,24}}",
    "hostname": rf"({_LABEL}\.){{0,3}}[A-Za-z]([A-Za-z0-9-]{{0,59}}[A-Za-z0-9])?",
    "ipv4": rf"{_OCTET}(\.{_OCTET}){{3}}",
    "ipv6": _ipv6(),
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}


class PatternError(ValueError):
    """A pattern outside what is served, or not a regex."""


# ---- the rule InText reads with ------------------------------------------------------------------
class TextRule:
    """A string's DFAs (pattern, format) and length bounds. A state is (the DFAs' states, the
    characters written, counted up to the bound that needs it)."""

    def __init__(self, regexes: tuple, min_chars: int, max_chars: int | None):
        self.regexes, self.min_chars, self.max_chars = regexes, min_chars, max_chars
        self.cap = max_chars if max_chars is not None else min_chars
        self.start = (tuple(r.start for r in regexes), 0)
        self._moves: dict = {}
        self._costs: dict = {}

    def moves(self, state) -> list:
        """[(low, high, next state)]: the characters state may read, in disjoint ranges."""
        out = self._moves.get(state)
        if out is None:
            out = self._moves[state] = self._product(state)
        return out

    def _product(self, state) -> list:
        dfas, count = state
        if self.max_chars is not None and count >= self.max_chars:
            return []
        after = count + 1 if self.max_chars is not None else min(count + 1, self.cap)
        ranges = [(0, MAX_CODE, ())]
        for regex, at in zip(self.regexes, dfas):
            ranges = [(max(lo, lo2), min(hi, hi2), targets + (to,))
                      for lo, hi, targets in ranges for lo2, hi2, to in regex.moves(at)
                      if max(lo, lo2) <= min(hi, hi2)]
        return [(lo, hi, (targets, after)) for lo, hi, targets in ranges]

    def accepts(self, state) -> bool:
        dfas, count = state
        return count >= self.min_chars and all(r.accepts(at) for r, at in zip(self.regexes, dfas))

    def step(self, state, code: int):
        """The state after character `code`, None where it cannot be followed by a closed string."""
        for lo, hi, after in self.moves(state):
            if lo <= code <= hi:
                return after if self.cost(after) is not None else None
        return None

    def cost_through(self, state, low: int, high: int) -> int | None:
        """The fewest bytes that close the string after a writable character in [low, high] (that
        character's own bytes not counted), None where none can."""
        best = None
        for lo, hi, after in self.moves(state):
            if max(lo, low) <= min(hi, high) and cheapest(max(lo, low), min(hi, high)):
                cost = self.cost(after)
                if cost is not None and (best is None or cost < best):
                    best = cost
        return best

    def cost(self, state) -> int | None:
        """The fewest bytes from `state` to the closing quote, that quote included."""
        if state not in self._costs:
            self._costs[state] = self._dijkstra(state)
        return self._costs[state]

    def _dijkstra(self, origin) -> int | None:
        done, queue = set(), [(0, 0, origin)]
        tie = 0
        while queue:
            spent, _, state = heapq.heappop(queue)
            if state in done:
                continue
            if self.accepts(state):
                return spent + 1
            done.add(state)
            for lo, hi, after in self.moves(state):
                price = cheapest(lo, hi)
                if price and after not in done:
                    tie += 1
                    heapq.heappush(queue, (spent + price, tie, after))
        return None


@lru_cache(maxsize=4096)
def cheapest(low: int, high: int) -> int | None:
    """The fewest bytes a JSON string spends on a character in [low, high] (None: none can be
    written: control characters other than \\b\\f\\n\\r\\t need \\u, which InText does not
    write, and surrogates are not characters)."""
    best = None
    for lo, hi, size in _WRITABLE:
        if max(lo, low) <= min(hi, high) and (best is None or size < best):
            best = size
    return best


_WRITABLE = [(0x08, 0x0A, 2), (0x0C, 0x0D, 2), (0x20, 0x21, 1), (0x22, 0x22, 2), (0x23, 0x5B, 1),
             (0x5C, 0x5C, 2), (0x5D, 0x7F, 1), (0x80, 0x7FF, 2), (0x800, 0xD7FF, 3),
             (0xE000, 0xFFFF, 3), (0x10000, MAX_CODE, 4)]


# ---- a regex: parsed, then an NFA, made deterministic as it is read ------------------------------
@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> "Regex":
    """The Regex of the texts Python's re.search(pattern, text) finds a match in (module doc)."""
    try:
        re.compile(pattern)                      # (what re refuses, jsonschema cannot check either)
    except re.error as error:
        raise PatternError(f"the pattern is not a regex Python reads: {error}")
    parser = _Parser(pattern)
    branches = parser.branches()
    nfa = _Nfa()
    begin, end = nfa.state(), nfa.state()
    for anchored_start, tree, anchored_end in branches:
        parts = ([] if anchored_start else [("star", ("set", ALL))]) + [tree] \
            + ([] if anchored_end else [("star", ("set", ALL))])
        start, stop = nfa.build(("cat", parts))
        nfa.eps[begin].append(start)
        nfa.eps[stop].append(end)
    return Regex(nfa, begin, end)


class Regex:
    """A pattern's DFA, built whole (PatternError where it would pass MAX_DFA_STATES states or
    MAX_DFA_WORK steps: nested or overlapping repeats, as `(a|b)*a(a|b){15}`, grow it without
    bound, and a request must not build that while its reply is decoded)."""

    def __init__(self, nfa: "_Nfa", begin: int, end: int):
        self.nfa, self.end = nfa, end
        self.sets: list[frozenset] = []
        self.ids: dict[frozenset, int] = {}
        self._moves: dict[int, list] = {}
        self.work = 0
        self.start = self._id(nfa.closure({begin}))
        for at in range(MAX_DFA_STATES):
            if at == len(self.sets):
                break
            self.moves(at)
        if len(self.sets) > MAX_DFA_STATES or self.work > MAX_DFA_WORK:
            raise PatternError(f"the pattern is too complex: its automaton passes "
                               f"{MAX_DFA_STATES} states or {MAX_DFA_WORK} steps (nested or "
                               "overlapping repeats); not served")

    def _id(self, states: frozenset) -> int:
        if states not in self.ids:
            self.ids[states] = len(self.sets)
            self.sets.append(states)
        return self.ids[states]

    def accepts(self, at: int) -> bool:
        return self.end in self.sets[at]

    def moves(self, at: int) -> list:
        """[(low, high, DFA state)], disjoint, for the characters DFA state `at` reads."""
        if at not in self._moves:
            edges = [(lo, hi, to) for s in self.sets[at] for ranges, to in self.nfa.edges[s]
                     for lo, hi in ranges]
            self.work += len(self.sets[at]) + len(edges)
            if self.work > MAX_DFA_WORK:
                return []                 # (the constructor refuses the pattern)
            cuts = sorted({lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
            out = []
            for lo, nxt in zip(cuts, cuts[1:]):
                targets = {to for a, b, to in edges if a <= lo and nxt - 1 <= b}
                if targets:
                    reached = self.nfa.closure(targets)
                    self.work += len(edges) + len(reached)
                    out.append((lo, nxt - 1, self._id(reached)))
            self._moves[at] = out
        return self._moves[at]


class _Nfa:
    def __init__(self):
        self.edges: list[list] = []      # per state: [(ranges, target)]
        self.eps: list[list] = []        # per state: targets without a character

    def state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise PatternError(f"the pattern unrolls to over {MAX_NFA_STATES} states: not served")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def closure(self, states) -> frozenset:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def build(self, tree) -> tuple[int, int]:
        """(start, end) states of a fragment that reads `tree` (Thompson's construction)."""
        kind = tree[0]
        start = self.state()
        if kind == "set":
            end = self.state()
            self.edges[start].append((tree[1], end))
            return start, end
        if kind in ("cat", "alt"):
            end = start if kind == "cat" else self.state()
            for part in tree[1]:
                a, b = self.build(part)
                self.eps[end if kind == "cat" else start].append(a)
                if kind == "cat":
                    end = b
                else:
                    self.eps[b].append(end)
            return start, end
        if kind == "star":
            a, b = self.build(tree[1])
            self.eps[start] += [a]
            self.eps[b] += [start]
            return start, start
        _, part, low, high = tree                       # ("rep", part, m, n or None)
        parts = [part] * low + ([("star", part)] if high is None else
                                [("alt", [("cat", []), part])] * (high - low))
        a, b = self.build(("cat", parts))
        self.eps[start].append(a)
        return start, b


# ---- the parser: a pattern into a tree of ("set", ranges), ("cat" | "alt", [trees]),
# ("star", tree), ("rep", tree, m, n) -------------------------------------------------------------
_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))
_NON_ASCII = ((0x80, MAX_CODE),)
# class escape -> (what the rule allows, all that re may match with it): the allowed part is inside
# what re matches, so a negation takes the complement of the second
_CLASSES = {"d": (_DIGIT, _DIGIT + _NON_ASCII), "w": (_WORD, _WORD + _NON_ASCII),
            "s": (_SPACE, ((0x09, 0x0D), (0x1C, 0x20)) + _NON_ASCII)}
_CHAR_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07, "0": 0x00}


class _Parser:
    def __init__(self, pattern: str):
        self.text, self.at = pattern, 0

    def fail(self, what: str):
        raise PatternError(f"{what} at character {self.at} of the pattern is not served")

    def peek(self, n: int = 1) -> str:
        return self.text[self.at:self.at + n]

    def take(self) -> str:
        if self.at >= len(self.text):
            raise PatternError("the pattern ends too soon")
        self.at += 1
        return self.text[self.at - 1]

    def branches(self) -> list:
        """[(anchored at the start, tree, anchored at the end)] of the top-level alternatives."""
        out = []
        while True:
            start = self.peek() == "^" and bool(self.take())
            tree = self.sequence()
            end = self.peek() == "$" and bool(self.take())
            out.append((start, tree, end))
            if self.at == len(self.text):
                return out
            if self.take() != "|":
                self.fail("'^', '$' or ')' here")

    def alternation(self):
        options = [self.sequence()]
        while self.peek() == "|":
            self.take()
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def sequence(self):
        parts = []
        while self.at < len(self.text) and self.peek() not in "|)":
            if self.peek() == "$" and self.text[self.at + 1:self.at + 2] in ("", "|"):
                break                               # (the end anchor of a top-level branch)
            parts.append(self.quantified(self.atom()))
        return ("cat", parts)

    def atom(self):
        char = self.take()
        if char == "(":
            if self.peek(2) == "?:":
                self.at += 2
            elif self.peek(3) == "?P<" and ">" in self.text[self.at:]:     # a named group
                self.at = self.text.index(">", self.at) + 1
            elif self.peek() == "?":
                self.fail("a group of the form (?...) other than (?:...) and (?P<name>...)")
            tree = self.alternation()
            if self.take() != ")":
                self.fail("an unclosed group")
            return tree
        if char == "[":
            return ("set", self.char_class())
        if char == ".":
            return ("set", _minus(ALL, ((0x0A, 0x0A),)))
        if char == "\\":
            return ("set", self.escape()[0])
        if char in "^$":
            self.fail(f"{char!r} inside the pattern")
        if char in "*+?)":
            self.fail(f"{char!r} with nothing to repeat")
        return ("set", ((ord(char), ord(char)),))

    def quantified(self, tree):
        """`tree` with the quantifier after it, if one is (re refuses a second one)."""
        char = self.peek()
        if char in ("*", "+", "?"):
            self.take()
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        elif char == "{" and (counted := self._counted()) is not None:
            low, high = counted
        else:
            return tree
        if self.peek() == "?":                   # lazy: the same texts match in full
            self.take()
        elif self.peek() == "+":
            self.fail("a possessive quantifier")
        return ("rep", tree, low, high)

    def _counted(self):
        """{m}, {m,} or {m,n} at the cursor (read), or None when `{` is a plain character."""
        close = self.text.find("}", self.at)
        body = self.text[self.at + 1:close] if close > 0 else ""
        low, comma, high = body.partition(",")
        low = low or ("0" if comma else "")             # {,n}: Python reads {0,n}
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        self.at = close + 1
        low_n, high_n = int(low), (int(high) if high else None if comma else int(low))
        if high_n is not None and high_n < low_n:
            self.fail(f"{{{body}}} (its maximum below its minimum)")
        return low_n, high_n

    def escape(self) -> tuple:
        """(allowed, all re may match) of the escape after a backslash."""
        char = self.take()
        if char.lower() in _CLASSES:
            allowed, widest = _CLASSES[char.lower()]
            return (allowed, widest) if char.islower() else (_minus(ALL, widest),
                                                             _minus(ALL, allowed))
        if char in _CHAR_ESCAPES:
            code = _CHAR_ESCAPES[char]
        elif char in "xu":
            digits = self.text[self.at:self.at + (2 if char == "x" else 4)]
            if len(digits) != (2 if char == "x" else 4) or any(
                    d not in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"\\{char} without its hex digits")
            self.at += len(digits)
            code = int(digits, 16)
        elif char.isalnum():
            self.fail(f"the escape \\{char}")
        else:
            code = ord(char)
        return ((code, code),), ((code, code),)

    def char_class(self) -> tuple:
        negated = self.peek() == "^" and bool(self.take())
        allowed, widest, first = [], [], True
        while first or self.peek() != "]":
            first = False
            char = self.take()
            if char == "\\":
                low, high = self.escape()
                if len(low) == 1 and low == high and low[0][0] == low[0][1] \
                        and self.peek() == "-" and self.peek(2) != "-]":
                    start = low[0][0]
                else:
                    allowed += low
                    widest += high
                    continue
            else:
                start = ord(char)
            if self.peek() == "-" and self.peek(2)[1:] not in ("]", ""):
                self.take()
                end_char = self.take()
                end = self.escape()[0][0][0] if end_char == "\\" else ord(end_char)
                if end < start:
                    self.fail("a character range that runs backwards")
                allowed.append((start, end))
                widest.append((start, end))
            else:
                allowed.append((start, start))
                widest.append((start, start))
        self.take()
        allowed, widest = _union(allowed), _union(widest)
        return _minus(ALL, widest) if negated else allowed


def _union(ranges) -> tuple:
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _minus(ranges, taken) -> tuple:
    """The code points of `ranges` outside `taken`."""
    out, taken = [], _union(taken)
    for lo, hi in _union(ranges):
        for t_lo, t_hi in taken:
            if t_hi < lo or t_lo > hi:
                continue
            if t_lo > lo:
                out.append((lo, t_lo - 1))
            lo = t_hi + 1
        if lo <= hi:
            out.append((lo, hi))
    return tuple(out)
