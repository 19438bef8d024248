"""MASA's teacher asked for the JSON schema its reply is read in (minskill/masa/reply_schema.py: the
schemas of the shapes minskill/masa/teacher.py's readers take, and the asking): the schemas are in
the subset minskill's server serves, hold no more skills than a reply may, fit the reply budget and
agree with the JSON form the prompts show; a tiny random model behind minskill's server,
constrained to them, writes replies that always parse; a server that refuses response_format (a
ScriptedBackend) is asked again in free text, once per client, and said so once; `on` makes the
refusal an error, `off` never asks; the search asks each step in its own schema (the task rewrite
in its type's); the call cache keys response_format."""
import json
from functools import partial

import jsonschema
import pytest

from helpers import NumberedTeacher, scripted_search
from minskill.masa import reply_schema
from minskill.masa.model_card import ModelCard
from minskill.masa.reply_schema import (CHARS_PER_TOKEN, MAX_SKILLS, attribution_schema,
                                        longest_reply, shortest_reply, skillset_schema,
                                        strengths_schema)
from minskill.masa.teacher import (ATTRIBUTION_TASK, GENERAL_REWRITE_TASK, TASK_REWRITE_TASK,
                                   NothingToTrim, ask_fitting, ask_teacher,
                                   general_rewrite_messages, one_shot_rewrite,
                                   parse_attribution, parse_skillset_reply, parse_strengths,
                                   task_rewrite_messages)
from minskill.replies import extract_json
from minskill.serve.client import ChatError
from minskill.serve.json_schema import compile_schema
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet

READERS = {"attribution": (parse_attribution, attribution_schema),
           "model summary": (parse_strengths, strengths_schema),
           "general rewrite": (parse_skillset_reply, skillset_schema),
           "task rewrite": (parse_skillset_reply, partial(skillset_schema, task_types=["math"],
                                                          general=False)),
           "one-shot rewrite": (parse_skillset_reply, partial(skillset_schema,
                                                              task_types=["math", "qa"]))}
PROMPT = [{"role": "user", "content": "Write the reply in JSON."}]


def prompt(trim=0):   # a prompt builder (ask_fitting's): nothing to trim
    if trim:
        raise NothingToTrim("nothing to drop")
    return PROMPT


class Recorder:
    """A teacher client that keeps each call's response_format (None: none) and its reply."""

    def __init__(self, client):
        self.client, self.formats, self.replies = client, [], []

    def chat(self, messages, **kwargs):
        self.formats.append(kwargs.get("response_format"))
        result = self.client.chat(messages, **kwargs)
        self.replies.append(result.texts[0])
        return result


@pytest.mark.parametrize("max_tokens", [64, 384, 1536, 8192])
@pytest.mark.parametrize("what", list(READERS))
def test_each_schema_is_served_and_fits_the_reply_budget(what, max_tokens):
    schema = READERS[what][1](max_tokens)
    compile_schema(schema)   # within json_schema.py's subset (else SchemaError, a 400)
    jsonschema.Draft202012Validator.check_schema(schema)
    if max_tokens >= 384:   # (below, the texts' floor of MIN_TEXT characters may not fit)
        assert longest_reply(schema) <= max_tokens * CHARS_PER_TOKEN
    assert all(set(node["required"]) == set(node["properties"]) and not node["additionalProperties"]
               for node in objects(schema))   # OpenAI's strict mode


def objects(schema):
    if schema["type"] == "object":
        yield schema
        for value in schema["properties"].values():
            yield from objects(value)
    elif schema["type"] == "array":
        yield from objects(schema["items"])


def test_a_skill_set_schema_never_allows_more_skills_than_a_reply_may_hold():
    for types in ([], ["a"], [f"type-{i}" for i in range(30)]):
        for general in (True, False) if types else (True,):
            schema = skillset_schema(100_000, task_types=types, general=general)
            typed = schema["properties"].get("task_specific_skills", {"properties": {}})
            lists = ([schema["properties"]["general_skills"]] if general else []) + list(
                typed["properties"].values())
            assert lists and sum(s["maxItems"] for s in lists) <= MAX_SKILLS
            assert all(s["minItems"] == 1 for s in lists)


