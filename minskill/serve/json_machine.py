"""The state machine minskill.serve.json_schema compiles a schema into: its nodes (what a value may
be), the frames that read a reply's bytes, and start / advance / close_cost.

A State is a pushdown automaton's set of stacks. A stack is a tuple of frames, the last on top: the
top frame reads the next byte, the frames under it are what follows it (a continuation: "after this
string, whitespace, then the rest of the array"). A frame either reads bytes (a literal's next byte,
a string's content, a number's digits, whitespace) or only expands (Expect: "a value of this node,
not begun"; the positions between an array's items or an object's properties), into the frames that
may come next. A state holds every way the bytes read so far can go on (anyOf's branches, a number
that may end or continue), each expanded until its top frame reads bytes, so a byte is checked
against the top frames only.

A value no finite reply can reach (a property whose recursion never ends, the schema false) is a
node of min_bytes infinity: the frames never offer it, so a reply never begins what it cannot close.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache

from minskill.serve.json_strings import ESCAPES, TextRule

MAX_INDENT = 20        # spaces or tabs after a newline (llama.cpp's bound)
MAX_DIGITS = 15        # digits before the point, and after it


# ---- the nodes: what a value may be --------------------------------------------------------------
# A node says how its value begins (begin(): the stack fragments that replace an Expect of it) and
# how few bytes it takes (min_bytes, worked out once; infinity: no finite value). Nodes compare by
# identity: a state hashes fast however big its schema.
class SchemaNode:
    min_bytes: int


@dataclass(eq=False)
class Literal(SchemaNode):
    """One fixed text: a JSON value of enum or const, true, false, null."""
    text: bytes

    @cached_property
    def min_bytes(self):
        return len(self.text)

    def begin(self):
        return [(Lit(self.text),)]


class Nothing(SchemaNode):
    """No value (the schema false; a recursive $ref past RECURSION_DEPTH)."""
    min_bytes = math.inf

    def begin(self):
        return []


NOTHING = Nothing()


@dataclass(eq=False)
class AnyOf(SchemaNode):
    options: tuple

    @cached_property
    def min_bytes(self):
        return min(o.min_bytes for o in self.options)

    def begin(self):
        return [fragment for option in self.options if option.min_bytes < math.inf
                for fragment in option.begin()]


@dataclass(eq=False)
class String(SchemaNode):
    """`rule` (json_strings.TextRule) where a pattern or format says which characters; else any,
    min_chars to max_chars of them."""
    min_chars: int
    max_chars: int | None
    rule: TextRule | None = None

    @cached_property
    def min_bytes(self):
        if self.rule is None:
            return 2 + self.min_chars
        cost = self.rule.cost(self.rule.start)
        return math.inf if cost is None else 1 + cost

    def begin(self):
        if self.rule is not None:
            return [then(Lit(b'"'), InText(self, self.rule.start))]
        return [then(Lit(b'"'), InString(self, 0, ()))]


@dataclass(eq=False)
class Number(SchemaNode):
    integer: bool
    minimum: Fraction | int | None
    maximum: Fraction | int | None
    low_open: bool = False          # exclusiveMinimum: the minimum itself is not allowed
    high_open: bool = False
    step: int | None = None         # multipleOf (integers)

    @cached_property
    def min_bytes(self):
        return number_cost(self, b"")

    def begin(self):
        return [(InNumber(self, b""),)]


@dataclass(eq=False)
class Array(SchemaNode):
    """`prefix`: the first items' nodes (prefixItems); `items`: the later ones' (None: none)."""
    items: SchemaNode | None
    min_items: int
    max_items: int | None
    prefix: tuple = ()

    def item(self, index: int) -> SchemaNode | None:
        return self.prefix[index] if index < len(self.prefix) else self.items

    @cached_property
    def min_bytes(self):
        return 1 + ArrayNext(self, 0).min_bytes()

    def begin(self):
        return [then(Lit(b"["), SPACE, ArrayNext(self, 0))]


@dataclass(eq=False)
class Property:
    key: bytes            # the name, written as JSON ("name" with its quotes)
    value: SchemaNode
    required: bool

    @cached_property
    def min_bytes(self):
        return len(self.key) + 1 + self.value.min_bytes       # key, ":", value


@dataclass(eq=False)
class Object(SchemaNode):
    """`properties` in their order; `extra`: the value of any other key (None: no other key);
    `listed`: the names of `properties` (UTF-8), which another key may not be."""
    properties: tuple
    extra: SchemaNode | None
    min_properties: int = 0
    max_properties: int | None = None
    listed: frozenset = frozenset()

    @cached_property
    def min_bytes(self):
        return 1 + ObjectNext(self, 0, 0).min_bytes()

    def counted(self, count: int) -> int:
        """The count after one more property, kept only as far as min/maxProperties read it (else
        0 or 1: whether a comma comes next), so that states repeat and their masks are cached."""
        return min(count + 1, max(self.min_properties, self.max_properties or 0, 1))

    @cached_property
    def keyed(self) -> bool:
        """Other keys are read by InKey (checked against the listed names and, where
        minProperties counts them, against each other), else as any string."""
        return self.extra is not None and bool(self.listed or self.min_properties)

    def begin(self):
        return [then(Lit(b"{"), SPACE, ObjectNext(self, 0, 0))]


class AnyValue(SchemaNode):
    """Any JSON value (the schema `{}` or true; the values of response_format json_object)."""
    min_bytes = 1                                     # the number 0

    def begin(self):
        return [fragment for option in _ANY_OPTIONS for fragment in option.begin()]


ANY_VALUE = AnyValue()
_ANY_OPTIONS = (Object((), ANY_VALUE), Array(ANY_VALUE, 0, None), String(0, None),
                Number(False, None, None),
                Literal(b"true"), Literal(b"false"), Literal(b"null"))
JSON_OBJECT = _ANY_OPTIONS[0]                       # response_format {"type": "json_object"}


# ---- the frames: where in a value the reply is ---------------------------------------------------
# A frame that reads bytes has eat(byte) -> the fragments that replace it (an empty one: it is
# done); a frame that may end or expand without reading has moves() -> those fragments. min_bytes():
# the fewest bytes that complete it. Frames are values (frozen dataclasses), so a state is a set and
# a mask can be cached per state.
def then(*frames) -> tuple:
    """A stack fragment that runs `frames` in reading order (the first on top)."""
    return tuple(reversed(frames))


@dataclass(frozen=True, slots=True)
class Expect:
    """A value of `node`, not begun."""
    node: SchemaNode
    reads = False

    def moves(self):
        return self.node.begin() if self.node.min_bytes < math.inf else []

    def min_bytes(self):
        return self.node.min_bytes


@dataclass(frozen=True, slots=True)
class Lit:
    text: bytes
    at: int = 0
    reads = True

    def eat(self, byte: int):
        if self.text[self.at] != byte:
            return []
        return [()] if self.at + 1 == len(self.text) else [(Lit(self.text, self.at + 1),)]

    def moves(self):
        return []

    def min_bytes(self):
        return len(self.text) - self.at


@dataclass(frozen=True, slots=True)
class Space:
    """Whitespace between tokens: "", " ", or a newline and up to MAX_INDENT spaces or tabs."""
    indent: int = -1        # -1: nothing read yet; else the spaces or tabs read after the newline
    reads = True

    def eat(self, byte: int):
        if self.indent < 0:
            return [()] if byte == 0x20 else [(Space(0),)] if byte == 0x0A else []
        more = byte in (0x20, 0x09) and self.indent < MAX_INDENT
        return [(Space(self.indent + 1),)] if more else []

    def moves(self):
        return [()]

    def min_bytes(self):
        return 0


SPACE = Space()
_CONTINUATION = frozenset(range(0x80, 0xC0))
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPED = frozenset(b'"\\/bfnrtu')
# a \u escape's first digit under minLength: equal to _HEX but its own object (rest is read by `is`)
_U_FIRST = frozenset(b"0123456789abcdefABCDEF")
_HEX_BELOW_8 = frozenset(b"01234567")


def _utf8_rest(lead: int) -> tuple | None:
    """The bytes a UTF-8 character needs after its lead byte (a set per byte), None for no lead
    byte."""
    if 0xC2 <= lead <= 0xDF:
        return (_CONTINUATION,)
    second = {0xE0: range(0xA0, 0xC0), 0xED: range(0x80, 0xA0), 0xF0: range(0x90, 0xC0),
              0xF4: range(0x80, 0x90)}.get(lead)
    if 0xE0 <= lead <= 0xEF:
        return (frozenset(second) if second else _CONTINUATION, _CONTINUATION)
    if 0xF0 <= lead <= 0xF4:
        return (frozenset(second) if second else _CONTINUATION, _CONTINUATION, _CONTINUATION)
    return None


_UTF8_REST = {lead: _utf8_rest(lead) for lead in range(0x80, 0x100)}


@dataclass(frozen=True, slots=True)
class InString:
    """Inside a string, after its opening quote. `rest`: the bytes the current character still needs
    (an escape's, a UTF-8 character's), a set of allowed bytes each; `chars`: characters written,
    counted only under maxLength or up to minLength (else 0, so the state does not change along the
    string and its mask is cached). Under minLength a \\u escape writes no surrogate: a pair is two
    escapes but one character."""
    node: String
    chars: int
    rest: tuple
    reads = True

    def eat(self, byte: int):
        node = self.node
        if self.rest:
            if byte not in self.rest[0]:
                return []
            rest = self.rest[1:]
            if self.rest[0] is _ESCAPED and byte == 0x75:
                rest = (_U_FIRST, _HEX, _HEX, _HEX) if node.min_chars else (_HEX,) * 4
            elif self.rest[0] is _U_FIRST and byte in b"dD":       # (no surrogate)
                rest = (_HEX_BELOW_8, _HEX, _HEX)
            return [(InString(node, self.chars, rest),)]
        if byte == 0x22:
            return [()] if self.chars >= node.min_chars else []
        if byte < 0x20 or (node.max_chars is not None and self.chars >= node.max_chars):
            return []
        rest = (_ESCAPED,) if byte == 0x5C else () if byte < 0x80 else _UTF8_REST[byte]
        if rest is None:
            return []
        chars = self.chars + 1 if node.max_chars is not None else min(self.chars + 1,
                                                                       node.min_chars)
        return [(InString(node, chars, rest),)]

    def moves(self):
        return []

    def min_bytes(self):
        return len(self.rest) + 1 + max(self.node.min_chars - self.chars, 0)


@dataclass(frozen=True, slots=True)
class InText:
    """Inside a string whose characters a TextRule checks (pattern, format): `at` is the rule's
    state, `pending` the bytes of a character begun (a UTF-8 character's first bytes, or an
    escape's). A byte is read only where some character it begins leads to a string that can close;
    a \\u escape writes no surrogate."""
    node: String
    at: tuple
    pending: bytes = b""
    reads = True

    def eat(self, byte: int):
        rule, pending = self.node.rule, self.pending
        if pending == b"\\":
            if byte == 0x75:                                      # \u
                return self._begun(b"\\u")
            return self._after(rule.step(self.at, ESCAPES[byte]) if byte in ESCAPES else None)
        if pending[:2] == b"\\u":
            return self._begun(pending + bytes((byte,))) if byte in _HEX else []
        if pending:
            if byte not in _UTF8_REST[pending[0]][len(pending) - 1]:
                return []
            return self._begun(pending + bytes((byte,)))
        if byte == 0x22:
            return [()] if rule.accepts(self.at) else []
        if byte == 0x5C:
            return [(InText(self.node, self.at, b"\\"),)] if self.min_bytes_after(b"\\") else []
        if byte < 0x20:
            return []
        if byte < 0x80:
            return self._after(rule.step(self.at, byte))
        return [] if _UTF8_REST[byte] is None else self._begun(bytes((byte,)))

    def _begun(self, data: bytes):
        """The frame with `data` of a character begun, or the one after it when it is whole."""
        if data[0] == 0x5C and len(data) == 6:
            code = int(data[2:], 16)
            at = None if 0xD800 <= code <= 0xDFFF else self.node.rule.step(self.at, code)
            return self._after(at)
        if data[0] != 0x5C and len(data) == len(_UTF8_REST[data[0]]) + 1:
            return self._after(self.node.rule.step(self.at, ord(data.decode("utf-8"))))
        return [(InText(self.node, self.at, data),)] if self.min_bytes_after(data) else []

    def _after(self, at):
        return [] if at is None else [(InText(self.node, at),)]

    def moves(self):
        return []

    def min_bytes(self):
        return self.min_bytes_after(self.pending) if self.pending else self.node.rule.cost(self.at)

    def min_bytes_after(self, pending: bytes) -> int | None:
        """The fewest bytes that close the string once `pending` (a character begun) is read."""
        rule = self.node.rule
        if pending == b"\\":
            costs = [1 + rule.cost(s) for s in (rule.step(self.at, c) for c in ESCAPES.values())
                     if s is not None]
            through = self.min_bytes_after(b"\\u")
            return min(costs + ([] if through is None else [1 + through]), default=None)
        if pending[:2] == b"\\u":
            digits = pending[2:].decode()
            low, high = int(digits.ljust(4, "0"), 16), int(digits.ljust(4, "f"), 16)
            cost = rule.cost_through(self.at, low, high)
            return None if cost is None else 6 - len(pending) + cost
        cost = rule.cost_through(self.at, *_code_range(pending))
        return None if cost is None else len(_UTF8_REST[pending[0]]) + 1 - len(pending) + cost


def _code_range(data: bytes) -> tuple[int, int]:
    """The code points a UTF-8 character that begins with `data` may be."""
    size = len(_UTF8_REST[data[0]]) + 1
    value = data[0] & (0x7F >> size)
    for byte in data[1:]:
        value = value << 6 | (byte & 0x3F)
    left = 6 * (size - len(data))
    low, high = value << left, (value << left) | ((1 << left) - 1)
    return max(low, {2: 0x80, 3: 0x800, 4: 0x10000}[size]), min(high, 0x10FFFF)


@dataclass(frozen=True, slots=True)
class InKey:
    """A key that `properties` does not list, after its opening quote (Object.keyed): `text` its
    bytes so far, `rest` those its last UTF-8 character still needs; no escape, no control
    character. It closes only on a name not listed and not in `keys` (the other keys written, kept
    where minProperties counts them), then reads its value and goes on as ObjectNext."""
    node: Object
    count: int
    keys: tuple
    text: bytes = b""
    rest: tuple = ()
    reads = True

    def eat(self, byte: int):
        node = self.node
        if self.rest:
            if byte not in self.rest[0]:
                return []
            return [(InKey(node, self.count, self.keys, self.text + bytes((byte,)),
                           self.rest[1:]),)]
        if byte == 0x22:
            return [] if self._taken(self.text) else [self._value(self.text)]
        rest = () if 0x20 <= byte < 0x80 and byte != 0x5C else \
            _UTF8_REST[byte] if byte >= 0x80 else None
        if rest is None:
            return []
        return [(InKey(node, self.count, self.keys, self.text + bytes((byte,)), rest),)]

    def _taken(self, key: bytes) -> bool:
        return key in self.node.listed or key in self.keys

    def _value(self, key: bytes) -> tuple:
        node = self.node
        keys = self.keys + (key,) if node.min_properties else self.keys
        return then(SPACE, Lit(b":"), SPACE, Expect(node.extra), SPACE,
                    ObjectNext(node, len(node.properties), node.counted(self.count), keys))

    def moves(self):
        return []

    def min_bytes(self):
        """The bytes of one way to close: the key as it is (its character finished with the
        lowest bytes), or with the first character after it that makes it free."""
        key = self.text + bytes(min(allowed) for allowed in self.rest)
        spent = len(self.rest)
        if self._taken(key):
            key = next(key + bytes((c,)) for c in _KEY_BYTES if not self._taken(key + bytes((c,))))
            spent += 1
        return spent + 1 + sum(frame.min_bytes() for frame in self._value(key))


_KEY_BYTES = [c for c in range(0x20, 0x7F) if c not in (0x22, 0x5C)]


def free_keys(taken, count: int) -> list[int]:
    """The bytes (quotes included) of the `count` shortest keys InKey may write outside `taken`,
    shortest first, as InKey.min_bytes picks them ("" first, then one character, in byte order)."""
    out, length = [], 0
    while len(out) < count:
        for key in _keys_of_length(length):
            if key not in taken:
                out.append(length + 2)
                if len(out) == count:
                    break
        length += 1
    return out


def _keys_of_length(length: int):
    if length == 0:
        yield b""
        return
    for head in _keys_of_length(length - 1):
        for c in _KEY_BYTES:
            yield head + bytes((c,))


@dataclass(frozen=True, slots=True)
class InNumber:
    """A number's text so far (maybe empty): it reads a byte that keeps it a prefix of a number in
    range."""
    node: Number
    text: bytes
    reads = True

    def eat(self, byte: int):
        text = self.text + bytes((byte,))
        return [(InNumber(self.node, text),)] if number_cost(self.node, text) is not None else []

    def moves(self):
        return [()] if number_cost(self.node, self.text) == 0 else []

    def min_bytes(self):
        return number_cost(self.node, self.text)


@dataclass(frozen=True, slots=True)
class ArrayNext:
    """Between an array's items, after `count` of them (and the whitespace after each)."""
    node: Array
    count: int
    reads = False

    def moves(self):
        node, count, out = self.node, self.count, []
        if count >= node.min_items:
            out.append((Lit(b"]"),))
        item = node.item(count)
        if (node.max_items is None or count < node.max_items) and item is not None \
                and item.min_bytes < math.inf \
                and ArrayNext(node, count + 1).min_bytes() < math.inf:
            comma = (Lit(b","), SPACE) if count else ()
            out.append(then(*comma, Expect(item), SPACE, ArrayNext(node, count + 1)))
        return out

    def min_bytes(self):
        need = range(self.count, max(self.node.min_items, self.count))
        items = [self.node.item(i) for i in need]
        if any(item is None for item in items):
            return math.inf
        commas = len(items) if self.count else max(len(items) - 1, 0)
        return sum(item.min_bytes for item in items) + commas + 1


@dataclass(frozen=True, slots=True)
class ObjectNext:
    """Between an object's properties, `count` of them written: the next may be property `index` or
    a later one (those between are left out: they must be optional), or, once none that is required
    is left, "}" (minProperties allowing) or another key (extra: maxProperties allowing). `keys`:
    the other keys written, where minProperties needs them distinct."""
    node: Object
    index: int
    count: int
    keys: tuple = ()
    reads = False

    def moves(self):
        node, out = self.node, []
        comma = (Lit(b","), SPACE) if self.count else ()
        room = node.max_properties is None or self.count < node.max_properties
        for j in range(self.index, len(node.properties)):
            prop = node.properties[j]
            after = ObjectNext(node, j + 1, node.counted(self.count), self.keys)
            if room and prop.min_bytes < math.inf and after.min_bytes() < math.inf:
                out.append(then(*comma, Lit(prop.key), SPACE, Lit(b":"), SPACE,
                                Expect(prop.value), SPACE, after))
            if prop.required:
                return out
        if self.count >= node.min_properties:
            out.append((Lit(b"}"),))
        if node.extra is None or not room or node.extra.min_bytes == math.inf:
            return out
        if node.keyed:
            out.append(then(*comma, Lit(b'"'), InKey(node, self.count, self.keys)))
        else:
            after = ObjectNext(node, len(node.properties), node.counted(self.count))
            out.append(then(*comma, Expect(_KEY), SPACE, Lit(b":"), SPACE, Expect(node.extra),
                            SPACE, after))
        return out

    def min_bytes(self):
        """The required properties left, then the cheapest entries that reach minProperties."""
        node, rest = self.node, self.node.properties[self.index:]
        entries = [p.min_bytes for p in rest if p.required]
        short = node.min_properties - self.count - len(entries)
        if short > 0:
            options = [p.min_bytes for p in rest if not p.required]
            if node.extra is not None and node.extra.min_bytes < math.inf:
                options += [key + 1 + node.extra.min_bytes
                            for key in free_keys(node.listed | set(self.keys), short)]
            entries += sorted(options)[:short] if len(options) >= short else [math.inf]
        if node.max_properties is not None and self.count + len(entries) > node.max_properties:
            return math.inf
        commas = len(entries) if self.count else max(len(entries) - 1, 0)
        return sum(entries) + commas + 1


_KEY = String(0, None)


# ---- numbers: which texts can still become a number in range -------------------------------------
_NUMBER_PREFIX = re.compile(rb"(-?)(0|[1-9][0-9]*)?(\.[0-9]*)?")


@lru_cache(maxsize=65536)
def number_cost(node: Number, text: bytes) -> int | None:
    """The fewest bytes that make `text` a number `node` allows (0: it is one), None if none can."""
    cost = _unsigned_cost(node, text)
    if text == b"":                                # or with a minus sign first
        signed = _unsigned_cost(node, b"-")
        if signed is not None and (cost is None or signed + 1 < cost):
            return signed + 1
    return cost


def _unsigned_cost(node: Number, text: bytes) -> int | None:
    """number_cost, with no sign added to `text`."""
    match = _NUMBER_PREFIX.fullmatch(text)
    if not match:
        return None
    sign, whole, point = match.groups()
    if (point and (not whole or node.integer)) or len(whole or b"") > MAX_DIGITS \
            or len(point or b".") - 1 > MAX_DIGITS:
        return None
    fraction = (point or b".")[1:]
    for extra in range(2 * MAX_DIGITS + 2):           # completions by length: the first that fits
        if _fits(node, sign == b"-", whole or b"", point is not None, fraction, extra):
            return extra
    return None


def _fits(node: Number, negative: bool, whole: bytes, point: bool, fraction: bytes,
          extra: int) -> bool:
    """Whether appending exactly `extra` bytes to the number's text can give a value in node's
    range."""
    most = 0 if point or whole == b"0" else min(extra, MAX_DIGITS - len(whole))
    more_whole = range(0, most + 1)
    for grow in more_whole:                       # digits added before the point
        left = extra - grow
        if point:
            digits = len(fraction) + left
        elif left == 0:
            digits = 0
        elif node.integer or left < 2:
            continue
        else:
            digits = left - 1                      # "." and at least one digit
        if (point and digits == 0) or digits > MAX_DIGITS or (not whole and grow == 0):
            continue
        # the values reachable: u / 10^digits for integers u in [low_u, high_u]
        known = int(whole + fraction or b"0")
        scale = 10 ** (grow + digits - len(fraction))
        low_u, high_u = known * scale, (known + 1) * scale - 1
        if not whole:                              # no digit yet: any whole part of `grow` digits
            low_u = (0 if grow == 1 else 10 ** (grow - 1)) * 10 ** digits
            high_u = 10 ** (grow + digits) - 1
        if _meets(node, negative, low_u, high_u, 10 ** digits):
            return True
    return False


def _meets(node: Number, negative: bool, low_u: int, high_u: int, unit: int) -> bool:
    """Some u in [low_u, high_u] gives a value (-)u / unit within node's bounds (open or closed),
    and a multiple of its step."""
    low, high, low_open, high_open = node.minimum, node.maximum, node.low_open, node.high_open
    if negative:
        low, high = (None if high is None else -high), (None if low is None else -low)
        low_open, high_open = high_open, low_open
    if low is not None:
        low_u = max(low_u, math.floor(low * unit) + 1 if low_open else math.ceil(low * unit))
    if high is not None:
        high_u = min(high_u, math.ceil(high * unit) - 1 if high_open else math.floor(high * unit))
    if node.step:                                   # (integers: unit is 1)
        low_u = -(-low_u // node.step) * node.step
    return low_u <= high_u


# ---- 2. the machine: states, and a byte at a time ------------------------------------------------
def start_state(node: SchemaNode) -> frozenset:
    """The state before the reply's first byte."""
    return _closed([(Expect(node),)])


def advance(state: frozenset, byte: int) -> frozenset:
    """The state after one more byte (empty when no stack of `state` reads it)."""
    return _closed([stack[:-1] + fragment
                    for stack in state if stack for fragment in stack[-1].eat(byte)])


def is_complete(state: frozenset) -> bool:
    """The bytes read are a whole value (the reply may end here)."""
    return () in state


def close_cost(state: frozenset) -> int | None:
    """The fewest bytes that complete a value from `state` (None: dead). Frames are independent: a
    stack costs the sum of its frames'."""
    return min((sum(frame.min_bytes() for frame in stack) for stack in state), default=None)


def _closed(stacks) -> frozenset:
    """The stacks, each expanded (moves()) until its top frame reads bytes or it is empty (done)."""
    done, todo, seen = set(), list(stacks), set()
    while todo:
        stack = todo.pop()
        if stack in seen:
            continue
        seen.add(stack)
        if not stack or stack[-1].reads:
            done.add(stack)
        if stack:
            todo.extend(stack[:-1] + fragment for fragment in stack[-1].moves())
    return frozenset(done)
