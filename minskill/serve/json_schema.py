"""A JSON Schema, compiled into a state machine that reads a reply byte by byte (constrained
decoding).

minskill.serve.constrained asks this machine, before each decoding step, which tokens may come next;
this module knows nothing of tokens. It works in two stages, as llama.cpp's grammars and outlines
do:

  1. compile_schema(schema) -> a tree of nodes, one per kind of JSON value the schema allows
     (Literal, String, Number, Array, Object, AnyOf). Every keyword of the served subset is read
     here, and anything else is refused by name: SchemaError says which keyword, at which JSON
     pointer (#/properties/a/pattern).
  2. start(node) -> a State; advance(state, byte) -> the next State (empty: the byte is not
     allowed); close_cost(state): the fewest bytes that still complete a valid value (0: it is
     complete).

A State is a pushdown automaton's set of stacks. A stack is a tuple of frames, the last on top: the
top frame reads the next byte, the frames under it are what follows it (a continuation: "after this
string, whitespace, then the rest of the array"). A frame either reads bytes (a literal's next byte,
a string's content, a number's digits, whitespace) or only expands (Expect: "a value of this node,
not begun"; the positions between an array's items or an object's properties), into the frames that
may come next. A state holds every way the bytes read so far can go on (anyOf's branches, a number
that may end or continue), each expanded until its top frame reads bytes, so a byte is checked
against the top frames only.

Served subset (issue 42): type (a name or a list), enum and const (of any JSON values), anyOf, local
$ref (to a definition, not recursive), objects (properties, required, additionalProperties false or
true), arrays (items, minItems, maxItems), strings (maxLength), numbers and integers (minimum,
maximum), booleans, null, and annotations that constrain nothing (title, description, ...). The
reply's own shape:

  * properties come in the schema's order; a property not in `required` may be left out; no property
    outside `properties` is written (additionalProperties true allows them but does not need them),
    and a schema without properties (or response_format json_object) gets any keys and values;
  * whitespace is "", " " or a newline and up to MAX_INDENT spaces or tabs, between tokens only
    (none before the value, none after it), so a small model cannot pad its reply without end;
  * numbers are written without an exponent, at most MAX_DIGITS digits before and after the point;
  * strings are valid UTF-8 (escapes included), maxLength counted in characters (an escape is one).

Adding a keyword (issue 49): read it in the builder of its type (_string, _number, _array, _object,
or _Compiler.node for one that applies to any type), add it to SERVED, and if it needs a new shape
of value, a node class with begin() and min_bytes, and a frame class that reads it.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache

MAX_INDENT = 20        # spaces or tabs after a newline (llama.cpp's bound)
MAX_DIGITS = 15        # digits before the point, and after it
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
               "$defs", "definitions"}     # (definitions are read where a $ref points into them)
SERVED = {"type", "enum", "const", "anyOf", "$ref", "properties", "required",
          "additionalProperties", "items", "minItems", "maxItems", "maxLength", "minimum",
          "maximum"}
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# keywords that say a schema without "type" means one type (JSON Schema applies them to that type
# only)
IMPLIED_TYPE = {"properties": "object", "required": "object", "additionalProperties": "object",
                "items": "array", "minItems": "array", "maxItems": "array", "maxLength": "string",
                "minimum": "number", "maximum": "number"}


class SchemaError(ValueError):
    """A schema outside the served subset, or one no value satisfies: `pointer` says where."""

    def __init__(self, pointer: str, message: str):
        super().__init__(f"{pointer}: {message}")
        self.pointer = pointer


# ---- 1. the schema, compiled into nodes ----------------------------------------------------------
def compile_schema(schema) -> "Node":
    """The node of the values `schema` allows (SchemaError where it leaves the served subset)."""
    return _compiled(json.dumps(schema))


@lru_cache(maxsize=64)
def _compiled(schema_text: str) -> "Node":
    """Compiled once per schema text: its nodes, and the masks cached for their states, are shared
    by every request that sends it."""
    schema = json.loads(schema_text)
    return _Compiler(schema).node(schema, "#")


class _Compiler:
    def __init__(self, root):
        self.root = root
        self.refs: dict[str, Node] = {}       # compiled $ref targets, by pointer
        self.resolving: list[str] = []    # the $ref chain being compiled (a repeat is recursion)

    def node(self, schema, where: str) -> "Node":
        if schema is True or schema == {}:
            return ANY_VALUE
        if not isinstance(schema, dict):
            raise SchemaError(where, "a schema must be an object or true, got "
                              f"{json.dumps(schema)[:60]}")
        for key in schema:
            if key not in SERVED and key not in ANNOTATIONS:
                raise SchemaError(f"{where}/{_escape(key)}",
                                  f"keyword {key!r} is not served (served: "
                                  f"{', '.join(sorted(SERVED))})")
        constraints = [k for k in schema if k not in ANNOTATIONS]
        for key in ("$ref", "anyOf"):
            if key in schema and len(constraints) > 1:
                other = next(k for k in constraints if k != key)
                raise SchemaError(f"{where}/{_escape(other)}",
                                  f"keyword {other!r} beside {key!r} is not "
                                  f"served: move it into the schema {key!r} names")
        if "$ref" in schema:
            return self.ref(schema["$ref"], f"{where}/$ref")
        if "anyOf" in schema:
            options = schema["anyOf"]
            if not isinstance(options, list) or not options:
                raise SchemaError(f"{where}/anyOf", "anyOf must be a non-empty list of schemas")
            return AnyOf(tuple(self.node(s, f"{where}/anyOf/{i}") for i, s in enumerate(options)))
        types = self.types(schema, where)
        if "const" in schema or "enum" in schema:
            return self.choice(schema, types, where)
        nodes = [BUILDERS[t](self, schema, where) for t in types]
        return nodes[0] if len(nodes) == 1 else AnyOf(tuple(nodes))

    def types(self, schema: dict, where: str) -> list[str]:
        kind = schema.get("type")
        if kind is None:
            implied = {IMPLIED_TYPE[k] for k in schema if k in IMPLIED_TYPE}
            return sorted(implied) if implied else list(TYPES)
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or any(k not in TYPES for k in kinds):
            raise SchemaError(f"{where}/type",
                              f"type must be one of {', '.join(TYPES)} or a list of "
                              f"them, got {json.dumps(kind)[:60]}")
        return list(dict.fromkeys(kinds))

    def choice(self, schema: dict, types: list[str], where: str) -> "Node":
        """enum / const: each value written as JSON, those that fit the schema's type kept."""
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list):
            raise SchemaError(f"{where}/enum", "enum must be a list of values")
        kept = [v for v in values
                if _type_of(v) in types or (_type_of(v) == "integer" and "number" in types)]
        if not kept:
            raise SchemaError(f"{where}/{key}", f"no value of {key} has the type {types}")
        nodes = tuple(Literal(json.dumps(v, ensure_ascii=False).encode()) for v in kept)
        return nodes[0] if len(nodes) == 1 else AnyOf(nodes)

    def ref(self, pointer, where: str) -> "Node":
        if not isinstance(pointer, str) or not pointer.startswith("#"):
            raise SchemaError(where, f"$ref {pointer!r} is not served: only a local reference "
                              "(#/...)")
        if pointer in self.resolving:
            raise SchemaError(where, f"$ref {pointer!r} is recursive: not served")
        if pointer not in self.refs:
            target = self.root
            for part in [p for p in pointer[1:].split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise SchemaError(where, f"$ref {pointer!r} points to nothing in the schema")
                target = target[part]
            self.resolving.append(pointer)
            self.refs[pointer] = self.node(target, pointer)
            self.resolving.pop()
        return self.refs[pointer]


def _string(compiler: _Compiler, schema: dict, where: str) -> "Node":
    return String(_count(schema, "maxLength", where))


def _number(compiler: _Compiler, schema: dict, where: str, integer: bool = False) -> "Node":
    low, high = (_bound(schema, key, where) for key in ("minimum", "maximum"))
    if integer:
        low = None if low is None else math.ceil(low)
        high = None if high is None else math.floor(high)
    limit = 10 ** MAX_DIGITS
    if (low is not None and high is not None and low > high) or (low is not None and low >= limit) \
            or (high is not None and high <= -limit):
        raise SchemaError(f"{where}/minimum", f"no {'integer' if integer else 'number'} of at most "
                          f"{MAX_DIGITS} digits lies from minimum {low} to maximum {high}")
    return Number(integer, low, high)


def _array(compiler: _Compiler, schema: dict, where: str) -> "Node":
    items = schema.get("items", True)
    if isinstance(items, list):
        raise SchemaError(f"{where}/items", "items as a list (a tuple) is not served")
    low, high = _count(schema, "minItems", where) or 0, _count(schema, "maxItems", where)
    if high is not None and high < low:
        raise SchemaError(f"{where}/maxItems", f"maxItems {high} < minItems {low}")
    return Array(compiler.node(items, f"{where}/items"), low, high)


def _object(compiler: _Compiler, schema: dict, where: str) -> "Node":
    properties, required = schema.get("properties", {}), schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict):
        raise SchemaError(f"{where}/properties", "properties must be an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}/required", "required must be a list of property names")
    if not isinstance(extra, bool):
        raise SchemaError(f"{where}/additionalProperties",
                          "additionalProperties as a schema is not "
                          "served: give true or false")
    missing = [r for r in required if r not in properties]
    if missing and not extra:
        raise SchemaError(f"{where}/required",
                          f"{missing[0]!r} is required but additionalProperties is "
                          "false and properties does not list it")
    listed = {**properties, **{name: True for name in missing}}
    fields = tuple(Property(json.dumps(name, ensure_ascii=False).encode(),
                            compiler.node(s, f"{where}/properties/{_escape(name)}"),
                            name in required)
                   for name, s in listed.items())
    return Object(fields, ANY_VALUE if extra and not fields else None)


