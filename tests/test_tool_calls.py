"""Tool calls in minskill.serve (serve.tool_calls, nn.tokenizer's tool rendering), as agent
frameworks send them.

The tools, an assistant's tool_calls and tool turns are rendered as HF renders each real template
(Qwen2.5, Qwen3, Llama 3.1/3.2; SmolLM2 gets the documented Hermes fallback); calls are parsed out
of a reply as vLLM's Hermes and llama3_json parsers read them, returned with ids and finish_reason
"tool_calls", also streamed, through the official openai client and minskill's ChatClient; with
tool_choice "required" or a named function a tiny random model's calls always parse and their
arguments validate against the tool's schema; what is wrong is a 400 naming the field."""
import json

import jsonschema
import pytest
import requests
import transformers

from minskill.nn.tokenizer import HERMES_TOOLS_HEAD, HERMES_TOOLS_TAIL, Tokenizer
from minskill.serve.client import ChatClient
from minskill.serve.backends import ModelBackend, ScriptedBackend
from minskill.serve.server import start_server
from minskill.serve.tool_calls import ToolUse, parsed_calls
from tiny import TEMPLATES, make_tiny_tokenizer_dir

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "Weather in a city, ünï",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": ADD}}]
USER = [{"role": "user", "content": "Weather in Paris, and 2 + 3?"}]


def call(name, arguments, id_="call_1"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


HISTORY = [{"role": "system", "content": "Be brief."}, *USER,
           {"role": "assistant", "content": "",
            "tool_calls": [call("get_weather", {"city": "Paris", "unit": "C"}),
                           call("add", {"a": 2, "b": 3}, "call_2")]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
           {"role": "tool", "tool_call_id": "call_2", "content": "5"},
           {"role": "assistant", "content": "Sunny; 5."},
           {"role": "user", "content": "Thanks. Berlin?"}]
ONE_CALL = [*USER, {"role": "assistant", "content": "Let me look.",
                    "tool_calls": [call("get_weather", {"city": "Paris", "unit": "C"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


# ---- rendering -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    out = {}
    for name in TEMPLATES:
        path = make_tiny_tokenizer_dir(tmp_path_factory.mktemp(name.replace(".", "_")), name)
        out[name] = (Tokenizer.from_pretrained(path),
                     transformers.PreTrainedTokenizerFast.from_pretrained(path))
    return out


@pytest.mark.parametrize("messages", [HISTORY, ONE_CALL], ids=["parallel", "one-call"])
@pytest.mark.parametrize("template", ["qwen2.5", "qwen3", "llama3", "llama3.1"])
def test_tools_render_as_the_template_renders_them(tokenizers, template, messages):
    mine, hf = tokenizers[template]
    kwargs = {"date_string": "05 Mar 2025"} if template.startswith("llama") else {}
    if template.startswith("llama") and messages is HISTORY:    # Llama 3 takes one call per turn
        with pytest.raises(ValueError, match="single tool-calls"):
            mine.render_chat(messages, tools=TOOLS, **kwargs)
        return
    text = hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False,
                                  enable_thinking=False, **kwargs)
    assert mine.render_chat(messages, tools=TOOLS, **kwargs) == text
    assert mine.apply_chat_template(messages, tools=TOOLS, **kwargs) == \
        hf(text, add_special_tokens=False)["input_ids"]
    assert json.dumps(TOOLS[1]) in text or json.dumps(TOOLS[1], indent=4) in text


def test_smollm2_gets_the_hermes_fallback(tokenizers):
    mine, _ = tokenizers["chatml"]
    listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in TOOLS)
    system = (f"<|im_start|>system\n{mine.default_system}\n\n{HERMES_TOOLS_HEAD}{listed}"
              f"{HERMES_TOOLS_TAIL}<|im_end|>\n")
    assert mine.render_chat(ONE_CALL, tools=TOOLS) == (
        system + "<|im_start|>user\nWeather in Paris, and 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\nLet me look.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


# ---- parsing -------------------------------------------------------------------------------------
AUTO = ToolUse(TOOLS, "auto")
PARSED = [  # (style, text, content, calls)
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "",
     [("add", {"a": 1, "b": 2})]),
    ("hermes", 'Sure.\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
               '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}', "Sure.",
     [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]),
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>', None, []),
    ("hermes", "no call here", None, []),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}}', "",
     [("add", {"a": 1, "b": 2})]),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; '
                    '{"name": "get_weather", "parameters": {"city": "Rome"}}', "",
     [("add", {"a": 1}), ("get_weather", {"city": "Rome"})]),
    ("llama3_json", "The answer is {not json}", None, [])]


@pytest.mark.parametrize("style, text, content, calls", PARSED)
def test_calls_are_parsed_as_vllm_parses_them(style, text, content, calls):
    got_content, got_calls = parsed_calls(text, AUTO, style)
    assert got_calls == calls
    assert got_content == (text if content is None else content)


# ---- over HTTP: a scripted model -----------------------------------------------------------------
def scripted(messages, request):
    if request.tool_use is None:
        return "plain answer"
    if messages[-1]["role"] == "tool":
        return f"It is {messages[-1]['content']}."
    return ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"unit": "C"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, '
            '"b": 3}}\n</tool_call>')


