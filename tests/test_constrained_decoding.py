"""JSON-constrained decoding in minskill.serve (serve.constrained), with a tiny random model over
HTTP.

A random model writes anything, so it is the hard case: every reply, greedy and sampled, chat and
legacy, parses and validates against its schema (the `jsonschema` package is the reference), over
the schemas of tests/test_json_schema.py; a reply closes within max_tokens, or says it was cut;
streaming, stop strings, n > 1 with a seed, the prefix cache and continuous batching keep working; a
row's reply does not depend on the batch; vLLM's spellings are served; what is not served is a 400
naming it; the official openai client's `beta.chat.completions.parse` fills a pydantic model. With
--slow, the real default model: 200 constrained replies validate, and the mask's cost per token is
printed (batch 1 and 8)."""
import json
import time

import pytest
import requests

from minskill.serve.request_parsing import parse_chat_request
from minskill.serve.json_machine import close_cost, start_state
from minskill.serve.json_schema import compile_schema
from minskill.serve.server import ModelBackend, start_server
from test_json_schema import SCHEMAS, validate

USER = [{"role": "user", "content": "Write the answer as JSON."}]


def json_format(schema) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def post(server, body, path="/chat/completions"):
    return requests.post(server.url + path, json=body, timeout=120)


def contents(reply) -> list[str]:
    return [c["message"]["content"] if "message" in c else c["text"] for c in reply["choices"]]


def load_tiny(tiny_dir, **kwargs):
    from minskill.nn.tokenizer import Tokenizer
    from minskill.nn.weights import load_pretrained
    return ModelBackend(load_pretrained(tiny_dir).eval(), Tokenizer.from_pretrained(tiny_dir),
                        "tiny", **kwargs)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tiny import make_tiny_model_dir
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama", family="llama",
                               chat_format="chatml", init_std=0.2)


@pytest.fixture(scope="module")
def tiny_backend(tiny_dir):
    return load_tiny(tiny_dir)


@pytest.fixture(scope="module")
def tiny_server(tiny_backend):
    with start_server(tiny_backend) as server:
        yield server


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_reply_greedy_and_sampled_validates(tiny_server, name):
    schema = SCHEMAS[name][0]
    max_tokens = max(120, min(2 * close_cost(start_state(compile_schema(schema))), 180))   # to close
    for fields in ({"temperature": 0}, {"temperature": 1.5, "n": 3, "seed": 7}):
        reply = post(tiny_server, {"messages": USER, "max_tokens": max_tokens,
                                   "response_format": json_format(schema), **fields}).json()
        for choice, text in zip(reply["choices"], contents(reply)):
            assert choice["finish_reason"] == "stop", text
            validate(json.loads(text), schema)


def test_legacy_completions_and_json_object(tiny_server):
    for body in ({"prompt": "The answer in JSON:", "response_format": {"type": "json_object"}},
                 {"prompt": ["a", "b"], "response_format": json_format(SCHEMAS["nested"][0]),
                  "n": 2}):
        reply = post(tiny_server, {**body, "max_tokens": 100, "temperature": 1.5, "seed": 3},
                     "/completions")
        for text in contents(reply.json()):
            value = json.loads(text)
            assert isinstance(value, dict)
            if body["response_format"]["type"] == "json_schema":
                validate(value, SCHEMAS["nested"][0])


def test_vllm_spellings_are_served(tiny_server):
    schema = SCHEMAS["local_ref"][0]
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)},
                  {"structured_outputs": {"json": schema}},
                  {"structured_outputs": {"json_object": True}}):
        reply = post(tiny_server, {"messages": USER, "max_tokens": 100, "temperature": 1.0,
                                   "seed": 1, **extra})
        value = json.loads(contents(reply.json())[0])
        if "json_object" not in str(extra):
            validate(value, schema)


