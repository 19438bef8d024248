"""minskill.serve.json_schema: the schema compiler and its byte-level state machine, with no model.

Every text the machine lets through (random walks over bytes, within a byte budget) parses and
validates against its schema with the reference validator (the `jsonschema` package); documents the
schema allows, written compactly or indented, are read whole; documents it forbids die or stay
incomplete; close_cost is never too low (a walk given exactly that many bytes completes); keywords
outside the subset are refused by name and JSON pointer. SCHEMAS is shared with
tests/test_constrained_decoding.py."""
import json
import random

import jsonschema
import pytest

from minskill.serve.json_schema import (JSON_OBJECT, SchemaError, advance, close_cost,
                                        compile_schema, is_complete, start)

def closed(properties: dict, required=None) -> dict:
    """An object schema whose properties are all required (unless `required` says) and no others."""
    return {"type": "object", "properties": properties, "additionalProperties": False,
            "required": list(properties) if required is None else required}


STEP = closed({"title": {"type": "string", "maxLength": 24},
               "score": {"type": "integer", "minimum": 1, "maximum": 10}})
SKILL = closed({"title": {"type": "string", "maxLength": 40},
                "principle": {"type": "string", "maxLength": 120},
                "when_to_apply": {"type": "string", "maxLength": 80}})