@pytest.fixture(scope="module")
def scripted_server():
    with start_server(ScriptedBackend(scripted, name="scripted", max_context=4096)) as server:
        yield server


def test_openai_client_gets_tool_calls_and_replays_them(scripted_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=scripted_server.url, api_key="none")
    reply = client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "C"}), ("add", {"a": 2, "b": 3})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") and c.type == "function"
                                                   for c in calls)
    history = [*USER, choice.message.model_dump(exclude_none=True),
               *({"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in calls)]
    again = client.chat.completions.create(model="scripted", messages=history, tools=TOOLS)
    assert again.choices[0].message.content == "It is sunny."
    assert again.choices[0].finish_reason == "stop"
    assert not again.choices[0].message.tool_calls
    one = client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS,
                                         parallel_tool_calls=False)
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]
    none = client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS,
                                          tool_choice="none")
    assert none.choices[0].message.content == "plain answer"
    assert none.choices[0].finish_reason == "stop"


def test_openai_client_streams_tool_calls(scripted_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=scripted_server.url, api_key="none")
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS,
                                                stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or ():
            entry = calls.setdefault(piece.index, {"id": piece.id, "name": "", "arguments": ""})
            entry["name"] += piece.function.name or ""
            entry["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Checking." and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris", "unit": "C"}), ("add", {"a": 2, "b": 3})]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_minskill_client_sends_tools_and_reads_tool_calls(scripted_server):
    client = ChatClient(scripted_server.url, "scripted")
    result = client.chat(USER, tools=TOOLS, tool_choice="auto")
    assert result.finish_reasons == ["tool_calls"] and result.text == "Checking."
    assert [c["function"]["name"] for c in result.tool_calls[0]] == ["get_weather", "add"]
    assert client.chat(USER).tool_calls is None


BAD = [  # (fields, param)
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"s": {"type": "array", "uniqueItems": True}}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
     "tools[0].function.strict"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls")]


@pytest.mark.parametrize("fields, param", BAD, ids=[p for _, p in BAD])
def test_bad_tool_fields_are_a_400_naming_the_field(scripted_server, fields, param):
    reply = requests.post(scripted_server.url + "/chat/completions",
                          json={"messages": USER, **fields}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_tools_stay_refused_on_legacy_completions(scripted_server):
    reply = requests.post(scripted_server.url + "/completions",
                          json={"prompt": "hi", "tools": TOOLS}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools"


# ---- a tiny random model: forced calls always parse ----------------------------------------------
@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory):
    from tiny import make_tiny_model_dir
    from minskill.nn.weights import load_pretrained
    path = make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-qwen", family="qwen2",
                               chat_format="qwen2.5", init_std=0.2, max_position_embeddings=2048)
    return ModelBackend(load_pretrained(path).eval(), Tokenizer.from_pretrained(path), "tiny")


@pytest.fixture(scope="module")
def tiny_server(tiny_backend):
    with start_server(tiny_backend) as server:
        yield server


def as_sent(message: dict) -> dict:
    """A message as a client sends it: each call's arguments as JSON text."""
    if "tool_calls" not in message:
        return message
    return {**message, "tool_calls": [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
        for c in message["tool_calls"]]}


def test_the_model_reads_the_tools_through_its_template(tiny_server, tiny_backend):
    for messages in (USER, ONE_CALL):
        reply = requests.post(tiny_server.url + "/chat/completions", timeout=60, json={
            "messages": [as_sent(m) for m in messages], "tools": TOOLS, "max_tokens": 2}).json()
        assert reply["usage"]["prompt_tokens"] == len(tiny_backend.tokenizer.apply_chat_template(
            messages, tools=TOOLS))


@pytest.mark.parametrize("tool_choice", [
    "required", {"type": "function", "function": {"name": "get_weather"}},
    {"type": "function", "function": {"name": "add"}}],
    ids=["required", "named-weather", "named-add"])
def test_forced_calls_always_parse_and_validate(tiny_server, tool_choice):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tiny_server.url, api_key="none")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed in range(3):
        reply = client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS,
                                               tool_choice=tool_choice, temperature=1.0, seed=seed,
                                               n=2, max_tokens=60)
        for choice in reply.choices:
            assert choice.finish_reason == "tool_calls", choice
            assert choice.message.tool_calls
            for made in choice.message.tool_calls:
                if isinstance(tool_choice, dict):
                    assert made.function.name == tool_choice["function"]["name"]
                arguments = json.loads(made.function.arguments)
                jsonschema.validate(arguments, schemas[made.function.name])
    fields = dict(model="tiny", messages=USER, tools=TOOLS, tool_choice=tool_choice, temperature=0,
                  max_tokens=60)
    streamed = client.chat.completions.create(stream=True, **fields)
    pieces = [c.choices[0].delta.tool_calls for c in streamed
              if c.choices and c.choices[0].delta.tool_calls]
    greedy = client.chat.completions.create(**fields)
    assert [(p.function.name, p.function.arguments) for piece in pieces for p in piece] == \
        [(c.function.name, c.function.arguments) for c in greedy.choices[0].message.tool_calls]