BUILDERS = {"string": _string, "number": _number, "array": _array, "object": _object,
            "integer": lambda c, s, w: _number(c, s, w, integer=True),
            "boolean": lambda c, s, w: AnyOf((Literal(b"true"), Literal(b"false"))),
            "null": lambda c, s, w: Literal(b"null")}


def _count(schema: dict, key: str, where: str) -> int | None:
    value = schema.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise SchemaError(f"{where}/{key}", f"{key} must be a non-negative integer, got {value!r}")
    return value


def _bound(schema: dict, key: str, where: str) -> Fraction | None:
    value = schema.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value)):
        raise SchemaError(f"{where}/{key}", f"{key} must be a number, got {value!r}")
    return None if value is None else Fraction(value)


def _type_of(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}[type(value)]


def _escape(key: str) -> str:
    """A property name as a JSON pointer writes it."""
    return str(key).replace("~", "~0").replace("/", "~1")


# ---- the nodes: what a value may be --------------------------------------------------------------
# A node says how its value begins (begin(): the stack fragments that replace an Expect of it) and
# how few bytes it takes (min_bytes, worked out once). Nodes compare by identity: a state hashes
# fast however big its schema.
class Node:
    min_bytes: int


@dataclass(eq=False)
class Literal(Node):
    """One fixed text: a JSON value of enum or const, true, false, null."""
    text: bytes

    @cached_property
    def min_bytes(self):
        return len(self.text)

    def begin(self):
        return [(Lit(self.text),)]


