"""A JSON Schema, compiled into a state machine that reads a reply byte by byte (constrained
decoding).

minskill.serve.constrained asks this machine, before each decoding step, which tokens may come next;
this module knows nothing of tokens. It works in two stages, as llama.cpp's grammars and outlines
do:

  1. compile_schema(schema) -> a tree of nodes, one per kind of JSON value the schema allows
     (Literal, String, Number, Array, Object, AnyOf). Every keyword of the served subset is read
     here, and anything else is refused by name: SchemaError says which keyword, at which JSON
     pointer (#/properties/a/pattern).
  2. start_state(node) -> a State; advance(state, byte) -> the next State (empty: the byte is not
     allowed); close_cost(state): the fewest bytes that still complete a valid value (0: it is
     complete). The nodes, the frames that read them and these functions are in
     minskill.serve.json_machine.

Served (issues 42 and 49): type (a name or a list), enum and const (of any JSON values), anyOf,
oneOf (disjoint branches), allOf (merged), local $ref (recursive ones unrolled RECURSION_DEPTH
times), objects (properties, required, additionalProperties as false, true or a schema,
minProperties, maxProperties), arrays (prefixItems, items, minItems, maxItems), strings (minLength,
maxLength, pattern, format: minskill.serve.json_strings), numbers and integers (minimum, maximum,
exclusiveMinimum, exclusiveMaximum; multipleOf for integers), booleans, null, and annotations that
constrain nothing (title, description, ...). minskill.serve.json_compose reads the composition. The
reply's own shape:

  * properties come in the schema's order; a property not in `required` may be left out; other keys
    are written after them, only where additionalProperties is a schema (or the object lists no
    properties), never one the schema lists, all distinct where minProperties counts them;
  * whitespace is "", " " or a newline and up to MAX_INDENT spaces or tabs, between tokens only
    (none before the value, none after it), so a small model cannot pad its reply without end;
  * numbers are written without an exponent, at most MAX_DIGITS digits before and after the point;
  * strings are valid UTF-8 (escapes included), lengths counted in characters (an escape is one).

Limits: a request's schema is refused (a SchemaError naming the limit) past MAX_SCHEMA_VALUES
JSON values, MAX_SCHEMA_DEPTH levels of nesting or MAX_SUBSCHEMAS compiled subschemas, and a pattern
whose DFA passes json_strings.MAX_DFA_STATES states, so the time and memory one request spends
compiling are bounded, and decoding never grows an automaton (each DFA is built whole here).

Adding a keyword: read it in the builder of its type (_string, _number, _array, _object, or
_Compiler.node for one that applies to any type), add it to SERVED, and if it needs a new shape of
value, a node class with begin() and min_bytes, and a frame class that reads it.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from functools import lru_cache

from minskill.serve.json_compose import ComposeError, cyclic_refs, merged, overlap, target
from minskill.serve.json_machine import (ANY_VALUE, MAX_DIGITS, NOTHING, AnyOf, Array, Literal,
                                         SchemaNode, Number, Object, Property, String, advance,
                                         is_complete, number_cost, start_state)
from minskill.serve.json_strings import (FORMATS, MAX_DFA_WORK, PatternError, TextRule,
                                         compile_pattern)

RECURSION_DEPTH = 6    # a recursive $ref is followed this many times deep, then left out
# what one request may make the server compile (a 400 past these; module doc): a pydantic model of
# 30 nested fields sends ~300 JSON values, 4 levels deep, and compiles ~100 subschemas
MAX_SCHEMA_VALUES = 100_000     # JSON values in the schema (keys, lists, strings, numbers, ...)
MAX_SCHEMA_DEPTH = 64           # arrays and objects nested in the schema
MAX_SUBSCHEMAS = 20_000         # subschemas compiled ($refs unrolled and allOf merged included)
MAX_PATTERNS_WORK = 2 * MAX_DFA_WORK    # steps building the DFAs of its distinct patterns
MAX_TEXT_STATES = 500_000       # a string's states: its DFAs' states times its counted length
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
               "$defs", "definitions", "discriminator", "deprecated", "readOnly", "writeOnly"}
SERVED = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
          "additionalProperties", "minProperties", "maxProperties", "prefixItems", "items",
          "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
          "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# keywords that say a schema without "type" means one type (JSON Schema applies them to that type
# only)
IMPLIED_TYPE = {**dict.fromkeys(("properties", "required", "additionalProperties",
                                 "minProperties", "maxProperties"), "object"),
                **dict.fromkeys(("prefixItems", "items", "minItems", "maxItems"), "array"),
                **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
                **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                 "multipleOf"), "number")}


class SchemaError(ValueError):
    """A schema outside the served subset, or one no value satisfies: `pointer` says where."""

    def __init__(self, pointer: str, message: str):
        super().__init__(f"{pointer}: {message}")
        self.pointer = pointer


# ---- 1. the schema, compiled into nodes ----------------------------------------------------------
def compile_schema(schema) -> "Node":
    """The node of the values `schema` allows (SchemaError where it leaves the served subset or
    passes a limit)."""
    _check_size(schema)
    return _compiled(json.dumps(schema))


def _check_size(schema):
    """SchemaError where `schema` holds over MAX_SCHEMA_VALUES values or nests deeper than
    MAX_SCHEMA_DEPTH (walked without recursion, so no depth overflows Python's stack)."""
    todo, count = [(schema, "#", 0)], 0
    while todo:
        value, where, depth = todo.pop()
        count += 1
        if count > MAX_SCHEMA_VALUES:
            raise SchemaError("#", f"the schema is too large: over {MAX_SCHEMA_VALUES} JSON "
                              "values (MAX_SCHEMA_VALUES)")
        if isinstance(value, (dict, list)) and depth >= MAX_SCHEMA_DEPTH:
            raise SchemaError(where, f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels "
                              "(MAX_SCHEMA_DEPTH)")
        items = value.items() if isinstance(value, dict) else \
            enumerate(value) if isinstance(value, list) else ()
        todo += [(v, f"{where}/{_escape(k)}", depth + 1) for k, v in items]


@lru_cache(maxsize=64)
def _compiled(schema_text: str) -> "Node":
    """Compiled once per schema text: its nodes, and the masks cached for their states, are shared
    by every request that sends it."""
    schema = json.loads(schema_text)
    node = _Compiler(schema).node(schema, "#")
    if node.min_bytes == math.inf:
        raise SchemaError("#", "no finite value satisfies the schema (a required property or "
                          "item that recurses without end, or false)")
    return node


class _Compiler:
    def __init__(self, root):
        self.root = root
        self.refs: dict[tuple, SchemaNode] = {}   # compiled $ref targets, by (pointer, depth left)
        self.cyclic = cyclic_refs(root)       # the $refs that recurse
        self.depth_left = RECURSION_DEPTH
        self.subschemas = 0
        self.patterns: dict[str, object] = {}    # this schema's distinct patterns, compiled
        self.patterns_work = 0

    def node(self, schema, where: str) -> "Node":
        self.subschemas += 1
        if self.subschemas > MAX_SUBSCHEMAS:
            raise SchemaError(where, f"the schema is too large: over {MAX_SUBSCHEMAS} subschemas "
                              "to compile, $refs unrolled (MAX_SUBSCHEMAS)")
        if schema is True or schema == {}:
            return ANY_VALUE
        if schema is False:
            return NOTHING
        if not isinstance(schema, dict):
            raise SchemaError(where, "a schema must be an object or true, got "
                              f"{json.dumps(schema)[:60]}")
        for key in schema:
            if key not in SERVED and key not in ANNOTATIONS:
                raise SchemaError(f"{where}/{_escape(key)}",
                                  f"keyword {key!r} is not served (served: "
                                  f"{', '.join(sorted(SERVED))})")
        constraints = [k for k in schema if k not in ANNOTATIONS]
        if "allOf" in schema or ("$ref" in schema and len(constraints) > 1):
            return self.all_of(schema, where)
        if "$ref" in schema:
            return self.ref(schema["$ref"], f"{where}/$ref")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.any_of(schema, key, constraints, where)
        types = self.types(schema, where)
        if "const" in schema or "enum" in schema:
            return self.choice(schema, types, where)
        nodes = [BUILDERS[t](self, schema, where) for t in types]
        return nodes[0] if len(nodes) == 1 else AnyOf(tuple(nodes))

    def any_of(self, schema: dict, key: str, constraints: list, where: str) -> "Node":
        """anyOf, and oneOf where no two branches overlap (json_compose.overlap)."""
        if len(constraints) > 1:
            other = next(k for k in constraints if k != key)
            raise SchemaError(f"{where}/{_escape(other)}", f"keyword {other!r} beside {key!r} "
                              f"is not served: move it into the schemas {key!r} lists")
        options = schema[key]
        if not isinstance(options, list) or not options:
            raise SchemaError(f"{where}/{key}", f"{key} must be a non-empty list of schemas")
        nodes = tuple(self.node(s, f"{where}/{key}/{i}") for i, s in enumerate(options))
        for i, first in enumerate(options):
            for j in range(i + 1, len(options)):
                if key == "oneOf" and overlap(first, options[j], self.resolve):
                    raise SchemaError(f"{where}/oneOf", f"branches {i} and {j} may both match "
                                      "a value: oneOf is served where its branches are disjoint "
                                      "(a const or enum that differs, or distinct types)")
        return nodes[0] if len(nodes) == 1 else AnyOf(nodes)

    def all_of(self, schema: dict, where: str) -> "Node":
        """allOf (and a $ref beside other keywords): one schema, merged (json_compose.merged)."""
        parts, at = schema.get("allOf", []), f"{where}/allOf"
        if not isinstance(parts, list) or ("allOf" in schema and not parts):
            raise SchemaError(at, "allOf must be a non-empty list of schemas")
        rest = {k: v for k, v in schema.items() if k not in ("allOf", "$ref")}
        pointers = [f"{at}/{i}" for i in range(len(parts))]
        if "$ref" in schema:
            parts, pointers = [{"$ref": schema["$ref"]}, *parts], [where, *pointers]
        if len(parts) == 1 and all(k in ANNOTATIONS for k in rest):
            return self.node(parts[0], pointers[0])
        try:
            return self.node(merged([rest, *parts], [where, *pointers], self.resolve,
                                    ANNOTATIONS), where)
        except ComposeError as error:
            raise SchemaError(error.pointer, str(error))

    def resolve(self, schema):
        """`schema` with its $ref followed (while it holds nothing else that constrains)."""
        seen = set()
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and all(
                k in ANNOTATIONS for k in schema if k != "$ref") and schema["$ref"] not in seen:
            seen.add(schema["$ref"])
            try:
                schema = target(self.root, schema["$ref"])
            except KeyError:
                return schema
        return schema

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
        """enum / const: each value written as JSON, those kept that the schema's other keywords
        allow (its type, or what the machine of the rest reads whole)."""
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list):
            raise SchemaError(f"{where}/enum", "enum must be a list of values")
        kept = [v for v in values
                if _type_of(v) in types or (_type_of(v) == "integer" and "number" in types)]
        rest = {k: v for k, v in schema.items() if k not in ("const", "enum", "type")}
        if any(k not in ANNOTATIONS for k in rest):
            rest_node = self.node({**rest, "type": types}, where)
            kept = [v for v in kept if _reads_whole(rest_node, json.dumps(
                v, ensure_ascii=False, separators=(",", ":")).encode())]
        if not kept:
            raise SchemaError(f"{where}/{key}", f"no value of {key} has the type {types} and "
                              "meets the schema's other keywords")
        nodes = tuple(_value_node(v) for v in kept)
        return nodes[0] if len(nodes) == 1 else AnyOf(nodes)

    def pattern(self, pattern: str, where: str):
        """compile_pattern(pattern), its DFA's work counted against MAX_PATTERNS_WORK (once per
        distinct pattern)."""
        if pattern not in self.patterns:
            if self.patterns_work > MAX_PATTERNS_WORK:
                raise SchemaError(where, f"the schema's patterns are too complex together: over "
                                  f"{MAX_PATTERNS_WORK} steps to build (MAX_PATTERNS_WORK)")
            try:
                self.patterns[pattern] = compile_pattern(pattern)
            except PatternError as error:
                raise SchemaError(where, str(error))
            self.patterns_work += self.patterns[pattern].work
        return self.patterns[pattern]

    def ref(self, pointer, where: str) -> "Node":
        if not isinstance(pointer, str) or not pointer.startswith("#"):
            raise SchemaError(where, f"$ref {pointer!r} is not served: only a local reference "
                              "(#/...)")
        try:
            schema = target(self.root, pointer)
        except KeyError:
            raise SchemaError(where, f"$ref {pointer!r} points to nothing in the schema")
        recursive = pointer in self.cyclic
        if recursive and self.depth_left == 0:
            return NOTHING                    # deeper than RECURSION_DEPTH: left out
        key = (pointer, self.depth_left)
        if key not in self.refs:
            self.depth_left -= recursive
            try:
                self.refs[key] = self.node(schema, pointer)
            finally:
                self.depth_left += recursive
        return self.refs[key]