def test_a_forced_call_cut_by_max_tokens_says_length(tiny_server):
    reply = requests.post(tiny_server.url + "/chat/completions", timeout=60, json={
        "messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 3}).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert "tool_calls" not in reply["choices"][0]["message"]


# issue 49: forced calls under the schemas pydantic sends; strict and unserved parameters
BOOK = {"type": "function", "function": {"name": "book", "strict": True, "parameters": {
    "type": "object", "additionalProperties": False, "required": ["day", "guests", "seat"],
    "properties": {
        "day": {"type": "string", "format": "date"},
        "guests": {"type": "integer", "exclusiveMinimum": 0, "maximum": 8},
        "seat": {"oneOf": [{"type": "object", "properties": {"kind": {"const": "table"},
                                                             "size": {"enum": [2, 4]}},
                            "required": ["kind", "size"], "additionalProperties": False},
                           {"type": "object", "properties": {"kind": {"const": "bar"}},
                            "required": ["kind"], "additionalProperties": False}],
                 "discriminator": {"propertyName": "kind"}},
        "note": {"type": "string", "pattern": "^[A-Z][a-z ]{0,10}$"}}}}}
PETS = {"type": "function", "function": {"name": "adopt", "strict": True, "parameters": {
    "$defs": {"Pet": {"type": "object", "required": ["kind", "age"], "properties": {
        "kind": {"enum": ["cat", "dog"]}, "age": {"type": "integer", "minimum": 0, "maximum": 20},
        "friend": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]}}}},
    "type": "object", "properties": {"pet": {"$ref": "#/$defs/Pet"}}, "required": ["pet"]}}}
UNSERVED = {"type": "function", "function": {"name": "tag", "parameters": {
    "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}


@pytest.mark.parametrize("tool_choice", ["required",
                                         {"type": "function", "function": {"name": "book"}},
                                         {"type": "function", "function": {"name": "adopt"}}])
def test_forced_calls_under_pydantic_keywords_validate_with_formats(tiny_server, tool_choice):
    """From the first token the reply is the call: content empty, arguments valid against the
    tool's parameters (their $defs too, under "required" as well), formats checked (jsonschema's
    draft 2020-12 format checker)."""
    validator, tools = jsonschema.Draft202012Validator, [BOOK, PETS, *TOOLS]
    for seed in range(3):
        reply = requests.post(tiny_server.url + "/chat/completions", timeout=120, json={
            "messages": USER, "tools": tools, "tool_choice": tool_choice, "n": 2,
            "temperature": 1.0, "seed": seed, "max_tokens": 150}).json()
        for choice in reply["choices"]:
            assert choice["finish_reason"] == "tool_calls", choice
            assert not choice["message"]["content"]
            for made in choice["message"]["tool_calls"]:
                tool = next(t for t in tools if t["function"]["name"] == made["function"]["name"])
                validator(tool["function"]["parameters"],
                          format_checker=validator.FORMAT_CHECKER).validate(
                    json.loads(made["function"]["arguments"]))


def test_parallel_tool_calls_false_forces_one_call(tiny_server):
    for seed in range(3):
        reply = requests.post(tiny_server.url + "/chat/completions", timeout=120, json={
            "messages": USER, "tools": TOOLS, "tool_choice": "required", "seed": seed,
            "parallel_tool_calls": False, "temperature": 1.5, "max_tokens": 100}).json()
        assert len(reply["choices"][0]["message"]["tool_calls"]) == 1


def test_an_unserved_schema_without_strict_is_constrained_to_an_object(tiny_server):
    for tool_choice in ("required", {"type": "function", "function": {"name": "tag"}}):
        reply = requests.post(tiny_server.url + "/chat/completions", timeout=120, json={
            "messages": USER, "tools": [UNSERVED], "tool_choice": tool_choice,
            "temperature": 1.0, "seed": 1, "max_tokens": 60}).json()
        [made] = reply["choices"][0]["message"]["tool_calls"]
        assert made["function"]["name"] == "tag"
        assert isinstance(json.loads(made["function"]["arguments"]), dict)


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_a_strict_unserved_schema_is_a_400_naming_keyword_and_pointer(tiny_server, tool_choice):
    strict = {"type": "function", "function": {**UNSERVED["function"], "strict": True}}
    reply = requests.post(tiny_server.url + "/chat/completions", timeout=60, json={
        "messages": USER, "tools": [*TOOLS, strict], "tool_choice": tool_choice})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "tools[2].function.parameters"
    assert "#/properties/tags/uniqueItems: keyword 'uniqueItems' is not served" in error["message"]
