"""minskill.serve.json_schema: the schema compiler and its byte-level state machine, with no model.

Every text the machine lets through (random walks over bytes, within a byte budget) parses and
validates against its schema with the reference validator (the `jsonschema` package, formats
checked); documents the schema allows, written compactly or indented, are read whole; documents it
forbids die or stay incomplete; close_cost is never too low (a walk given exactly that many bytes
completes); keywords outside the subset (issue 49's list) are refused by name and JSON pointer.
SCHEMAS (issue 42's subset, then issue 49's keywords) is shared with
tests/test_constrained_decoding.py."""
import json
import random

import jsonschema
import pytest

from minskill.serve.json_machine import JSON_OBJECT, advance, close_cost, is_complete, start_state
from minskill.serve.json_schema import SchemaError, compile_schema

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
    # issue 49: the keywords pydantic and OpenAI's strict mode send
    "enum_of_any_json": ({"enum": [[1, "a"], {"k": None}, 2.5, True], "title": "Any"}, [1, "a"]),
    "const_beside_keywords": (closed({"v": {"type": "string", "const": "abc", "maxLength": 3},
                                      "w": {"enum": ["xy", "xyz"], "minLength": 3}}),
                              {"v": "abc", "w": "xyz"}),
    "min_length": ({"type": "string", "minLength": 3, "maxLength": 6}, "héllo"),
    "pattern_classes": ({"type": "string", "pattern": r"^[A-Z]\w{2,4}-\d{2}(\s[a-f]+)?$"},
                        "Ab_c-42 beef"),
    "pattern_unanchored": ({"type": "string", "pattern": r"ab|c\d", "maxLength": 8}, "xxabyy"),
    "pattern_negated": ({"type": "string", "pattern": r"^[^\d\s]\D\W\S$"}, "x!;y"),
    "formats_of_time": (closed({name: {"type": "string", "format": name}
                                for name in ("date", "time", "date-time")}),
                        {"date": "2024-02-28", "time": "12:30:00Z",
                         "date-time": "2024-02-28T12:30:00.5+01:00"}),
    "formats_of_names": (closed({name: {"type": "string", "format": name}
                                 for name in ("duration", "email", "hostname", "ipv4")}),
                         {"duration": "P1DT2H", "email": "ada@example.com",
                          "hostname": "www.example.com", "ipv4": "192.168.0.1"}),
    "formats_of_ids": (closed({name: {"type": "string", "format": name}
                               for name in ("ipv6", "uuid")}),
                       {"ipv6": "2001:db8::1", "uuid": "123e4567-e89b-12d3-a456-426614174000"}),
    "format_and_pattern": ({"type": "string", "format": "date", "pattern": "^19"}, "1999-12-31"),
    "exclusive_bounds": (closed({"p": {"type": "number", "exclusiveMinimum": 0,
                                       "exclusiveMaximum": 1},
                                 "n": {"type": "integer", "exclusiveMinimum": -3,
                                       "exclusiveMaximum": -1}}), {"p": 0.5, "n": -2}),
    "integer_multiple": ({"type": "integer", "multipleOf": 7, "minimum": -30,
                          "exclusiveMaximum": 30}, 21),
    "prefix_items": ({"type": "array", "prefixItems": [{"type": "integer"},
                                                       {"type": "string", "maxLength": 3}],
                      "items": False, "minItems": 1}, [1, "ab"]),
    "prefix_then_items": ({"type": "array", "prefixItems": [{"const": "head"}],
                           "items": {"type": "boolean"}, "maxItems": 3}, ["head", True]),
    "dict_of_integers": ({"type": "object", "additionalProperties": {"type": "integer"},
                          "minProperties": 2, "maxProperties": 3}, {"a": 1, "b": 2}),
    "properties_and_extras": ({"type": "object", "properties": {"id": {"type": "integer"}},
                               "required": ["id"],
                               "additionalProperties": {"type": "string", "maxLength": 4}},
                              {"id": 1, "x": "y"}),
    "one_of_discriminated": ({"oneOf": [closed({"kind": {"const": "a"}, "n": {"type": "integer"}}),
                                        closed({"kind": {"enum": ["b", "c"]},
                                                "s": {"type": "string"}})],
                              "discriminator": {"propertyName": "kind"}}, {"kind": "b", "s": "x"}),
    "one_of_types": ({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}, None),
    "all_of": ({"allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"extra": {"type": "boolean"}},
                                                     "required": ["extra"]}],
                "$defs": {"Base": {"type": "object", "required": ["id"],
                                   "properties": {"id": {"type": "integer", "minimum": 0}}}}},
               {"id": 3, "extra": True}),
    "ref_beside_keywords": ({"$defs": {"Tag": {"type": "string", "maxLength": 5}},
                             "$ref": "#/$defs/Tag", "minLength": 2}, "abc"),
    "recursive_ui": ({"type": "object", "additionalProperties": False,
                      "required": ["type", "label", "children", "attributes"], "properties": {
                          "type": {"enum": ["div", "button", "header", "section", "field", "form"]},
                          "label": {"type": "string"},
                          "children": {"type": "array", "items": {"$ref": "#"}},
                          "attributes": {"type": "array", "items": {"$ref": "#/$defs/attribute"}}},
                      "$defs": {"attribute": closed({"name": {"type": "string"},
                                                     "value": {"type": "string"}})}},
                     {"type": "form", "label": "L", "children": [
                         {"type": "field", "label": "x", "children": [], "attributes": []}],
                      "attributes": [{"name": "a", "value": "b"}]}),
    "recursive_list": ({"$defs": {"Node": {"type": "object", "required": ["v", "next"],
                                           "properties": {"v": {"type": "integer"}, "next": {
                                               "anyOf": [{"$ref": "#/$defs/Node"},
                                                         {"type": "null"}]}}}},
                        "$ref": "#/$defs/Node"}, {"v": 1, "next": {"v": 2, "next": None}}),
}
# bytes a random walk draws from: printable ASCII, newline and tab, and the bytes of é (2 bytes),
# 日 (3) and 🙂 (4), so UTF-8 is walked too
def validate(value, schema):
    """The reference check: jsonschema's draft 2020-12 validator (pydantic's draft), formats
    checked."""
    validator = jsonschema.Draft202012Validator
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(value)


