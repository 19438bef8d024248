"""Tool calls: a chat request's `tools` and `tool_choice` read, and the calls parsed out of a reply.

A request's tools reach the model through its own chat template (minskill.nn.tokenizer renders
them: Qwen's Hermes-style <tools> block for ChatML, Llama 3.1's JSON in the first user turn). What
the model writes back is read as vLLM's tool parsers read it:

  * "hermes" (ChatML models): every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the
    last one may be left open); the text before the first is the reply's content;
  * "llama3_json" (Llama 3): a reply that starts with `{` (or `<|python_tag|>`) is one or more
    `{"name": ..., "parameters": {...}}` objects separated by `;`.

A reply whose calls do not all parse is plain content, as vLLM returns it. `tool_choice`:

  * "auto" (the default when tools are given): the model chooses; its calls are parsed as above;
  * "none": the tools are not shown to the model and nothing is parsed;
  * "required": the reply is constrained (minskill.serve.constrained) to a JSON array of one or more
    {"name": <a tool's name>, "arguments": <that tool's parameters>} objects (one with
    `parallel_tool_calls: false`), so it always parses unless max_tokens cuts it;
  * {"type": "function", "function": {"name": N}}: the reply is constrained to N's arguments.

Forced, the reply is JSON from its first token: no text comes before the call. A function's
arguments are constrained to its `parameters` where minskill.serve.json_schema serves that schema;
where it does not, a function with `strict: true` is a 400 naming the keyword and its pointer (in
any tool_choice, as OpenAI checks a strict schema), and one without is constrained to any JSON
object.

As vLLM does for "required" and a named function, the constrained reply is JSON only, not the
template's call syntax. A reply with calls is returned as message.tool_calls ({"id": "call_...",
"type": "function", "function": {"name", "arguments": JSON text}}), its content null when empty, and
finish_reason "tool_calls" (a reply cut by max_tokens keeps "length"). With `parallel_tool_calls:
false` an "auto" reply keeps its first call.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, replace

from minskill.serve.constrained import JsonFormat, response_schema
from minskill.serve.errors import bad_request
from minskill.serve.json_schema import SchemaError, compile_schema

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")        # OpenAI's rule for a function's name
# a closed call, or the last call left open
HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(?!.*<tool_call>)(.*)",
                         re.DOTALL)


@dataclass
class ToolUse:
    """What a request's tools ask of the reply: `tools` as sent (for the template), `choice` "auto",
    "required" or "function" (then `name`), `parallel` whether several calls may come."""
    tools: list[dict]
    choice: str
    name: str | None = None
    parallel: bool = True
    schema: JsonFormat | None = None    # "required" and a named function: the reply's constraint


# ---- the request fields --------------------------------------------------------------------------
def tool_use(payload: dict) -> ToolUse | None:
    """The ToolUse a chat request body asks for (None: no tools, or tool_choice "none"), or a 400
    naming the field at fault."""
    tools = payload.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise bad_request(f"'tools' must be a list of {{\"type\": \"function\", \"function\": "
                          f"{{...}}}}, got {type(tools).__name__}", "tools")
    parameters = {_tool_name(tool, i): _parameters(tool, i) for i, tool in enumerate(tools)}
    if len(parameters) < len(tools):
        raise bad_request("'tools' names a function twice: names must be unique", "tools")
    parameters = {name: _served(schema, tools[i], f"tools[{i}].function")   # strict: a 400 here
                  for i, (name, schema) in enumerate(parameters.items())}
    parallel = payload.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request(f"'parallel_tool_calls' must be true or false, got {parallel!r:.40}",
                          "parallel_tool_calls")
    choice = payload.get("tool_choice")
    if choice is None:
        choice = "auto"
    if choice not in ("none", "auto") and response_schema(payload) is not None:
        raise bad_request("'response_format' and a 'tool_choice' that forces a call both constrain "
                          "the reply: give one", "response_format")
    if choice not in ("none", "auto", "required"):
        name = _named_choice(choice, parameters)
        return ToolUse(tools, "function", name, parallel is not False,
                       _format(parameters[name], f"tools[{list(parameters).index(name)}].function."
                                                 "parameters"))
    if choice == "required" and not tools:
        raise bad_request("'tool_choice' is \"required\" but 'tools' is empty", "tool_choice")
    if choice == "none" or not tools:
        return None
    use = ToolUse(tools, choice, None, parallel is not False)
    if choice == "required":
        use.schema = _format(calls_schema(parameters, use.parallel), "tools")
    return use


def tool_turn(message: dict, i: int) -> dict:
    """The tool keys of messages[i] for the chat template: an assistant's tool_calls as a client
    replays them (each call's arguments, JSON text, read into an object), a tool turn's
    tool_call_id; the deprecated `function` role and `function_call` are a 400."""
    role, calls = message.get("role"), message.get("tool_calls")
    if role == "function" or message.get("function_call"):
        where = f"messages[{i}].{'role' if role == 'function' else 'function_call'}"
        raise bad_request(f"{where}: the deprecated function-call fields are not implemented (use "
                          f"tool_calls and 'tool' turns)", where, "unsupported_field")
    if role == "tool":
        call_id = message.get("tool_call_id")
        return {"tool_call_id": call_id} if isinstance(call_id, str) else {}
    if not calls:
        return {}
    if role != "assistant" or not isinstance(calls, list):
        raise bad_request(f"messages[{i}].tool_calls must be a list, in an assistant turn",
                          f"messages[{i}].tool_calls")
    return {"tool_calls": [_replayed_call(call, f"messages[{i}].tool_calls[{k}]")
                           for k, call in enumerate(calls)]}


def _replayed_call(call, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
            or not isinstance(function.get("arguments"), str):
        raise bad_request(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": "
                          f"{{\"name\", \"arguments\": JSON text}}}}, got {json.dumps(call)[:100]}",
                          where)
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError as error:
        raise bad_request(f"{where}.function.arguments is not valid JSON: {error}",
                          f"{where}.function.arguments")
    return {"id": call.get("id"), "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}


def calls_schema(parameters: dict, parallel: bool) -> dict:
    """The JSON Schema of a "required" reply: an array of calls of the given tools. Each tool's
    parameters sit in $defs under its name, their local $refs (pydantic's #/$defs/...) rebased
    there, so they still point where they did."""
    calls = {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"enum": [name]},
                                          "arguments": {"$ref": f"#/$defs/{name}"}},
         "required": ["name", "arguments"], "additionalProperties": False}
        for name in parameters]},
        "$defs": {name: _rebased(schema, f"#/$defs/{name}") for name, schema in parameters.items()}}
    return calls if parallel else {**calls, "maxItems": 1}


def _rebased(schema, root: str):
    """`schema` with each local $ref ("#..." ) read from `root` instead of the document's root."""
    if isinstance(schema, list):
        return [_rebased(s, root) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: root + value[1:] if key == "$ref" and isinstance(value, str)
            and value.startswith("#") else value if key in _VALUES else _rebased(value, root)
            for key, value in schema.items()}


_VALUES = ("const", "enum", "default", "examples")     # JSON values, not schemas: kept as they are


def _tool_name(tool, i: int) -> str:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(
            tool.get("function"), dict):
        raise bad_request(f"'{where}' must be {{\"type\": \"function\", \"function\": "
                          f"{{\"name\", \"description\", \"parameters\"}}}}, got "
                          f"{json.dumps(tool)[:100]}", where)
    name = tool["function"].get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad_request(f"'{where}.function.name' must be 1 to 64 letters, digits, '_', '.' or "
                          f"'-', got {name!r:.80}", f"{where}.function.name")
    description = tool["function"].get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"'{where}.function.description' must be a string",
                          f"{where}.function.description")
    return name


def _parameters(tool: dict, i: int):
    schema = tool["function"].get("parameters")
    if schema is None:
        return {"type": "object"}
    if not isinstance(schema, dict):
        raise bad_request(f"'tools[{i}].function.parameters' must be a JSON Schema object",
                          f"tools[{i}].function.parameters")
    return schema


def _served(schema, tool: dict, where: str):
    """The schema a tool's arguments are constrained to: its `parameters` where the decoder serves
    them; where it does not, a 400 naming the keyword when the function is `strict`, else any JSON
    object (the call still parses)."""
    strict = tool["function"].get("strict")
    if strict not in (None, True, False):
        raise bad_request(f"'{where}.strict' must be true or false, got {strict!r:.40}",
                          f"{where}.strict")
    try:
        compile_schema(schema)
    except (SchemaError, RecursionError) as error:
        if strict:
            problem = f"at {error}" if isinstance(error, SchemaError) else "is nested too deeply"
            raise bad_request(f"'{where}.parameters' {problem} (the function is strict)",
                              f"{where}.parameters", "unsupported_schema")
        return {"type": "object"}
    return schema


def _named_choice(choice, parameters: dict) -> str:
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" \
            or not isinstance(name, str):
        raise bad_request(f"'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": "
                          f"\"function\", \"function\": {{\"name\": ...}}}}, got "
                          f"{json.dumps(choice)[:100]}", "tool_choice")
    if name not in parameters:
        raise bad_request(f"'tool_choice' names the function {name!r}, which is not in 'tools' "
                          f"({', '.join(parameters) or 'none'})", "tool_choice.function.name")
    return name


def _format(schema, where: str) -> JsonFormat:
    try:
        return JsonFormat(where, compile_schema(schema))
    except SchemaError as error:
        raise bad_request(f"'{where}' at {error}", where, "unsupported_schema")
    except RecursionError:
        raise bad_request(f"'{where}' is nested too deeply", where, "unsupported_schema")


# ---- the reply -----------------------------------------------------------------------------------
def with_tool_calls(choice, use: ToolUse | None, style: str):
    """`choice` (a backends.Choice) with the calls its text holds moved to .tool_calls (module
    docstring); as it is when the request has no tools or the text holds no call that parses."""
    if use is None:
        return choice
    content, calls = parsed_calls(choice.text, use, style)
    if not calls:
        return choice
    if not use.parallel:
        calls = calls[:1]
    tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                   "function": {"name": name,
                                "arguments": json.dumps(arguments, ensure_ascii=False)}}
                  for name, arguments in calls]
    finish = "tool_calls" if choice.finish_reason == "stop" else choice.finish_reason
    return replace(choice, text=content, finish_reason=finish, tool_calls=tool_calls)