@dataclass(eq=False)
class AnyOf(Node):
    options: tuple

    @cached_property
    def min_bytes(self):
        return min(o.min_bytes for o in self.options)

    def begin(self):
        return [fragment for option in self.options for fragment in option.begin()]


@dataclass(eq=False)
class String(Node):
    max_chars: int | None

    min_bytes = 2

    def begin(self):
        return [then(Lit(b'"'), InString(self, 0, ()))]


@dataclass(eq=False)
class Number(Node):
    integer: bool
    minimum: Fraction | int | None
    maximum: Fraction | int | None

    @cached_property
    def min_bytes(self):
        return number_cost(self, b"")

    def begin(self):
        return [(InNumber(self, b""),)]


@dataclass(eq=False)
class Array(Node):
    items: Node
    min_items: int
    max_items: int | None

    @cached_property
    def min_bytes(self):
        return 1 + ArrayNext(self, 0).min_bytes()

    def begin(self):
        return [then(Lit(b"["), SPACE, ArrayNext(self, 0))]


@dataclass(eq=False)
class Property:
    key: bytes            # the name, written as JSON ("name" with its quotes)
    value: Node
    required: bool


@dataclass(eq=False)
class Object(Node):
    """`properties` in their order; `extra`: the value of any other key (None: no other key)."""
    properties: tuple
    extra: Node | None

    @cached_property
    def min_bytes(self):
        return 1 + ObjectNext(self, 0, False).min_bytes()

    def begin(self):
        return [then(Lit(b"{"), SPACE, ObjectNext(self, 0, False))]