def _value_node(value) -> "Node":
    """The node of one JSON value: its text, with whitespace allowed between an array's or an
    object's tokens (keys in the value's order)."""
    if isinstance(value, list):
        return Array(None, len(value), len(value), tuple(_value_node(v) for v in value))
    if isinstance(value, dict):
        return Object(tuple(Property(json.dumps(k, ensure_ascii=False).encode(), _value_node(v),
                                     True) for k, v in value.items()), None)
    return Literal(json.dumps(value, ensure_ascii=False).encode())


def _reads_whole(node: "Node", text: bytes) -> bool:
    state = start_state(node)
    for byte in text:
        state = advance(state, byte)
    return is_complete(state)


def _string(compiler: _Compiler, schema: dict, where: str) -> "Node":
    low, high = _count(schema, "minLength", where) or 0, _count(schema, "maxLength", where)
    regexes = []
    if "format" in schema:
        if schema["format"] not in FORMATS:
            raise SchemaError(f"{where}/format", f"format {schema['format']!r} is not served "
                              f"(served: {', '.join(FORMATS)})")
        regexes.append(compiler.pattern(f"^({FORMATS[schema['format']]})$", f"{where}/format"))
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise SchemaError(f"{where}/pattern", "pattern must be a string")
        regexes.append(compiler.pattern(schema["pattern"], f"{where}/pattern"))
    counted = (high if high is not None else low) + 1
    if regexes and math.prod(len(r.sets) for r in regexes) * counted > MAX_TEXT_STATES:
        key = next(k for k in ("maxLength", "minLength", "pattern") if k in schema)
        raise SchemaError(f"{where}/{key}", f"the string is too complex: its pattern and format "
                          f"with its length bounds pass {MAX_TEXT_STATES} states "
                          "(MAX_TEXT_STATES)")
    node = String(low, high, TextRule(tuple(regexes), low, high) if regexes else None)
    if (high is not None and high < low) or node.min_bytes == math.inf:
        key = next(k for k in ("pattern", "format", "minLength", "maxLength") if k in schema)
        raise SchemaError(f"{where}/{key}",
                          "no string meets the schema's pattern, format, minLength and "
                          "maxLength together")
    return node