# name -> (schema, a document it allows, written with its properties in the schema's order)
SCHEMAS = {
    "object": (closed({"name": {"type": "string"}, "age": {"type": "integer"}}),
               {"name": "Ada", "age": 36}),
    "optional_properties": ({"type": "object", "required": ["b"], "properties": {
        "a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "number"}}},
        {"b": None, "c": -2.5}),
    "array_bounds": ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
                     [3, -1, 0]),
    "enum": ({"enum": ["red", "green", "blue", 7, None, {"k": [1]}]}, "green"),
    "max_length": ({"type": "string", "maxLength": 5}, "héllo"),
    "number_range": ({"type": "number", "minimum": -1.5, "maximum": 2.25}, 2.125),
    "integer_range": ({"type": "integer", "minimum": 100, "maximum": 250}, 199),
    "booleans_and_null": ({"type": "array", "items": {"type": ["boolean", "null"]}, "maxItems": 3},
                          [True, None]),
    "any_of": ({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0},
                          {"type": "null"}]}, 12),
    "nested": (closed({"plan": closed({
        "steps": {"type": "array", "items": STEP, "minItems": 1, "maxItems": 3},
        "done": {"type": "boolean"}})}),
        {"plan": {"steps": [{"title": "read", "score": 3}], "done": False}}),
    "local_ref": ({"$defs": {"Step": STEP, "Tag": {"enum": ["x", "y"]}}, "title": "Plan", **closed({
        "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}, "maxItems": 2},
        "tag": {"$ref": "#/$defs/Tag"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Note"}})},
        {"steps": [{"title": "t", "score": 10}], "tag": "y", "note": None}),
    "skill_set": (closed({"general_skills": {"type": "array", "maxItems": 3, "items": SKILL}}),
                  {"general_skills": [{"title": "Count", "principle": "Add every item.",
                                       "when_to_apply": "sums"}]}),
    "free_object": ({"type": "object"}, {"x": [1, {"y": "z"}], "w": None}),
    "const_and_any": (closed({"kind": {"const": "point"}, "data": {}}),
                      {"kind": "point", "data": [1.5, "two", True]}),
}
# bytes a random walk draws from: printable ASCII, newline and tab, and the bytes of é (2 bytes),
# 日 (3) and 🙂 (4), so UTF-8 is walked too
ALPHABET = [*range(0x20, 0x7F), 0x0A, 0x09, 0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x99, 0x82]
END = -1


def read(node, text: str):
    """The state after `text` (empty: it died on the way)."""
    state = start(node)
    for byte in text.encode():
        state = advance(state, byte)
        if not state:
            break
    return state


def random_reply(node, rng: random.Random, budget: int) -> bytes:
    """A random text the machine lets through, never leaving fewer bytes than close_cost to close
    it."""
    state, out = start(node), bytearray()
    while True:
        options = [(b, s) for b in ALPHABET for s in [advance(state, b)]
                   if s and len(out) + 1 + close_cost(s) <= budget]
        if is_complete(state):
            options += [(END, None)] * max(1, len(options) // 4)
        assert options, f"stuck after {bytes(out)!r}"
        byte, after = rng.choice(options)
        if byte == END:
            return bytes(out)
        out.append(byte)
        state = after


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_text_the_machine_lets_through_validates(name):
    schema, _ = SCHEMAS[name]
    node, rng = compile_schema(schema), random.Random(name)
    for i in range(6):
        budget = close_cost(start(node)) + rng.choice([0, 5, 40])
        text = random_reply(node, rng, budget)
        assert len(text) <= budget
        jsonschema.validate(json.loads(text.decode("utf-8")), schema)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_documents_a_schema_allows_are_read_whole(name):
    schema, document = SCHEMAS[name]
    jsonschema.validate(document, schema)                   # (the example itself is right)
    node = compile_schema(schema)
    for text in (json.dumps(document), json.dumps(document, ensure_ascii=False, indent=2),
                 json.dumps(document, separators=(",", ":"))):
        state = read(node, text)
        assert is_complete(state) and close_cost(state) == 0, text


@pytest.mark.parametrize("schema, text", [
    (SCHEMAS["object"][0], '{"name": "Ada", "age": 36, "x": 1}'),   # additionalProperties false
    (SCHEMAS["object"][0], '{"name": "Ada"}'),                             # required age
    (SCHEMAS["object"][0], '{"age": 36, "name": "Ada"}'),                  # order: the schema's
    (SCHEMAS["object"][0], '{"name": "Ada", "age": 3.5}'),                 # an integer
    (SCHEMAS["array_bounds"][0], "[1]"), (SCHEMAS["array_bounds"][0], "[1, 2, 3, 4, 5]"),
    (SCHEMAS["enum"][0], '"pink"'), (SCHEMAS["max_length"][0], '"héllo!"'),
    (SCHEMAS["number_range"][0], "2.26"), (SCHEMAS["number_range"][0], "-1.6"),
    (SCHEMAS["integer_range"][0], "99"), (SCHEMAS["integer_range"][0], "251"),
    (SCHEMAS["any_of"][0], '"four"'), (SCHEMAS["any_of"][0], "-1"),
    (SCHEMAS["local_ref"][0], '{"steps": []}'),
    ({"type": "string"}, '"a\nb"'), ({"type": "string"}, '"\\q"'),
    ({"type": "integer"}, "007"), ({"type": "number"}, "1e5"), ({"type": "null"}, " null"),
    (True, '{"a": 1}   '),                                # whitespace only between tokens
])
def test_what_a_schema_forbids_dies_or_stays_incomplete(schema, text):
    state = read(compile_schema(schema), text)
    assert not is_complete(state), text
    if state:                  # still alive: it did not go wrong yet, but it is not a document
        with pytest.raises((jsonschema.ValidationError, json.JSONDecodeError)):
            jsonschema.validate(json.loads(text), schema)


def test_a_string_is_valid_utf8():
    node = compile_schema({"type": "string"})
    for data in (b'"\xff', b'"\xa9', b'"\xc3"', b'"\xed\xa0\x80', b'"\xe0\x80\x80', b'"\xf4\x90'):
        state = start(node)
        for byte in data:
            state = advance(state, byte)
        assert not state, data
    assert is_complete(read(node, '"日🙂é"'))


def test_whitespace_is_bounded():
    node = compile_schema({"type": "array"})
    assert read(node, "[\n" + " " * 20 + "1]") and not read(node, "[\n" + " " * 21)
    assert not read(node, "[  1]") and not read(node, "[\n\n1]")


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_close_cost_is_enough_and_exact_at_the_start(name):
    """A walk given exactly close_cost bytes completes (the cost is never too low), and the shortest
    document the reference validator accepts among those walks is that long (it is not too high)."""
    node = compile_schema(SCHEMAS[name][0])
    cost, rng = close_cost(start(node)), random.Random(name)
    texts = [random_reply(node, rng, cost) for _ in range(3)]
    assert all(len(t) == cost for t in texts)
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMAS[name][0])


def test_json_object_is_any_object():
    for text in ('{}', '{"a": [1, {"b": null}], "c": "\\u00e9"}'):
        assert is_complete(read(JSON_OBJECT, text))
    assert not read(JSON_OBJECT, "[1]") and not read(JSON_OBJECT, '"x"')


@pytest.mark.parametrize("schema, pointer, words", [
    ({"type": "string", "pattern": "^a+$"}, "#/pattern", "'pattern' is not served"),
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
     "#/properties/tags/uniqueItems", "'uniqueItems'"),
    ({"oneOf": [{"type": "string"}]}, "#/oneOf", "'oneOf'"),
    ({"not": {"type": "string"}}, "#/not", "'not'"),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, "#/prefixItems", "'prefixItems'"),
    ({"type": "string", "format": "date"}, "#/format", "'format'"),
    ({"type": "string", "minLength": 2}, "#/minLength", "'minLength'"),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, "#/additionalProperties",
     "as a schema"),
    ({"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
      "$ref": "#/$defs/Node"}, "#/$defs/Node/properties/next/$ref", "recursive"),
    ({"$ref": "https://example.com/schema.json"}, "#/$ref", "only a local reference"),
    ({"$ref": "#/$defs/Missing"}, "#/$ref", "points to nothing"),
    ({"type": "date"}, "#/type", "type must be one of"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "#/minimum", "no integer"),
    ({"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 2}, "#/maxItems",
     "maxItems 2"),
    ({"type": "string", "enum": [1, 2]}, "#/enum", "no value of enum"),
    ({"anyOf": [{"type": "string"}], "maxLength": 3}, "#/maxLength", "beside 'anyOf'"),
    ({"type": "object", "required": ["x"], "additionalProperties": False}, "#/required",
     "'x' is required"),
])
def test_what_is_not_served_is_refused_by_name_and_pointer(schema, pointer, words):
    with pytest.raises(SchemaError) as error:
        compile_schema(schema)
    assert error.value.pointer == pointer and words in str(error.value), str(error.value)