def test_the_rewrite_prompts_show_the_json_form_their_schema_takes():
    card, skills = ModelCard(name="t"), SkillSet(general=[], task_specific={}, common_mistakes=[])
    general = general_rewrite_messages(card, skills, 0.5, None, [], json_reply=True)
    typed = task_rewrite_messages(card, skills, "math", 0.5, None, [], json_reply=True)
    general, typed = general[1]["content"], typed[1]["content"]
    for content, schema in ((general, skillset_schema(1536)),
                            (typed, skillset_schema(1536, task_types=["math"], general=False))):
        shown = extract_json(content[content.index("Reply with JSON"):])
        jsonschema.validate(shown, schema)
        assert parse_skillset_reply(json.dumps(shown)).skills()
    markdown = general_rewrite_messages(card, skills, 0.5, None, [])[1]["content"]
    assert "Reply with JSON" not in markdown and "---\nname: answer-format" in markdown


# ---- replies constrained by minskill's server (a tiny random model: it writes anything it may) --

@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from test_constrained_decoding import load_tiny
    from tiny import make_tiny_model_dir
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama", family="llama",
                                 chat_format="chatml", init_std=0.2, max_position_embeddings=4096)
    with start_server(load_tiny(folder)) as server:
        yield server


@pytest.mark.parametrize("what", list(READERS))
def test_a_constrained_teacher_reply_always_parses(tiny_server, what):
    parse, schema = READERS[what]
    teacher, skips = Recorder(tiny_server.client(timeout=300)), []
    for temperature, seed in ((0.0, 0), (1.0, 1), (1.0, 2)):
        result = ask_fitting(ask_teacher, teacher, prompt, parse, what=what,
                             schema=schema, retries=0, temperature=temperature,
                             max_tokens=256, seed=seed, on_skip=skips.append)
        assert result is not None, skips
    assert skips == [] and len(teacher.replies) == 3
    for sent, reply in zip(teacher.formats, teacher.replies):
        assert sent["type"] == "json_schema" and sent["json_schema"]["strict"] is True
        assert sent["json_schema"]["schema"] == schema(256)
        jsonschema.validate(json.loads(reply), schema(256))   # the reply is the JSON alone


def test_the_one_shot_rewrite_parses_constrained(tiny_server):
    base = SkillSet.from_json({"general_skills": [],
                               "task_specific_skills": {"math": [], "qa": []}})
    teacher, skips = Recorder(tiny_server.client(timeout=300)), []
    out = one_shot_rewrite(teacher, ModelCard(name="t"), base, "qa tasks", retries=0,
                                max_tokens=600, on_skip=skips.append)
    assert out is not None and out.general and teacher.formats[0] is not None, skips
    assert list(teacher.formats[0]["json_schema"]["schema"]["properties"]["task_specific_skills"]
                ["properties"]) == ["math", "qa"]


def test_a_skill_set_schema_asks_only_for_the_types_whose_empty_reply_fits_half_the_budget():
    types = [f"type-{i}" for i in range(12)]
    for max_tokens in (128, 384, 1536):
        for general in (True, False):
            schema = skillset_schema(max_tokens, types, general)
            typed = schema["properties"].get("task_specific_skills", {"properties": {}})
            asked = list(typed["properties"])
            assert asked == types[:len(asked)] and len(asked) >= 1 - general
            assert len(asked) <= 1 - general or shortest_reply(schema) <= max_tokens // 2
    assert len(skillset_schema(1536, types)["properties"]["task_specific_skills"]["properties"]) > 3


# ---- a server that refuses the field: free text from then on --------------------------------

ATTRIBUTION = '{"failure_categories": [{"category": "format", "count": 1}], "summary": "s"}'


@pytest.fixture()
def refusing_server():
    with start_server(ScriptedBackend(lambda messages, request: "Here: " + ATTRIBUTION,
                                      name="teacher")) as server:
        yield server


