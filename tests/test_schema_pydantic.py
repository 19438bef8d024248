"""Structured outputs under the schemas users send (issue 49): pydantic v2's real
`model_json_schema()`, one model per keyword, and random schemas of the served subset.

Per keyword: the model's schema holds the keyword (so the test is about it); every text the
machine lets through (random walks) and every reply of a tiny random model (greedy and sampled)
validates with jsonschema (draft 2020-12, formats checked) and loads into the pydantic model. The
property test draws random schemas of the served subset: each reply of the tiny model within
max_tokens validates and ends with finish_reason "stop", since max_tokens leaves room for the
shortest valid reply."""
import datetime
import enum
import ipaddress
import json
import random
import uuid
from typing import Annotated, Literal, Optional, Union

import pytest
import requests

from minskill.serve.json_machine import close_cost, start_state
from minskill.serve.json_schema import compile_schema
from test_constrained_decoding import USER, json_format, load_tiny
from test_json_schema import random_reply, validate

pydantic = pytest.importorskip("pydantic")
BaseModel, Field = pydantic.BaseModel, pydantic.Field


class Color(str, enum.Enum):
    red = "red"
    green = "green"


class Choice(BaseModel):
    unit: Literal["celsius"]
    mixed: Literal[1, "a", None, True]
    color: Color


class Lengths(BaseModel):
    code: str = Field(min_length=2, max_length=5)


class Times(BaseModel):
    at: datetime.datetime
    day: datetime.date
    clock: datetime.time
    spent: datetime.timedelta


class Addresses(BaseModel):
    id: uuid.UUID
    v4: ipaddress.IPv4Address
    v6: ipaddress.IPv6Address
    mail: str = Field(json_schema_extra={"format": "email"})
    host: str = Field(json_schema_extra={"format": "hostname"})


class Patterned(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{2}-\d{3}(-[a-z]+)?$")
    word: str = Field(pattern=r"\w\s\w", max_length=6)


class Bounds(BaseModel):
    ratio: float = Field(gt=0, lt=1)
    step: int = Field(ge=-20, lt=20, multiple_of=5)


class Tuples(BaseModel):
    pair: tuple[int, bool]
    head: tuple[str, ...] = Field(max_length=2)


class Dicts(BaseModel):
    counts: dict[str, int] = Field(min_length=1, max_length=3)


class Optionals(BaseModel):
    name: str = Field(max_length=8)
    age: Optional[int] = None
    tags: list[str] = Field(default_factory=list, max_length=2)


class Cat(BaseModel):
    pet_type: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    pet_type: Literal["dog"]
    good: bool


class Owner(BaseModel):
    pet: Union[Cat, Dog] = Field(discriminator="pet_type")
    other: Union[int, str, None] = None


class Point(BaseModel):
    x: int


class Referred(BaseModel):
    at: Point = Field(description="where", examples=[{"x": 1}])
    note: Annotated[str, Field(examples=["hi"], deprecated=True, max_length=4)] = "x"


class Tree(BaseModel):
    value: int = Field(ge=0, le=9)
    children: list["Tree"] = Field(default_factory=list, max_length=2)


def older_spelling(schema: dict) -> dict:
    """A $ref beside a description written as older pydantic wrote it: allOf holding the $ref."""
    schema = json.loads(json.dumps(schema))
    at = schema["properties"]["at"]
    schema["properties"]["at"] = {"allOf": [{"$ref": at.pop("$ref")}], **at}
    return schema


# name -> (model, the keyword its schema must hold, the schema as sent)
MODELS = {
    "const_and_enum": (Choice, "const", None),
    "min_length": (Lengths, "minLength", None),
    "formats_of_time": (Times, "date-time", None),
    "formats_of_addresses": (Addresses, "ipv6", None),
    "pattern": (Patterned, "pattern", None),
    "exclusive_and_multiple": (Bounds, "multipleOf", None),
    "prefix_items": (Tuples, "prefixItems", None),
    "additional_properties": (Dicts, "minProperties", None),
    "optional_properties": (Optionals, "default", None),
    "one_of_discriminated": (Owner, "oneOf", None),
    "ref_with_annotations": (Referred, "examples", None),
    "all_of_one_ref": (Referred, "allOf", older_spelling),
    "recursion": (Tree, "#/$defs/Tree", None),
}


def model_schema(name: str) -> dict:
    model, _, spelling = MODELS[name]
    schema = model.model_json_schema()
    return spelling(schema) if spelling else schema


@pytest.mark.parametrize("name", list(MODELS))
def test_every_text_the_machine_lets_through_fits_the_pydantic_model(name):
    model, keyword, _ = MODELS[name]
    schema = model_schema(name)
    assert keyword in json.dumps(schema)
    node, rng = compile_schema(schema), random.Random(name)
    for _ in range(40 if "formats" in name else 8):      # (formats: pydantic parses them too)
        text = random_reply(node, rng, close_cost(start_state(node)) + rng.choice([0, 10, 60]))
        validate(json.loads(text), schema)
        model.model_validate_json(text)


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from minskill.serve.server import start_server
    from tiny import make_tiny_model_dir
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama", family="llama",
                                 chat_format="chatml", init_std=0.2)
    with start_server(load_tiny(folder)) as server:
        yield server