def test_a_reply_closes_within_max_tokens_or_says_it_was_cut(tiny_server, tiny_backend):
    schema = SCHEMAS["nested"][0]
    shortest = close_cost(start_state(compile_schema(schema)))     # bytes; a token holds one at least
    for max_tokens in (shortest + 1, shortest + 6):
        reply = post(tiny_server, {"messages": USER, "max_tokens": max_tokens, "temperature": 1.5,
                                   "n": 4, "seed": 5,
                                   "response_format": json_format(schema)}).json()
        assert reply["usage"]["completion_tokens"] <= 4 * max_tokens
        for choice, text in zip(reply["choices"], contents(reply)):
            assert choice["finish_reason"] == "stop"
            validate(json.loads(text), schema)
    cut = post(tiny_server, {"messages": USER, "max_tokens": 3,
                             "response_format": json_format(schema)}).json()
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 3


def test_streaming_and_stop_strings(tiny_server):
    body = {"messages": USER, "max_tokens": 80, "temperature": 1.5, "seed": 2, "n": 2,
            "response_format": json_format(SCHEMAS["skill_set"][0])}
    plain = contents(post(tiny_server, body).json())
    streamed = ["", ""]
    with requests.post(tiny_server.url + "/chat/completions", json={**body, "stream": True},
                       stream=True, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    streamed[choice["index"]] += choice["delta"].get("content") or ""
    assert streamed == plain
    for text in plain:
        validate(json.loads(text), SCHEMAS["skill_set"][0])
    # always has a "title"
    body = {**body, "n": 1, "response_format": json_format(SCHEMAS["nested"][0])}
    whole = contents(post(tiny_server, body).json())[0]
    stopped = post(tiny_server, {**body, "stop": ["title"]}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert contents(stopped)[0] == whole[:whole.index('"title') + 1]


def test_a_seeded_request_repeats_and_its_samples_differ(tiny_server):
    body = {"messages": USER, "max_tokens": 60, "temperature": 1.5, "seed": 11, "n": 3,
            "response_format": json_format(SCHEMAS["nested"][0])}
    first = contents(post(tiny_server, body).json())
    again = contents(post(tiny_server, body).json())
    assert first == again and len(set(first)) > 1


def test_a_rows_reply_does_not_depend_on_its_batch(tiny_dir):
    """Batch-invariant engine: a constrained request alone, and beside an unconstrained one and
    another schema's, gives the same tokens (a row's mask reads only its own tokens)."""
    backend = load_tiny(tiny_dir, batch_invariant=True)

    def request(extra):
        return parse_chat_request({"messages": USER, "max_tokens": 60, "temperature": 0, **extra},
                                  backend)
    constrained = {"response_format": json_format(SCHEMAS["nested"][0])}
    alone = backend.complete([request(constrained)])[0]
    crowd = backend.complete([request({}), request(constrained), request(
        {"response_format": json_format(SCHEMAS["object"][0])})])
    assert [c.text for c in crowd[1]] == [c.text for c in alone]
    assert crowd[0][0].text != alone[0].text


@pytest.mark.parametrize("kwargs", [{"prefix_cache_mb": 16, "scheduler": "continuous"},
                                    {"scheduler": "continuous"}])
def test_the_prefix_cache_and_continuous_batching(tiny_dir, kwargs):
    schema = SCHEMAS["local_ref"][0]
    with start_server(load_tiny(tiny_dir, **kwargs)) as server:
        for _ in range(2):          # the second time, the prompt is in the prefix cache
            reply = post(server, {"messages": USER, "max_tokens": 100, "temperature": 1.5, "n": 2,
                                  "seed": 4, "response_format": json_format(schema)}).json()
            for text in contents(reply):
                validate(json.loads(text), schema)


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": json_format({"type": "string", "pattern": "(a)\\1"})},
     "response_format.json_schema.schema", "#/pattern: the escape \\1"),
    ({"response_format": json_format({"type": "object", "properties": {"tags": {
        "type": "array", "uniqueItems": True}}})}, "response_format.json_schema.schema",
     "#/properties/tags/uniqueItems: keyword 'uniqueItems' is not served"),
    ({"guided_json": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, "guided_json",
     "#/oneOf: branches 0 and 1 may both match"),
    ({"guided_json": {"type": "object", "properties": {"t": {"uniqueItems": True}}}},
     "guided_json", "#/properties/t/uniqueItems"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex",
     "reads json, json_object"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "not valid JSON"),
    ({"response_format": {"type": "json_object"}, "guided_json": {}}, "guided_json", "give one"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema", "'schema'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}}},
     "response_format.json_schema.extra", "not implemented"),
])
def test_what_is_not_served_is_a_400_naming_it(tiny_server, body, param, words):
    for path, base in (("/chat/completions", {"messages": USER}),
                       ("/completions", {"prompt": "hi"})):
        reply = post(tiny_server, {**base, **body}, path)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param and words in error["message"], error