ALPHABET = [*range(0x20, 0x7F), 0x0A, 0x09, 0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x99, 0x82]
END = -1


def read(node, text: str):
    """The state after `text` (empty: it died on the way)."""
    state = start_state(node)
    for byte in text.encode():
        state = advance(state, byte)
        if not state:
            break
    return state


def random_reply(node, rng: random.Random, budget: int) -> bytes:
    """A random text the machine lets through, never leaving fewer bytes than close_cost to close
    it."""
    state, out = start_state(node), bytearray()
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
        budget = close_cost(start_state(node)) + rng.choice([0, 5, 40])
        text = random_reply(node, rng, budget)
        assert len(text) <= budget
        validate(json.loads(text.decode("utf-8")), schema)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_documents_a_schema_allows_are_read_whole(name):
    schema, document = SCHEMAS[name]
    validate(document, schema)                   # (the example itself is right)
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
    (SCHEMAS["min_length"][0], '"ab"'), ({"type": "string", "maxLength": 2}, '"\\u00d1bc"'),
    (SCHEMAS["min_length"][0], '"\\ud83d\\ude00'),        # (a surrogate pair: one character)
    (SCHEMAS["pattern_classes"][0], '"A\\u002d'),            # (a \u escape: "-" too soon)
    (SCHEMAS["pattern_classes"][0], '"ab_c-42"'),
    (SCHEMAS["pattern_classes"][0], '"Ab_c-4x"'), (SCHEMAS["pattern_unanchored"][0], '"xxa"'),
    (SCHEMAS["pattern_negated"][0], '"1!;é"'),
    (SCHEMAS["formats_of_time"][0], '{"date": "2023-02-30"'),
    (SCHEMAS["formats_of_time"][0], '{"date": "2023-13'),
    (SCHEMAS["formats_of_time"][0], '{"date": "0000-01-01"'),          # (Python has no year 0)
    (SCHEMAS["formats_of_names"][0], '{"duration": "P12345Y"'),
    (SCHEMAS["formats_of_names"][0], '{"duration": "PT"'),
    (SCHEMAS["formats_of_names"][0], '{"duration": "P1D", "email": "a@b"'),
    (SCHEMAS["formats_of_ids"][0], '{"ipv6": "1::2::3"'),
    (SCHEMAS["formats_of_ids"][0], '{"ipv6": "::", "uuid": "123e4567e89b'),
    (SCHEMAS["format_and_pattern"][0], '"2001-01-01"'),
    (SCHEMAS["exclusive_bounds"][0], '{"p": 1'), (SCHEMAS["exclusive_bounds"][0], '{"p": 0,'),
    (SCHEMAS["exclusive_bounds"][0], '{"p": 0.5, "n": -1'),
    (SCHEMAS["integer_multiple"][0], "22"), (SCHEMAS["integer_multiple"][0], "35"),
    (SCHEMAS["prefix_items"][0], '[1, "ab", 3]'), (SCHEMAS["prefix_items"][0], '["a"'),
    (SCHEMAS["prefix_then_items"][0], '["head", true, false, true]'),
    (SCHEMAS["dict_of_integers"][0], '{"a": 1}'),
    (SCHEMAS["dict_of_integers"][0], '{"a": 1, "a": 2}'),
    (SCHEMAS["dict_of_integers"][0], '{"a": 1, "b": 2, "c": 3, "d": 4}'),
    (SCHEMAS["properties_and_extras"][0], '{"id": 1, "id": "x"}'),
    (SCHEMAS["one_of_discriminated"][0], '{"kind": "a", "s": "x"}'),
    (SCHEMAS["all_of"][0], '{"id": 3}'), (SCHEMAS["all_of"][0], '{"id": -1, "extra": true}'),
    (SCHEMAS["ref_beside_keywords"][0], '"a"'), (SCHEMAS["ref_beside_keywords"][0], '"abcdef"'),
    (SCHEMAS["recursive_list"][0], '{"v": 1, "next": {"v": 2}}'),
])
def test_what_a_schema_forbids_dies_or_stays_incomplete(schema, text):
    state = read(compile_schema(schema), text)
    assert not is_complete(state), text
    if state:                  # still alive: it did not go wrong yet, but it is not a document
        with pytest.raises((jsonschema.ValidationError, json.JSONDecodeError)):
            validate(json.loads(text), schema)