def test_a_refusal_falls_back_to_free_text_once_per_client(refusing_server, capsys):
    teacher = Recorder(refusing_server.client())
    for seed in (0, 1):
        out = ask_fitting(ask_teacher, teacher, prompt, parse_attribution,
                          what="attribution", retries=0, seed=seed)
        assert out["failure_categories"][0]["category"] == "format"
    assert [f is not None for f in teacher.formats] == [True, False, False]   # refused: free text
    assert not reply_schema.asks_json(teacher, "auto") and reply_schema.asks_json(teacher, "on")
    err = capsys.readouterr().err
    assert err.count("refused response_format json_schema") == 1 and "'response_format'" in err
    other = Recorder(refusing_server.client())       # another client asks again, and is told again
    ask_fitting(ask_teacher, other, prompt, parse_attribution, what="attribution",
                retries=0)
    assert [f is not None for f in other.formats] == [True, False]
    assert capsys.readouterr().err.count("refused response_format") == 1


def test_on_makes_the_refusal_an_error_and_off_never_asks(refusing_server):
    with pytest.raises(ChatError, match="--teacher-json-schema on"):
        ask_fitting(ask_teacher, refusing_server.client(), prompt, parse_attribution,
                    what="attribution", retries=0, json_schema="on")
    teacher = Recorder(refusing_server.client())
    out = ask_fitting(ask_teacher, teacher, prompt, parse_attribution,
                      what="attribution", retries=0, json_schema="off")
    assert out["summary"] == "s" and teacher.formats == [None]
    with pytest.raises(ValueError, match="--teacher-json-schema must be one of auto, on, off"):
        reply_schema.asks_json(teacher, "always")


# ---- the search asks each step in its schema ----------------------------------------------

class SchemaNumberedTeacher(NumberedTeacher):
    """helpers.NumberedTeacher that keeps each call's (task, schema's top-level shape)."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def chat(self, messages, **kwargs):
        schema = kwargs["response_format"]["json_schema"]["schema"]
        typed = schema["properties"].get("task_specific_skills", {}).get("properties", {})
        content = messages[1]["content"]
        self.asked.append((content.split("\n")[0], list(schema["properties"]), list(typed),
                           "Reply with JSON" in content))
        return super().chat(messages, **kwargs)


def test_the_search_asks_each_step_in_its_schema_and_reads_the_reply():
    search = scripted_search([0.5, 0.6], iterations=1, tree_iterations=1)
    search.teacher = SchemaNumberedTeacher()
    lines = [line for line in search.run() if line]
    assert search.phase == "done" and len(lines) == 4
    asked = search.teacher.asked
    assert asked[0][:2] == (f"## Task: {ATTRIBUTION_TASK}", ["failure_categories", "summary"])
    assert asked[1] == (f"## Task: {GENERAL_REWRITE_TASK}",
                        ["general_skills", "common_mistakes"], [], True)
    assert asked[3] == (f"## Task: {TASK_REWRITE_TASK} of type 'qa'", ["task_specific_skills"],
                        ["qa"], True)
    assert [s.name for s in search.library().task_specific["qa"]] == ["rewrite-1"]


def test_a_cached_call_is_keyed_by_its_response_format_too(tmp_path):
    """CachingClient.chat passes response_format on and keys it: a constrained call and a free one
    of the same messages are two calls (serve/caching.py)."""
    from minskill.serve.caching import CachingClient
    from minskill.serve.client import ChatResult

    class Inner:
        model, sent = "m", []

        def chat_many(self, requests, return_exceptions=False):
            self.sent.extend(requests)
            return [ChatResult([json.dumps(r.get("response_format"))], ["stop"], 1, 1)
                    for r in requests]

    inner = Inner()
    cached = CachingClient(inner, tmp_path / "cache.jsonl")
    constrained = {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": {"type": "object"}}}
    first = cached.chat(PROMPT, response_format=constrained).texts[0]
    assert json.loads(first) == constrained and inner.sent[0]["response_format"] == constrained
    assert cached.chat(PROMPT).texts[0] == "null" and cached.calls == 2
    again = cached.chat(PROMPT, response_format=constrained).texts[0]
    assert again == first and cached.cache_hits == 1