def _number(compiler: _Compiler, schema: dict, where: str, integer: bool = False) -> "Node":
    (low, low_open), (high, high_open) = (
        _tighter(schema, key, f"exclusive{key.title()}", where, want)
        for key, want in (("minimum", max), ("maximum", min)))
    step = None
    if "multipleOf" in schema:
        step = schema["multipleOf"]
        if not integer or not isinstance(step, (int, float)) or isinstance(step, bool) \
                or step <= 0 or step != int(step):
            raise SchemaError(f"{where}/multipleOf", "multipleOf is served for integers, as a "
                              f"positive whole number, got {step!r} for a "
                              f"{'n integer' if integer else ' number'}")
        step = int(step)
    if integer:                        # an open bound, as the closed one of integers
        low = None if low is None else math.floor(low) + 1 if low_open else math.ceil(low)
        high = None if high is None else math.ceil(high) - 1 if high_open else math.floor(high)
        low_open = high_open = False
    node = Number(integer, low, high, low_open, high_open, step)
    if number_cost(node, b"") is None:
        raise SchemaError(f"{where}/minimum", f"no {'integer' if integer else 'number'} of at "
                          f"most {MAX_DIGITS} digits lies from minimum {low} to maximum {high}"
                          + (f" and is a multiple of {step}" if step else ""))
    return node