def parsed_calls(text: str, use: ToolUse, style: str) -> tuple[str, list[tuple[str, object]]]:
    """(content, [(name, arguments), ...]) of a reply; (text, []) where its calls do not parse."""
    if use.choice == "function":
        arguments = _json(text)
        return ("", [(use.name, arguments)]) if isinstance(arguments, dict) else (text, [])
    if use.choice == "required":
        calls = _json(text)
        if not isinstance(calls, list):
            return text, []
        return "", _calls(calls, "arguments")
    if style == "llama3_json":
        return _llama3_calls(text)
    return _hermes_calls(text)


def _hermes_calls(text: str) -> tuple[str, list]:
    if "<tool_call>" not in text:
        return text, []
    found = [_json(closed or open_) for closed, open_ in HERMES_CALL.findall(text)]
    calls = _calls(found, "arguments")
    if not calls:
        return text, []
    return text[:text.index("<tool_call>")].rstrip(), calls


def _llama3_calls(text: str) -> tuple[str, list]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            value, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return text, []
        found.append(value)
        while at < len(body) and body[at] in "; \n\t":
            at += 1
    calls = _calls(found, "parameters")
    return ("", calls) if calls else (text, [])


def _calls(found: list, arguments_key: str) -> list:
    """[(name, arguments)] of calls that all parse ({"name": str, key: object}), else []."""
    calls = []
    for call in found:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return []
        arguments = call.get(arguments_key, call.get("arguments", {}))
        if not isinstance(arguments, dict):
            return []
        calls.append((call["name"], arguments))
    return calls


def _json(text: str | None):
    try:
        return json.loads(text or "")
    except json.JSONDecodeError:
        return None