def test_a_string_is_valid_utf8():
    node = compile_schema({"type": "string"})
    for data in (b'"\xff', b'"\xa9', b'"\xc3"', b'"\xed\xa0\x80', b'"\xe0\x80\x80', b'"\xf4\x90'):
        state = start_state(node)
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
    cost, rng = close_cost(start_state(node)), random.Random(name)
    texts = [random_reply(node, rng, cost) for _ in range(3)]
    assert all(len(t) == cost for t in texts)
    for text in texts:
        validate(json.loads(text), SCHEMAS[name][0])


def test_json_object_is_any_object():
    for text in ('{}', '{"a": [1, {"b": null}], "c": "\\u00e9"}'):
        assert is_complete(read(JSON_OBJECT, text))
    assert not read(JSON_OBJECT, "[1]") and not read(JSON_OBJECT, '"x"')


REFUSED = ("not", "if", "patternProperties", "dependentRequired", "dependentSchemas",
           "uniqueItems", "contains", "propertyNames", "unevaluatedProperties")


@pytest.mark.parametrize("schema, pointer, words", [
    *[({"type": "object", "properties": {"tags": {"type": "array", keyword: True}}},
       f"#/properties/tags/{keyword}", f"keyword {keyword!r} is not served")
      for keyword in REFUSED],
    ({"type": "string", "pattern": "(a)\\1"}, "#/pattern", "the escape \\1"),
    ({"type": "string", "pattern": "(?=a)b"}, "#/pattern", "(?...)"),
    ({"type": "string", "pattern": "a{2}{3}"}, "#/pattern", "not a regex Python reads"),
    ({"type": "string", "pattern": "a^b"}, "#/pattern", "'^' inside the pattern"),
    ({"type": "string", "pattern": "\\bword"}, "#/pattern", "the escape \\b"),
    ({"type": "string", "format": "uri"}, "#/format", "format 'uri' is not served"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "#/oneOf",
     "branches 0 and 1 may both match"),
    ({"oneOf": [{"type": "integer"}, {"type": "null"}, {"type": "number"}]}, "#/oneOf",
     "branches 0 and 2"),
    ({"oneOf": [{"const": 1}, {"enum": [2, 1.0]}]}, "#/oneOf", "branches 0 and 1"),
    ({"type": "number", "multipleOf": 0.5}, "#/multipleOf", "served for integers"),
    ({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9}, "#/minimum",
     "multiple of 10"),
    ({"allOf": [{"type": "object", "properties": {"a": {}}, "additionalProperties": False},
                {"properties": {"b": {}}}]}, "#/allOf/0/additionalProperties", "'b'"),
    ({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]}, "#/allOf/1/pattern",
     "different values"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "#/allOf/1/type", "no type in common"),
    ({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}},
                      "required": ["next"]}}, "$ref": "#/$defs/N"}, "#", "no finite value"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "#/minLength", "no string"),
    ({"type": "string", "pattern": "^a{5}$", "maxLength": 4}, "#/pattern", "no string"),
    ({"type": "object", "maxProperties": 1, "required": ["a", "b"],
      "properties": {"a": {}, "b": {}}}, "#/minProperties", "maxProperties"),
    ({"type": "object", "additionalProperties": False, "minProperties": 1}, "#/minProperties",
     "maxProperties"),
    ({"type": "array", "prefixItems": [{}], "items": False, "minItems": 2}, "#/maxItems",
     "items false"),
    ({"$ref": "https://example.com/schema.json"}, "#/$ref", "only a local reference"),
    ({"$ref": "#/$defs/Missing"}, "#/$ref", "points to nothing"),
    ({"type": "date"}, "#/type", "type must be one of"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "#/minimum", "no integer"),
    ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "#/minimum", "no number"),
    ({"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 2}, "#/maxItems",
     "maxItems 2"),
    ({"type": "string", "enum": [1, 2]}, "#/enum", "no value of enum"),
    ({"enum": ["a", "bcd"], "maxLength": 2, "pattern": "^b"}, "#/enum", "other keywords"),
    ({"anyOf": [{"type": "string"}], "maxLength": 3}, "#/maxLength", "beside 'anyOf'"),
    ({"type": "object", "required": ["x"], "additionalProperties": False}, "#/required",
     "'x' is required"),
])
def test_what_is_not_served_is_refused_by_name_and_pointer(schema, pointer, words):
    with pytest.raises(SchemaError) as error:
        compile_schema(schema)
    assert error.value.pointer == pointer and words in str(error.value), str(error.value)