def test_openai_client_parse_fills_a_pydantic_model(tiny_server):
    openai = pytest.importorskip("openai")
    pydantic = pytest.importorskip("pydantic")

    class Step(pydantic.BaseModel):
        title: str
        score: int

    class Plan(pydantic.BaseModel):
        name: str
        steps: list[Step]
        done: bool
        note: str | None

    client = openai.OpenAI(base_url=tiny_server.url, api_key="none")
    for seed in range(3):
        completion = client.beta.chat.completions.parse(model="tiny", messages=USER,
                                                        response_format=Plan, max_tokens=150,
                                                        temperature=1.0, seed=seed)
        plan = completion.choices[0].message.parsed
        assert isinstance(plan, Plan) and all(isinstance(s, Step) for s in plan.steps)


# ---- the real default model (--slow) -------------------------------------------------------------
@pytest.fixture(scope="module")
def real_backend():
    return ModelBackend.from_spec("smollm2-135m", scheduler="continuous")


@pytest.mark.slow
def test_real_model_200_constrained_replies_validate(real_backend):
    """200 replies: each schema of SCHEMAS, greedy and sampled, each parsed and validated."""
    names, valid, total = list(SCHEMAS), 0, 0
    with start_server(real_backend) as server:
        for i in range(200 // 8):
            name = names[i % len(names)]
            body = {"messages": [{"role": "user",
                                  "content": f"Give an example of {name.replace('_', ' ')} "
                                             "data as JSON."}],
                    "max_tokens": 200, "n": 8, "seed": i, "temperature": 0.0 if i % 3 == 0 else 0.8,
                    "response_format": json_format(SCHEMAS[name][0])}
            for text in contents(post(server, body).json()):
                total += 1
                validate(json.loads(text), SCHEMAS[name][0])
                valid += 1
    print(f"\nreal model: {valid} of {total} constrained replies parse and validate")
    assert valid == total == 200


@pytest.mark.slow
def test_real_model_mask_cost_per_token(real_backend):
    """Prints the engine's time per decoded token, constrained against unconstrained, at batch 1 and
    8 (a measurement: nothing is asserted about it)."""
    schema = SCHEMAS["skill_set"][0]
    # reads the vocabulary
    real_backend.complete([parse_chat_request({"messages": USER, "max_tokens": 4,
                                               "response_format": json_format(schema)},
                                              real_backend)])
    for batch in (1, 8):
        for name, extra in (("free", {}),
                            ("json_object", {"response_format": {"type": "json_object"}}),
                            ("json_schema", {"response_format": json_format(schema)})):
            requests_ = [parse_chat_request({"messages": USER, "max_tokens": 64, "temperature": 0.8,
                                             "seed": 0, "n": batch, **extra}, real_backend)]
            started = time.perf_counter()
            [choices] = real_backend.complete(requests_)
            tokens = sum(c.completion_tokens for c in choices)
            ms = 1000 * (time.perf_counter() - started) / tokens
            print(f"\nbatch {batch} {name:12s} {ms:.2f} ms per token ({tokens} tokens)")