def replies(server, schema, max_tokens: int, **fields) -> list[dict]:
    body = {"messages": USER, "max_tokens": max_tokens, "response_format": json_format(schema),
            **fields}
    reply = requests.post(server.url + "/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"]


@pytest.mark.parametrize("name", list(MODELS))
def test_every_reply_of_a_tiny_model_fits_the_pydantic_model(tiny_server, name):
    model = MODELS[name][0]
    schema = model_schema(name)
    room = close_cost(start_state(compile_schema(schema))) + 60
    for fields in ({"temperature": 0}, {"temperature": 1.2, "n": 3, "seed": 5}):
        for choice in replies(tiny_server, schema, min(room, 180), **fields):
            text = choice["message"]["content"]
            assert choice["finish_reason"] == "stop", text
            validate(json.loads(text), schema)
            model.model_validate_json(text)


# ---- the property test: random schemas of the served subset --------------------------------------
PATTERNS = [r"^\d{2,4}$", r"^[a-c]+(-[xy])?$", r"ab", r"^(red|green|blue)$", r"^\w\s?\w*$",
            r"[^a-z]", r"^[A-F0-9]{2}(:[A-F0-9]{2}){0,2}$"]
FORMATS = ["date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"]
SCALARS = ["string", "integer", "number", "boolean", "null", "enum", "const"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A random schema of the served subset, nested at most three deep (a recursive one at the
    root only: its $ref points from the root)."""
    nested = ["array", "object", "anyOf", "oneOf", "allOf"] if depth < 3 else []
    kind = rng.choice(SCALARS + nested + (["recursive"] if depth == 0 else []))
    if kind == "string":
        schema = {"type": "string"}
        low = rng.choice([0, 0, 1, 3])
        if rng.random() < 0.5:
            schema["minLength"] = low
        if rng.random() < 0.5:
            schema["maxLength"] = low + rng.choice([0, 2, 8])
        if rng.random() < 0.3:
            schema["pattern"] = rng.choice(PATTERNS[1:3] if "maxLength" in schema else PATTERNS)
            schema.pop("maxLength", None)
            schema.pop("minLength", None)
        elif rng.random() < 0.3:
            schema = {"type": "string", "format": rng.choice(FORMATS)}
        return schema
    if kind in ("integer", "number"):
        schema, low = {"type": kind}, rng.randint(-50, 50)
        for key, value in (("minimum", low), ("exclusiveMinimum", low - 1),
                           ("maximum", low + rng.randint(1, 30)),
                           ("exclusiveMaximum", low + rng.randint(31, 60))):
            if rng.random() < 0.4:
                schema[key] = value if kind == "integer" else value + rng.choice([0, 0.25])
        if kind == "integer" and rng.random() < 0.3:
            schema.update(multipleOf=rng.choice([2, 3, 5]), minimum=low, maximum=low + 40)
        return schema
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.sample(["a", "bc", 1, 2.5, None, True, [1, "x"], {"k": 0}], 3)}
    if kind == "const":
        return {"const": rng.choice(["on", 7, False, {"a": [None]}])}
    if kind == "array":
        schema = {"type": "array", "items": random_schema(rng, depth + 1),
                  "maxItems": rng.randint(0, 3)}
        if rng.random() < 0.4:
            schema["prefixItems"] = [random_schema(rng, depth + 1)
                                     for _ in range(rng.randint(1, 2))]
            schema["items"] = rng.choice([False, schema["items"]])
        schema["minItems"] = rng.randint(0, min(schema["maxItems"], 1))
        return schema
    if kind == "object":
        names = rng.sample(["a", "b", "c", "d"], rng.randint(0, 3))
        schema = {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
                  "required": [n for n in names if rng.random() < 0.6]}
        schema["additionalProperties"] = rng.choice(
            [False, True, {"type": "integer", "minimum": 0, "maximum": 9}])
        if schema["additionalProperties"] not in (False, True):
            schema["minProperties"] = rng.randint(0, len(names) + 1)
            schema["maxProperties"] = max(schema["minProperties"], len(schema["required"])) \
                + rng.randint(0, 2)
        return schema
    if kind == "allOf":               # objects that merge, a property in both
        return {"allOf": [{"type": "object", "properties": {"a": random_schema(rng, depth + 1)},
                           "required": ["a"]},
                          {"properties": {"b": random_schema(rng, depth + 1),
                                          "a": {"$ref": "#/$defs/Any"} if depth == 0 else {}},
                           "required": rng.choice([[], ["b"]])}],
                **({"$defs": {"Any": {"title": "anything"}}} if depth == 0 else {})}
    if kind == "recursive":
        return {"$defs": {"Node": {"type": "object", "required": ["v"], "properties": {
            "v": random_schema(rng, 2),
            "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
            "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}}},
            "$ref": "#/$defs/Node"}
    branches = [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if kind == "oneOf":               # disjoint: one branch per type
        types = rng.sample(["string", "integer", "boolean", "null", "array"], len(branches))
        branches = [{"type": t} for t in types]
    return {kind: branches}


def test_random_schemas_machine_walks_validate():
    rng = random.Random(49)
    for i in range(150):
        schema = random_schema(rng)
        node = compile_schema(schema)
        text = random_reply(node, rng, close_cost(start_state(node)) + rng.choice([0, 4, 30]))
        validate(json.loads(text), schema)


def test_random_schemas_tiny_model_replies_validate_within_max_tokens(tiny_server):
    rng = random.Random(4949)
    checked = 0
    while checked < 40:
        schema = random_schema(rng)
        shortest = close_cost(start_state(compile_schema(schema)))
        if shortest > 120:
            continue
        max_tokens = shortest + 2 + rng.choice([0, 5, 40])   # room for the shortest, and a stop
        fields = rng.choice([{"temperature": 0}, {"temperature": 1.3, "n": 2, "seed": checked}])
        for choice in replies(tiny_server, schema, max_tokens, **fields):
            assert choice["finish_reason"] == "stop", (schema, choice)
            validate(json.loads(choice["message"]["content"]), schema)
        checked += 1


# ---- the measurement: bench server --workload schema (minskill/measure/bench_schema.py) ------------------
class Address(BaseModel):
    street: str = Field(max_length=60)
    city: str
    postcode: str = Field(pattern=r"^\d{5}$")
    country: Literal["FR", "DE", "US", "GB"]


class Customer(BaseModel):
    id: uuid.UUID
    name: str = Field(min_length=1, max_length=40)
    email: str = Field(json_schema_extra={"format": "email"})
    since: datetime.date
    address: Address


class LineItem(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-\d{4}$")
    quantity: int = Field(gt=0, le=100)
    unit_price: float = Field(ge=0)
    discount: Optional[float] = Field(default=None, ge=0, lt=1)


class Card(BaseModel):
    kind: Literal["card"]
    last4: str = Field(pattern=r"^\d{4}$")


class Transfer(BaseModel):
    kind: Literal["transfer"]
    iban: str = Field(pattern=r"^[A-Z]{2}\d{2}[A-Z0-9]{10,30}$")


class Order(BaseModel):
    order_id: int
    created: datetime.datetime
    status: Literal["new", "paid", "shipped"]
    priority: int = Field(ge=1, le=5)
    customer: Customer
    items: list[LineItem] = Field(min_length=1, max_length=5)
    payment: Union[Card, Transfer] = Field(discriminator="kind")
    shipping: Address
    tags: dict[str, str] = Field(default_factory=dict, max_length=3)
    gift: bool = False
    coupon: Optional[str] = None
    note: Optional[str] = Field(default=None, max_length=100)
    total: float = Field(ge=0)


def test_the_bench_schema_is_what_pydantic_writes_for_a_30_field_model():
    from minskill.measure.bench_schema import ORDER_SCHEMA
    assert ORDER_SCHEMA == Order.model_json_schema()
    models = (Address, Customer, LineItem, Card, Transfer, Order)
    assert sum(len(m.model_fields) for m in models) == 30
    node, rng = compile_schema(ORDER_SCHEMA), random.Random(30)
    assert compile_schema(json.loads(json.dumps(ORDER_SCHEMA))) is node    # cached per schema
    for _ in range(3):
        Order.model_validate_json(random_reply(node, rng, close_cost(start_state(node)) + 40))


def test_bench_schema_reports_compile_time_and_the_cost_per_token(tmp_path, capsys):
    import argparse
    from minskill.measure.bench_schema import bench_schema
    from tiny import make_tiny_model_dir
    folder = make_tiny_model_dir(tmp_path / "tiny-llama", family="llama", chat_format="chatml")
    numbers = bench_schema(argparse.Namespace(model=str(folder), dtype="float32", quantize=None,
                                              max_tokens=12))
    assert numbers["compile ms"] >= 0 and numbers["compile again ms"] >= 0
    assert [numbers[k][0] for k in ("schema, first", "schema, again", "schema, 8 rows")] == \
        [12, 12, 12]
    assert numbers["free, 8 rows"][0] == numbers["free"][0]
    assert "over free" in capsys.readouterr().out
