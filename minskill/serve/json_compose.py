"""A schema's composition, read before minskill.serve.json_schema compiles it: allOf merged into one
schema, oneOf's branches checked disjoint, and the $refs that recurse found.

* allOf: its schemas (a $ref followed to what it names) are merged into one: their keywords are
  put together; two schemas that give one keyword different values are a conflict (refused by
  name and pointer), except where a tighter bound wins (minimum, maxLength, ...), `required` is the
  union, `type` the intersection, and a property both list is the allOf of its two schemas. A
  schema with additionalProperties beside another that lists properties it does not know is
  refused: merging would change what it allows.
* oneOf is served as anyOf where no value can match two branches. overlap() proves it from the
  schemas alone (not from what the machine writes): different types, const / enum values that
  differ, or objects that both require a property whose schemas do not overlap (a discriminator).
  It answers True (maybe overlapping) whenever it cannot prove them apart.
* recursion: cyclic_refs(root) is the set of pointers on a cycle of $refs (each $ref's target holds
  a $ref that leads back); json_schema unrolls those to a bounded depth.
"""
from __future__ import annotations

TIGHTER = {"minimum": max, "exclusiveMinimum": max, "minLength": max, "minItems": max,
           "minProperties": max, "maximum": min, "exclusiveMaximum": min, "maxLength": min,
           "maxItems": min, "maxProperties": min}
ANY_KINDS = frozenset({"object", "array", "string", "number", "boolean", "null"})


class ComposeError(ValueError):
    """A conflict in a composition: `pointer` says where."""

    def __init__(self, pointer: str, message: str):
        super().__init__(message)
        self.pointer = pointer


# ---- allOf ---------------------------------------------------------------------------------------
def merged(parts: list, where: list[str], resolve, annotations: set) -> dict:
    """The one schema that allows what every schema of `parts` allows (pointers in `where`);
    `resolve(schema)` follows a schema's $ref."""
    out: dict = {}
    for part, at in zip(parts, where):
        part = resolve(part)
        if part is True:
            continue
        if not isinstance(part, dict):
            raise ComposeError(at, "allOf holds a schema that is not an object")
        for key, value in part.items():
            if key in annotations:
                continue
            if key not in out:
                out[key] = value
            elif key == "properties":
                out[key] = {**out[key], **{name: s if name not in out[key] or out[key][name] == s
                                           else {"allOf": [out[key][name], s]}
                                           for name, s in value.items()}}
            elif key == "required":
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key == "type":
                out[key] = _common_types(out[key], value, f"{at}/type")
            elif key in TIGHTER and _is_number(out[key]) and _is_number(value):
                out[key] = TIGHTER[key](out[key], value)
            elif out[key] != value:
                raise ComposeError(f"{at}/{key}", f"allOf's schemas give {key!r} different "
                                   "values: not served")
    for part, at in zip(parts, where):
        part = resolve(part)
        closed = isinstance(part, dict) and part.get("additionalProperties", True) is not True
        unknown = set(out.get("properties", {})) - set(part.get("properties", {})) if closed \
            else set()
        if unknown:
            raise ComposeError(f"{at}/additionalProperties", f"additionalProperties beside "
                               f"allOf's other schemas, which list {sorted(unknown)[0]!r}: "
                               "not served")
    return out


def _common_types(a, b, where: str) -> list:
    a, b = (t if isinstance(t, list) else [t] for t in (a, b))
    common = [t for t in a if t in b or (t == "integer" and "number" in b)] + \
        [t for t in b if t == "integer" and "number" in a and t not in a]
    if not common:
        raise ComposeError(where, f"allOf's schemas have no type in common ({a} and {b})")
    return common


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- oneOf ---------------------------------------------------------------------------------------
def overlap(a, b, resolve) -> bool:
    """Whether some value may match both schemas (True unless proved otherwise)."""
    a, b = resolve(a), resolve(b)
    if a is False or b is False:
        return False
    if not (kinds(a, resolve) & kinds(b, resolve)):
        return False
    values_a, values_b = values(a), values(b)
    if values_a is not None and values_b is not None:
        return any(equal(x, y) for x in values_a for y in values_b)
    if not (isinstance(a, dict) and isinstance(b, dict)) or \
            kinds(a, resolve) | kinds(b, resolve) != {"object"}:
        return True
    for name in set(a.get("required", [])) & set(b.get("required", [])):
        if not overlap(a.get("properties", {}).get(name, True),
                       b.get("properties", {}).get(name, True), resolve):
            return False
    for x, y in ((a, b), (b, a)):
        if y.get("additionalProperties") is False and \
                set(x.get("required", [])) - set(y.get("properties", {})):
            return False
    return True


def kinds(schema, resolve) -> frozenset:
    """The JSON types a schema's values may have ("integer" read as "number")."""
    schema = resolve(schema)
    if not isinstance(schema, dict):
        return frozenset() if schema is False else ANY_KINDS
    found = values(schema)
    if found is not None:
        return frozenset(_kind(v) for v in found)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return frozenset("number" if t == "integer" else t for t in types)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return frozenset().union(*(kinds(s, resolve) for s in schema[key]))
    if isinstance(schema.get("allOf"), list):
        return ANY_KINDS.intersection(*(kinds(s, resolve) for s in schema["allOf"]))
    return ANY_KINDS


def values(schema) -> list | None:
    """The values a const or enum lists (None: it has neither)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    return schema["enum"] if isinstance(schema.get("enum"), list) else None


def _kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "number", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}[type(value)]


def equal(a, b) -> bool:
    """JSON equality as jsonschema reads it (true is not 1; 1 is 1.0)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if _is_number(a) and _is_number(b):
        return a == b
    return type(a) is type(b) and a == b


# ---- recursion -----------------------------------------------------------------------------------
def target(root, pointer: str):
    """What a local $ref names (KeyError: nothing)."""
    value = root
    for part in [p for p in pointer[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(pointer)
    return value


def cyclic_refs(root) -> set[str]:
    """The local $ref pointers that lead back to themselves through the $refs of their targets."""
    graph = {}
    todo = _refs_in(root)
    while todo:
        pointer = todo.pop()
        if pointer in graph:
            continue
        try:
            graph[pointer] = _refs_in(target(root, pointer))
        except KeyError:
            graph[pointer] = set()
        todo |= graph[pointer] - graph.keys()
    cyclic = set()
    for pointer in graph:
        seen, todo = set(), list(graph[pointer])
        while todo:
            nxt = todo.pop()
            if nxt == pointer:
                cyclic.add(pointer)
                break
            if nxt not in seen:
                seen.add(nxt)
                todo += graph.get(nxt, ())
    return cyclic


def _refs_in(value) -> set[str]:
    found, todo = set(), [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                found.add(ref)
            todo += item.values()
        elif isinstance(item, list):
            todo += item
    return found