class AnyValue(Node):
    """Any JSON value (the schema `{}` or true; the values of response_format json_object)."""
    min_bytes = 1                                     # the number 0

    def begin(self):
        return [fragment for option in _ANY_OPTIONS for fragment in option.begin()]


ANY_VALUE = AnyValue()
_ANY_OPTIONS = (Object((), ANY_VALUE), Array(ANY_VALUE, 0, None), String(None),
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
    node: Node
    reads = False

    def moves(self):
        return self.node.begin()

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
    counted only under maxLength (else 0, so the state does not change along the string and its mask
    is cached)."""
    node: String
    chars: int
    rest: tuple
    reads = True

    def eat(self, byte: int):
        if self.rest:
            if byte not in self.rest[0]:
                return []
            rest = (_HEX,) * 4 if self.rest[0] is _ESCAPED and byte == 0x75 else self.rest[1:]
            return [(InString(self.node, self.chars, rest),)]
        if byte == 0x22:
            return [()]
        if byte < 0x20 or (self.node.max_chars is not None and self.chars >= self.node.max_chars):
            return []
        rest = (_ESCAPED,) if byte == 0x5C else () if byte < 0x80 else _UTF8_REST[byte]
        if rest is None:
            return []
        return [(InString(self.node, self.chars + (self.node.max_chars is not None), rest),)]

    def moves(self):
        return []

    def min_bytes(self):
        return len(self.rest) + 1


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
        if node.max_items is None or count < node.max_items:
            comma = (Lit(b","), SPACE) if count else ()
            out.append(then(*comma, Expect(node.items), SPACE, ArrayNext(node, count + 1)))
        return out

    def min_bytes(self):
        need = max(self.node.min_items - self.count, 0)
        commas = need if self.count else max(need - 1, 0)
        return need * self.node.items.min_bytes + commas + 1


@dataclass(frozen=True, slots=True)
class ObjectNext:
    """Between an object's properties: the next may be property `index` or a later one (those
    between are left out: they must be optional), or, once none that is required is left, "}" or an
    extra key."""
    node: Object
    index: int
    written: bool            # a property was written (the next needs a comma)
    reads = False

    def moves(self):
        node, out = self.node, []
        comma = (Lit(b","), SPACE) if self.written else ()
        for j in range(self.index, len(node.properties)):
            prop = node.properties[j]
            out.append(then(*comma, Lit(prop.key), SPACE, Lit(b":"), SPACE, Expect(prop.value),
                            SPACE,
                            ObjectNext(node, j + 1, True)))
            if prop.required:
                return out
        out.append((Lit(b"}"),))
        if node.extra is not None:      # (issue 49: keys must then differ from the listed ones)
            out.append(then(*comma, Expect(_KEY), SPACE, Lit(b":"), SPACE, Expect(node.extra),
                            SPACE,
                            ObjectNext(node, len(node.properties), True)))
        return out

    def min_bytes(self):
        needed = [p for p in self.node.properties[self.index:] if p.required]
        commas = len(needed) if self.written else max(len(needed) - 1, 0)
        return sum(len(p.key) + 1 + p.value.min_bytes for p in needed) + commas + 1


_KEY = String(None)


# ---- numbers: which texts can still become a number in range -------------------------------------
_NUMBER_PREFIX = re.compile(rb"(-?)(0|[1-9][0-9]*)?(\.[0-9]*)?")


@lru_cache(maxsize=65536)
def number_cost(node: Number, text: bytes) -> int | None:
    """The fewest bytes that make `text` a number `node` allows (0: it is one), None if none can."""
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
    """Some u in [low_u, high_u] gives a value (-)u / unit within node's minimum and maximum."""
    low, high = node.minimum, node.maximum
    if negative:
        low, high = (None if high is None else -high), (None if low is None else -low)
    if low is not None:
        low_u = max(low_u, math.ceil(low * unit))
    if high is not None:
        high_u = min(high_u, math.floor(high * unit))
    return low_u <= high_u


# ---- 2. the machine: states, and a byte at a time ------------------------------------------------
def start(node: Node) -> frozenset:
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
