"""The limits on what one request's schema may make the server compile (minskill.serve.json_schema
and json_strings): a pattern whose automaton would grow past MAX_DFA_STATES, a huge or deeply
nested schema, and a string whose pattern times its length bound is too large are each refused
when the schema is compiled, naming the keyword and its JSON pointer (a 400 at the server), while
the formats and the patterns users write still compile and serve valid replies."""
import json
import random

import pytest

from minskill.serve import json_schema, json_strings
from minskill.serve.json_schema import SchemaError, compile_schema
from minskill.serve.json_strings import FORMATS, compile_pattern
from test_constrained_decoding import USER, json_format, post, tiny_backend, tiny_dir  # noqa: F401
from test_constrained_decoding import tiny_server  # noqa: F401
from test_json_schema import random_reply, validate

# patterns whose DFA doubles with each repeat, or whose nested repeats unroll past the NFA's bound
HOSTILE_PATTERNS = ["(a|b)*a(a|b){15}", "^(a|b)*a(a|b){20}$", "((a{0,50}){0,50}){0,50}",
                    "^.{0,3900}$", "([ab]*b[ab]{14})+c"]
REALISTIC_PATTERNS = [r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", r"^\d{4}-\d{2}-\d{2}$", r"^\+?[1-9]\d{1,14}$",
                      r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                      r"^[a-z0-9_-]{3,16}$", r"[A-Z]{3}", r"^https?://[^\s/$.?#].[^\s]*$",
                      r"^(\w+\s?){1,50}$"]


def string_property(**string) -> dict:
    return {"type": "object", "properties": {"x": {"type": "string", **string}},
            "required": ["x"], "additionalProperties": False}


@pytest.mark.parametrize("pattern", HOSTILE_PATTERNS)
def test_a_pattern_too_complex_is_refused_naming_its_pointer(pattern):
    with pytest.raises(SchemaError) as caught:
        compile_schema(string_property(pattern=pattern))
    assert str(caught.value).startswith("#/properties/x/pattern: ")
    assert "too complex" in str(caught.value) or "unrolls to over" in str(caught.value)


def test_the_formats_and_realistic_patterns_stay_far_below_the_cap():
    for regex in [f"^({f})$" for f in FORMATS.values()] + REALISTIC_PATTERNS:
        compiled = compile_pattern(regex)
        assert len(compiled.sets) * 4 <= json_strings.MAX_DFA_STATES, regex
        assert compiled.work * 2 <= json_strings.MAX_DFA_WORK, regex


@pytest.mark.parametrize("string", [{"pattern": p} for p in REALISTIC_PATTERNS]
                         + [{"format": f, "maxLength": 254} for f in FORMATS])
def test_realistic_strings_still_serve_valid_replies(string):
    schema = string_property(**string)
    node, rng = compile_schema(schema), random.Random(3)
    for _ in range(3):
        validate(json.loads(random_reply(node, rng, 400)), schema)


def test_a_pattern_with_a_long_length_bound_is_refused():
    with pytest.raises(SchemaError, match=r"^#/properties/x/maxLength: .*MAX_TEXT_STATES"):
        compile_schema(string_property(pattern="^(a|b)*a(a|b){10}$", maxLength=100_000))


def test_a_huge_schema_is_refused_naming_the_limit():
    many = {f"p{i}": {"type": "integer"} for i in range(json_schema.MAX_SCHEMA_VALUES // 2)}
    with pytest.raises(SchemaError, match="MAX_SCHEMA_VALUES"):
        compile_schema({"type": "object", "properties": many})


def test_a_deep_schema_is_refused_naming_the_limit():
    deep: dict = {"type": "string"}
    for _ in range(5_000):               # (deeper than Python's stack: no RecursionError)
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="MAX_SCHEMA_DEPTH") as caught:
        compile_schema(deep)
    assert str(caught.value).startswith("#/items/items/")


def test_refs_that_unroll_past_the_subschema_bound_are_refused():
    # each level lists its next one 8 times, merged (so not shared): 8**8 subschemas once unrolled
    defs = {f"l{i}": {"type": "object", "properties": {
        f"k{j}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"type": "object"}]}
        for j in range(8)}} for i in range(8)}
    defs["l8"] = {"type": "object"}
    with pytest.raises(SchemaError, match="MAX_SUBSCHEMAS"):
        compile_schema({"$defs": defs, "$ref": "#/$defs/l0"})


def test_the_server_answers_a_hostile_schema_with_a_400(tiny_server):  # noqa: F811
    body = {"messages": USER, "response_format": json_format(
        string_property(pattern=HOSTILE_PATTERNS[0]))}
    reply = post(tiny_server, body)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "#/properties/x/pattern" in message and "too complex" in message
    served = post(tiny_server, {"messages": USER, "max_tokens": 40, "response_format": json_format(
        string_property(pattern=REALISTIC_PATTERNS[1]))})
    assert served.status_code == 200, served.text