def _tighter(schema: dict, key: str, exclusive: str, where: str, want) -> tuple:
    """(bound, open) of a side: the tighter of `key` and `exclusive` (draft 6+: a number)."""
    closed, opened = _bound(schema, key, where), _bound(schema, exclusive, where)
    if opened is not None and (closed is None or want(opened, closed) == opened):
        return opened, True
    return closed, False


def _array(compiler: _Compiler, schema: dict, where: str) -> "Node":
    items, prefix = schema.get("items", True), schema.get("prefixItems", [])
    if isinstance(items, list):
        raise SchemaError(f"{where}/items", "items as a list (a tuple) is not served: "
                          "use prefixItems")
    if not isinstance(prefix, list):
        raise SchemaError(f"{where}/prefixItems", "prefixItems must be a list of schemas")
    low, high = _count(schema, "minItems", where) or 0, _count(schema, "maxItems", where)
    if items is False:
        high = len(prefix) if high is None else min(high, len(prefix))
    if high is not None and high < low:
        raise SchemaError(f"{where}/maxItems", f"maxItems {high} < minItems {low}"
                          + (" (with items false)" if items is False else ""))
    return Array(None if items is False else compiler.node(items, f"{where}/items"), low, high,
                 tuple(compiler.node(s, f"{where}/prefixItems/{i}")
                       for i, s in enumerate(prefix)))


def _object(compiler: _Compiler, schema: dict, where: str) -> "Node":
    properties, required = schema.get("properties", {}), schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict):
        raise SchemaError(f"{where}/properties", "properties must be an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}/required", "required must be a list of property names")
    missing = [r for r in required if r not in properties]
    if missing and extra is False:
        raise SchemaError(f"{where}/required",
                          f"{missing[0]!r} is required but additionalProperties is "
                          "false and properties does not list it")
    listed = {**properties, **{name: extra for name in missing}}
    fields = tuple(Property(json.dumps(name, ensure_ascii=False).encode(),
                            compiler.node(s, f"{where}/properties/{_escape(name)}"),
                            name in required)
                   for name, s in listed.items())
    if extra is True:
        extra_node = None if fields else ANY_VALUE
    else:
        extra_node = None if extra is False else compiler.node(
            extra, f"{where}/additionalProperties")
    low, high = (_count(schema, key, where) for key in ("minProperties", "maxProperties"))
    node = Object(fields, extra_node, low or 0, high, frozenset(n.encode() for n in listed))
    if node.min_bytes == math.inf and all(p.value.min_bytes < math.inf
                                          for p in fields if p.required):
        raise SchemaError(f"{where}/minProperties", "no object has between minProperties and "
                          "maxProperties properties that the schema allows")
    return node


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
