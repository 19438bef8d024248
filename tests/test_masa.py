"""Unit tests of MASA stage 1: the model card (minskill/masa/model_card.py), the reward, reading teacher replies
(minskill/masa/teacher.py), teacher retries/skips, hill climbing (minskill/masa/search.py), the target-call cache
and budget (minskill/serve/caching.py), augmentations and SFT records (minskill/masa/data.py).
(UCB1 itself: tests/test_ucb.py.)"""
import json
import random
from functools import partial

import pytest

from masa_records import check_sft_record
from helpers import run_climb, scripted_search
from minskill.masa import data as masa_data, model_card, search as masa
from minskill.masa.model_card import ModelCard
from minskill.masa.reply_schema import MAX_SKILLS
from minskill.masa.teacher import (ATTRIBUTION_TASK, GENERAL_REWRITE_TASK, ONESHOT_TASK,
                                   NothingToTrim, TeacherReplyError, ask_fitting, ask_teacher,
                                   attribution_messages, general_rewrite_messages,
                                   one_shot_rewrite, oneshot_messages,
                                   parse_attribution, parse_skillset_reply, parse_strengths,
                                   strengths_messages, task_rewrite_messages, trim_levels,
                                   trimmed)
from minskill.replies import extract_json
from minskill.rollout import Trajectory, summarize
from minskill.serve.caching import BudgetExhausted, CachingClient, CallBudget
from minskill.serve.client import ChatError, ChatResult
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from minskill.tasks.base import is_context_refusal


def skillset(general=("alpha one. alpha two. alpha three.",), typed=None) -> SkillSet:
    return SkillSet(general=[Skill(name=f"g-{i}", description=f"general skill {i}", body=body, metadata={})
                             for i, body in enumerate(general)],
                    task_specific={t: [Skill(name=f"{t}-{i}", description=f"{t} skill", body=b, metadata={})
                                       for i, b in enumerate(bodies)] for t, bodies in (typed or {}).items()},
                    common_mistakes=["guessing"])


# ---------------------------------------------------------------------------------------------- model card

def write_config(tmp_path, **config):
    folder = tmp_path / "SmolThing-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


SMOLLM2_135M = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=576,
                    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, tie_word_embeddings=True)


def test_model_card_from_config_fills_architecture(tmp_path):
    card = model_card.model_card_from_config(write_config(tmp_path, **SMOLLM2_135M), alignment_method="SFT+DPO")
    assert card.family == "Llama" and card.architecture == "LlamaForCausalLM"
    assert (card.num_layers, card.hidden_size, card.num_attention_heads, card.num_kv_heads) == (30, 576, 9, 3)
    assert card.context_window == 8192 and card.vocab_size == 49152
    # SmolLM2-135M has 134,515,008 parameters (tied embeddings)
    assert card.parameter_count == 134_515_008 and card.variant == "135M"
    assert card.base_or_instruct == "instruct" and card.alignment_method == "SFT+DPO"
    assert card.name == "SmolThing-Instruct"


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_parameter_count_matches_transformers(model_type):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = dict(model_type=model_type, vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                  tie_word_embeddings=model_type != "llama")
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cls[model_type](**config))
    reference = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert model_card.estimate_parameter_count(config) == reference


def test_model_card_json_round_trip_and_errors(tmp_path):
    card = ModelCard(name="m", family="Qwen3", parameter_count=8_000_000_000, multilingual=True,
                     strengths=["facts"], weaknesses=["arithmetic", "format"])
    card.save(tmp_path / "card.json")
    assert ModelCard.load(tmp_path / "card.json") == card
    (tmp_path / "bad.json").write_text('{"name": "m", "sizee": 3}')
    with pytest.raises(ValueError, match=r"bad.json.*unknown field\(s\) \['sizee'\]"):
        ModelCard.load(tmp_path / "bad.json")
    (tmp_path / "bad2.json").write_text('{"num_layers": "thirty"}')
    with pytest.raises(ValueError, match="'num_layers' must be a non-negative integer"):
        ModelCard.load(tmp_path / "bad2.json")
    (tmp_path / "bad3.json").write_text('{"name": ')
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelCard.load(tmp_path / "bad3.json")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        model_card.model_card_from_config(tmp_path)
    # lenient reading of other tools' cards (rewrite.py's minimal card has multilingual "unknown", family None)
    loose = model_card.as_model_card({"family": None, "multilingual": "unknown", "num_layers": 2, "extra": 1})
    assert loose.family == "unknown" and loose.multilingual is None and loose.num_layers == 2


def test_adjusted_reward():
    """R = SR − λ·NHR, computed once (rollout.summarize), is the reward the search reads."""
    def traj(i, success, nothing_happens, steps):
        return Trajectory(task_id=f"t{i}", task_type="x", messages=[], success=success, reward=float(success),
                          steps=steps, nothing_happens=nothing_happens)
    # SR = 3/4; NHR = mean(1/2, 1/2, 1/2, 1/2) = 0.5
    trajs = [traj(0, True, 1, 2), traj(1, True, 2, 4), traj(2, True, 1, 2), traj(3, False, 3, 6)]
    assert summarize(trajs, lam_nh=0.1)["adjusted_reward"] == pytest.approx(0.70)
    assert summarize(trajs, lam_nh=0.0)["adjusted_reward"] == 0.75
    assert masa._metrics(summarize(trajs, lam_nh=0.1))["adjusted_reward"] == pytest.approx(0.70)


# ------------------------------------------------------------------------------------------ reply parsing

def test_extract_json_from_fences_and_prose():
    assert extract_json('Sure!\n```json\n{"a": [1, 2]}\n```\nHope that helps.') == {"a": [1, 2]}
    assert extract_json('Analysis: {"a": 1} and that is {not json}') == {"a": 1}
    assert extract_json('noise {bad json} then {"b": {"c": 3}} end') == {"b": {"c": 3}}
    with pytest.raises(TeacherReplyError, match="no JSON object in the reply 'I think the model"):
        parse_strengths("I think the model is bad at math.")   # a teacher reply: quoted


def test_parse_attribution_normalises_shape():
    reply = ('Here:\n```json\n{"failure_categories": [{"category": "format", "count": 2, "evidence": "t1: no number",'
             ' "suggested_fix": "end with Answer: N"}, "arithmetic"], "summary": "two kinds"}\n```')
    att = parse_attribution(reply)
    assert att["failure_categories"][0] == {"category": "format", "count": 2, "evidence": ["t1: no number"],
                                            "suggested_fix": "end with Answer: N"}
    assert att["failure_categories"][1]["category"] == "arithmetic"
    assert att["summary"] == "two kinds"
    with pytest.raises(TeacherReplyError, match="no 'failure_categories' list"):
        parse_attribution('{"summary": "x"}')


def test_parse_skillset_reply_markdown_and_json():
    s = skillset(general=("Say the answer last.",), typed={"math": ["Add carefully."]})
    assert parse_skillset_reply("Here you go:\n\n" + s.to_markdown()).to_json() == s.to_json()
    js = parse_skillset_reply("```json\n" + json.dumps(s.to_json()) + "\n```")
    assert js.to_json() == s.to_json()
    with pytest.raises(TeacherReplyError):
        parse_skillset_reply("I cannot help with that.")
    too_many = skillset(general=tuple(f"body {i}" for i in range(MAX_SKILLS + 1)))
    with pytest.raises(TeacherReplyError, match="at most"):
        parse_skillset_reply(json.dumps(too_many.to_json()))


class FakeTeacher:
    """Replies from a list, recording the conversations it was sent."""

    def __init__(self, replies):
        self.replies, self.sent = list(replies), []

    def chat(self, messages, **kwargs):
        self.sent.append((messages, kwargs))
        return ChatResult([self.replies.pop(0)], ["stop"], 0, 0)


def test_ask_teacher_retries_then_succeeds():
    teacher = FakeTeacher(["no json here", '{"strengths": ["facts"], "weaknesses": []}'])
    skips = []
    out = ask_teacher(teacher, [{"role": "user", "content": "q"}], parse_strengths, what="x",
                      retries=2, seed=10, on_skip=skips.append)
    assert out == {"strengths": ["facts"], "weaknesses": []} and skips == []
    retry_messages, retry_kwargs = teacher.sent[1]
    assert retry_messages[1] == {"role": "assistant", "content": "no json here"}
    assert "could not be read" in retry_messages[2]["content"] and retry_kwargs["seed"] == 11


def test_ask_teacher_skips_after_bounded_retries():
    teacher = FakeTeacher(["nope"] * 5)
    skips = []
    out = ask_teacher(teacher, [{"role": "user", "content": "q"}], parse_attribution,
                      what="attribution", retries=2, on_skip=skips.append)
    assert out is None and len(teacher.sent) == 3
    assert skips[0]["what"] == "attribution" and skips[0]["attempts"] == 3 and len(skips[0]["errors"]) == 3
    assert skips[0]["last_reply"] == "nope"


DEEP_REPLIES = ["[" * 1000, '{"failure_categories": ' + "[" * 5000, "[" * 500 + "]" * 500,
                '{"general_skills": [{"skill_id": "a", "principle": "b", "when_to_apply": "c"}], "junk": '
                + "[" * 500 + "]" * 500 + "}"]


@pytest.mark.parametrize("reply", DEEP_REPLIES, ids=["unclosed", "unclosed-in-object", "closed", "in-a-library"])
def test_deeply_nested_teacher_replies_are_reply_errors(reply):
    """Every teacher-reply reader refuses JSON nested past 64 levels with TeacherReplyError (the error ask_teacher
    retries and skips on), never RecursionError; a deep value that decodes is not kept either (it overflowed the
    stack when the search checkpointed)."""
    for parse in (parse_attribution, parse_strengths, parse_skillset_reply):
        with pytest.raises(TeacherReplyError):
            parse(reply)
    teacher = FakeTeacher([reply, '{"strengths": ["facts"], "weaknesses": []}'])
    out = ask_teacher(teacher, [{"role": "user", "content": "q"}], parse_strengths, what="x",
                      retries=1)
    assert out == {"strengths": ["facts"], "weaknesses": []} and len(teacher.sent) == 2   # retried, not crashed


# ---------------------------------------------------------------------------------------------- prompts too long

REFUSALS = {   # (HTTP status, the server's message) -> whether it is a refusal of a prompt too long for the context
    "llama.cpp": (400, "the request exceeds the available context size, try increasing it", True),
    "llama.cpp, older": (400, "the request exceeds the available context size. try increasing the context size or "
                              "enable context shift", True),
    "vLLM": (400, "This model's maximum context length is 2048 tokens. However, you requested 2103 tokens (1079 in "
                  "the messages, 1024 in the completion). Please reduce the length of the messages or completion.",
             True),
    "vLLM, newer": (400, "The prompt (total length 2103) is too long to fit into the model (maximum context length "
                         "2048). Make sure that `max_model_len` is no smaller than the number of text tokens.", True),
    "OpenAI": (400, "This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 "
                    "tokens. Please reduce the length of the messages.", True),
    "minskill": (400, "the prompt has 5000 tokens but the model's context is 4096 tokens (and the reply needs at "
                      "least one)", True),
    "another 400": (400, "'temperature' must be a number, got the string 'hot'", False),
    "max_tokens": (400, "'max_tokens' must be at most 4096 (the model's context), got 9000", False),
    "a 500": (500, "This model's maximum context length is 2048 tokens.", False),
    "no reply": (None, "connection refused", False),
}


@pytest.mark.parametrize("status, message, expected", list(REFUSALS.values()), ids=list(REFUSALS))
def test_a_refusal_of_a_prompt_too_long_is_recognised_by_status_and_message(status, message, expected):
    assert is_context_refusal(ChatError(message, status, "http://x/v1/chat/completions")) is expected
    assert not is_context_refusal(RuntimeError(message))


def test_minskill_servers_own_refusal_of_a_long_prompt_is_recognised():
    """Through HTTP: a ScriptedBackend of 8 tokens' context refuses a longer prompt with its 400, which the client
    raises as a ChatError that is_context_refusal recognises."""
    with start_server(ScriptedBackend(lambda messages, request: "ok", max_context=8)) as server:
        client = server.client()
        assert client.chat([{"role": "user", "content": "one two"}], max_tokens=2).texts == ["ok"]
        with pytest.raises(ChatError) as refused:
            client.chat([{"role": "user", "content": "word " * 20}], max_tokens=2)
    assert refused.value.status == 400 and is_context_refusal(refused.value)


def test_a_prompt_list_is_halved_at_each_trim_level_then_the_next_lists():
    items, more = list(range(5)), list(range(3))
    assert [len(trimmed(items, k)) for k in range(4)] == [5, 2, 1, 0]
    with pytest.raises(NothingToTrim):
        trimmed(items, 4)
    assert trimmed(items, 5, more) == [] and trim_levels(more) == 2
    with pytest.raises(NothingToTrim):
        trimmed(items, 6, more)
    with pytest.raises(NothingToTrim):
        trimmed([], 1)
    # a builder with two lists (the model summary's episodes): the solved ones go first, then the failed ones
    episode = {"task_id": "t", "task_type": "qa", "question": "q?", "reply": "r", "transcript": ""}
    shown = [strengths_messages(ModelCard(name="m"), [episode] * 3, [episode] * 2, "stats", k)[1]["content"]
             for k in range(5)]
    counts = [(p.split("### Failed")[0].count("- task "), p.split("### Failed")[1].count("- task ")) for p in shown]
    assert counts == [(2, 3), (1, 3), (0, 3), (0, 1), (0, 0)]
    with pytest.raises(NothingToTrim):
        strengths_messages(ModelCard(name="m"), [episode] * 3, [episode] * 2, "stats", 5)


class ContextTeacher(FakeTeacher):
    """A FakeTeacher behind a server of `limit` characters of context: a longer conversation is refused (HTTP 400,
    as llama.cpp refuses it), and `refused` counts those."""

    def __init__(self, replies, limit):
        super().__init__(replies)
        self.limit, self.refused = limit, []

    def chat(self, messages, **kwargs):
        if sum(len(m["content"]) for m in messages) > self.limit:
            self.refused.append(messages)
            raise ChatError("the request exceeds the available context size, try increasing it", 400, "http://x")
        return super().chat(messages, **kwargs)


def test_a_prompt_too_long_is_sent_again_with_less_history_then_skipped():
    """search.MasaSearch.ask's step (teacher.ask_fitting around ask_teacher): a prompt the server refuses for its
    length is built again at the next trim level (fewer top sets here) until it fits, and `on_trim` says so; when
    even the shortest is refused, the step is a skip ("prompt too long"), never the server's error."""
    card, sets = ModelCard(name="tiny"), [(skillset(general=(f"set number {i} " * 40,)), 0.1 * i) for i in range(5)]
    prompt = partial(general_rewrite_messages, card, skillset(), 0.5, None, sets)
    full, shortest = (sum(len(m["content"]) for m in prompt(trim=k)) for k in (0, trim_levels(sets)))
    assert [prompt(trim=k)[1]["content"].count("#### Set") for k in range(4)] == [5, 2, 1, 0]
    reply = SkillSet(general=[Skill(name="new", description="d", body="b", metadata={})]).to_markdown()
    skips, trims = [], []
    teacher = ContextTeacher([reply], limit=(full + shortest) // 2)
    out = ask_fitting(ask_teacher, teacher, prompt, parse_skillset_reply, what="general rewrite",
                      retries=0, on_skip=skips.append, on_trim=trims.append)
    assert [s.name for s in out.general] == ["new"] and skips == []
    sent = teacher.sent[0][0][1]["content"]
    assert teacher.refused and sent.count("#### Set") < 5 and sent == prompt(trim=trims[0]["trim"])[1]["content"]
    assert trims[0]["what"] == "general rewrite" and len(trims[0]["errors"]) == len(teacher.refused)
    teacher = ContextTeacher([reply], limit=shortest - 1)
    assert ask_fitting(ask_teacher, teacher, prompt, parse_skillset_reply,
                       what="general rewrite", retries=0, on_skip=skips.append) is None
    assert teacher.sent == [] and len(teacher.refused) == trim_levels(sets) + 1
    assert skips[0]["reason"] == "prompt too long" and skips[0]["attempts"] == len(teacher.refused)
    assert "exceeds the available context size" in skips[0]["errors"][-1]


def test_another_failure_of_the_teacher_passes_on():
    class Failing:
        def chat(self, messages, **kwargs):
            raise ChatError("'temperature' must be a number", 400, "http://x")
    with pytest.raises(ChatError):
        ask_fitting(ask_teacher, Failing(), partial(oneshot_messages, ModelCard(name="t"),
                                                    skillset(), "qa"),
                    parse_skillset_reply, what="one-shot rewrite")


def test_prompts_carry_their_inputs():
    card = ModelCard(name="tiny", weaknesses=["adds badly"])
    s = skillset(general=("Always end with Answer: N.",), typed={"math": ["Carry the one."]})
    failures = [{"task_id": "t1", "task_type": "math", "question": "2+2?", "expected": "4", "reply": "5",
                 "transcript": "", "error": None}]
    att = attribution_messages(card, s, failures, 0.25, task_type="math")[1]["content"]
    assert ATTRIBUTION_TASK in att and "adds badly" in att and "2+2?" in att and "Carry the one." in att
    gen = general_rewrite_messages(card, s, 0.25, {"failure_categories": []},
                                   [(s, 0.5), (skillset(general=("older set",)), 0.25)])[1]["content"]
    assert GENERAL_REWRITE_TASK in gen and "R = 0.500" in gen and "older set" in gen
    assert "Carry the one." not in gen  # only general skills are rewritten here
    task = task_rewrite_messages(card, s, "math", 0.25, None, ["2+2?"])[1]["content"]
    assert "type 'math'" in task and "Carry the one." in task and "2+2?" in task


# ---------------------------------------------------------------------------------------------- hill climbing

def scripted_climb(rewards, base_reward, iterations, patience, skipped=()):
    """MasaSearch.run's climb where the teacher's rewrite k has reward rewards[k] (tests/helpers.py:scripted_search);
    returns (search, the last state the climb yielded, each candidate's accepted flag)."""
    search = scripted_search(rewards, base_reward, skipped=skipped, iterations=iterations, patience=patience)
    saved = run_climb(search)
    return search, saved, [x.accepted for x in search.candidates[1:]]


def best_rewrite(search) -> str:
    return search.climb.best.skills.general[0].name


def test_hill_climb_rejects_equal_and_worse():
    s, _, verdicts = scripted_climb([0.5, 0.4, 0.7, 0.7, 0.9], 0.5, iterations=5, patience=5)
    assert verdicts == [False, False, True, False, True]   # equal (0.5, then 0.7) is rejected
    assert best_rewrite(s) == "rewrite-4" and s.climb.best.reward == 0.9 and s.climb.iteration == 5
    assert s.evaluated == [None, 0, 1, 2, 3, 4]             # the base, then each candidate once


def test_hill_climb_stops_after_patience():
    s, _, verdicts = scripted_climb([0.4, 0.6, 0.6, 0.5, 0.6, 0.99, 1.0], 0.5, iterations=10, patience=3)
    # accepted at 2nd proposal, then 3 non-improving proposals -> stop; 0.99 is never tried
    assert verdicts == [False, True, False, False, False] and s.teacher.rewrites == 5
    assert best_rewrite(s) == "rewrite-1" and s.climb.stale == 3 and s.climb.iteration == 5


def test_hill_climb_skipped_proposal_counts_against_patience_and_resumes():
    s, saved, verdicts = scripted_climb([], 0.0, iterations=10, patience=2, skipped=range(100))
    assert s.climb.iteration == 2 and s.climb.stale == 2 and s.teacher.rewrites == 2
    assert verdicts == [] and s.evaluated == [None]          # skipped rewrites make no candidate, are never evaluated
    assert [e["what"] for e in s.events] == ["general rewrite"] * 2
    # a saved state continues where it stopped (the base is not evaluated again)
    again = scripted_search([0.5] * 10, 0.0, state=json.loads(json.dumps(saved)), iterations=10, patience=3)
    run_climb(again)
    assert again.climb.best.skills.general[0].name == "rewrite-0" and again.evaluated == [0, 1, 2, 3]
    assert again.climb.iteration == 6 and again.climb.stale == 3   # 1 accept + 3 equal


def test_hill_climb_stops_at_max_reward():
    s, _, verdicts = scripted_climb([0.6, 1.0, 0.2], 0.5, iterations=10, patience=3)
    assert s.teacher.rewrites == 2 and best_rewrite(s) == "rewrite-1" and s.climb.best.reward == 1.0  # nothing beats 1


def test_tree_phase_skips_failed_rewrites_and_stops_once_the_best_reaches_one():
    s = scripted_search([0.2, 0.5, 1.0, 0.3], 0.0, skipped=(1,), iterations=0, tree_iterations=10, max_children=3)
    lines = list(s.run())
    tree = s.trees["qa"]
    # the root (the base: R = 0), then rewrite 0 (0.2), rewrite 1 skipped (no child), rewrite 2 (1.0): stop
    assert tree.iterations == 3 and s.teacher.rewrites == 3 and s.evaluated == [None, None, 0, 2]
    assert [c.reward for c in tree.root.children] == [0.2, 1.0] and tree.root.visits == 3
    assert s.library().task_specific["qa"][0].name == "rewrite-2" and s.to_json()["phase"] == "done"
    assert lines[2:] == ["[tree qa] root: R = 0.000 on 4 episodes  calls 0",      # its progress lines; None: a phase ends
                         "[tree qa] iteration 1/10: expanded node 0, child R = 0.200; best R = 0.200; calls 0",
                         "[tree qa] iteration 2/10: expanded node 0, child skipped; best R = 0.200; calls 0",
                         "[tree qa] iteration 3/10: expanded node 0, child R = 1.000; best R = 1.000; calls 0", None]
    assert [e["what"] for e in s.events] == ["task rewrite"]          # the skip, which the script prints
    at_one = scripted_search([], 1.0, iterations=5, tree_iterations=5)
    list(at_one.run())                                       # R = 1 from the start: nothing is asked
    assert at_one.teacher.rewrites == 0 and at_one.trees["qa"].iterations == 0


# --------------------------------------------------------------------------------------- cache and budget

class CountingInner:
    model = "m"

    def __init__(self):
        self.sent = []

    def chat_many(self, requests, return_exceptions=False):
        self.sent.extend(requests)
        return [ChatResult([f"reply to {r['messages'][-1]['content']} seed {r.get('seed')}"], ["stop"], 3, 4)
                for r in requests]


def test_caching_client_hits_after_restart_and_keys_on_everything(tmp_path):
    path = tmp_path / "cache.jsonl"
    inner = CountingInner()
    client = CachingClient(inner, path)
    msgs = [{"role": "user", "content": "hi"}]
    first = client.chat(msgs, seed=1)
    assert client.chat(msgs, seed=1).texts == first.texts and len(inner.sent) == 1
    client.chat(msgs, seed=2)                     # seed is part of the key
    client.chat(msgs, seed=1, temperature=0.5)    # so are the sampling parameters
    client.chat([{"role": "user", "content": "hi "}], seed=1)  # and the exact messages
    assert len(inner.sent) == 4
    restarted = CachingClient(CountingInner(), path)
    out = restarted.chat_many([dict(messages=msgs, seed=1), dict(messages=msgs, seed=2)])
    assert restarted.inner.sent == [] and restarted.stats["cache_hits"] == 2
    assert out[0].texts == first.texts and out[0].prompt_tokens == 3
    other_model = CachingClient(CountingInner(), path, model="other")
    other_model.chat(msgs, seed=1)
    assert len(other_model.inner.sent) == 1      # the model is part of the key
    # a torn last line (killed mid-append) is dropped on load
    with open(path, "a") as f:
        f.write('{"key": "abc", "res')
    assert len(CachingClient(CountingInner(), path)._cache) == 5


def test_caching_client_disabled_and_budget():
    inner = CountingInner()
    budget = CallBudget(max_calls=3)
    client = CachingClient(inner, None, budget)
    msgs = [{"role": "user", "content": "x"}]
    client.chat(msgs)
    client.chat(msgs)                              # no cache: paid twice
    assert len(inner.sent) == 2 and budget.spent == 2
    with pytest.raises(BudgetExhausted, match="2 of 3 calls used, 2 more needed"):
        client.chat_many([dict(messages=msgs), dict(messages=msgs)])
    assert budget.refusals > 0 and len(inner.sent) == 2
    results = client.chat_many([dict(messages=msgs)] * 2, return_exceptions=True)
    assert all(isinstance(r, BudgetExhausted) for r in results)
    client.chat(msgs)                              # one still fits
    assert budget.spent == 3


# --------------------------------------------------------------------------------- augmentations and SFT

def test_augmentations():
    best = skillset(general=("One two three. Four five six. Seven eight nine. Ten eleven twelve.",) * 3,
                    typed={"a": ["A one. A two."], "b": ["B one."]})
    rng = random.Random(0)
    partial = masa_data.augment_partial(best, rng, 0.6)
    n_kept = len(partial.general) + sum(len(v) for v in partial.task_specific.values())
    assert n_kept == round(0.6 * 5)
    verbose = masa_data.augment_verbose(best, rng)
    assert all(len(v.body) > len(b.body) for v, b in zip(verbose.general, best.general))
    assert sum(f in verbose.general[0].body for f in masa_data.FILLER) == 3
    noisy = masa_data.augment_noise(best, random.Random(1), 0.3)
    words = set(best.general[0].body.replace(".", " ").split())
    changed = [n.body != b.body for n, b in zip(noisy.general, best.general)]
    assert any(changed)
    assert all(set(n.body.replace(".", " ").split()) <= words for n in noisy.general)  # nothing new added
    assert masa_data.augment_noise(best, random.Random(1), 0.0).to_json() == best.to_json()


def test_sft_records_well_formed():
    card = ModelCard(name="t")
    cands = [{"reward": 0.1 * i, "skills": skillset(general=(f"version {i}.",)).to_json()} for i in range(7)]
    best = skillset(general=("best version.",))
    records = masa_data.sft_records({"candidates": cands}, card, "tasks", best, 0.9, "t",
                               oneshot=skillset(general=("teacher version.",)), seed=0, copies=2)
    sources = [r["source"] for r in records]
    assert sources[:4] == ["early", "middle", "late", "teacher_oneshot"]
    assert sources.count("noise") == sources.count("partial") == sources.count("verbose") == 2
    for i, r in enumerate(records):
        check_sft_record(r, f"record {i}")
        assert r["skills_out"] == best.to_json() and r["reward_out"] == 0.9 and r["target_model"] == "t"
    early = SkillSet.from_json(records[0]["skills_in"]).general[0].body
    late = SkillSet.from_json(records[2]["skills_in"]).general[0].body
    assert early in ("version 0.", "version 1.") and late in ("version 4.", "version 5.", "version 6.")
    with pytest.raises(ValueError, match="lacks field 'source'"):
        check_sft_record({k: v for k, v in records[0].items() if k != "source"})
    with pytest.raises(ValueError, match="unknown source"):
        masa_data.sft_record(card, best, "d", best, "mystery", "t", 0.0)


def test_one_shot_rewrite_accepts_dict_card_and_keeps_missing_types():
    base = skillset(general=("old general.",), typed={"math": ["old math."], "facts": ["old facts."]})
    new = skillset(general=("new general.",), typed={"math": ["new math."]})
    teacher = FakeTeacher(["Here is the library:\n```json\n" + json.dumps(new.to_json()) + "\n```"])
    card = {"family": None, "multilingual": "unknown", "num_layers": 30, "weaknesses": ["math"]}  # rewrite.py style
    out = one_shot_rewrite(teacher, card, base, "qa tasks")
    assert out.general[0].body == "new general."
    assert out.task_specific["math"][0].body == "new math." and out.task_specific["facts"][0].body == "old facts."
    prompt = teacher.sent[0][0][1]["content"]
    assert ONESHOT_TASK in prompt and "num_layers: 30" in prompt and "old facts." in prompt
    assert one_shot_rewrite(FakeTeacher(["no", "no", "no"]), card, base, "qa") is None


def test_one_shot_reply_written_as_the_prompt_asks_keeps_its_skills():
    """The one-shot prompt asks for the keys SkillSet.from_json reads: a reply written exactly in the asked-for form
    gives the teacher's skills (names, bodies, descriptions), not skills named "skill" with an empty body."""
    base = skillset(general=("old general.",), typed={"math": ["old math."]})
    prompt = oneshot_messages(ModelCard(name="t"), base, "qa tasks")[1]["content"]
    asked = extract_json(prompt[prompt.index("Reply with JSON"):])        # the form the prompt shows
    keys = list(asked["general_skills"][0])
    assert keys == ["skill_id", "title", "principle", "when_to_apply"]

    def entry(name, body, when):        # one skill, the prompt's keys in the prompt's order
        return dict(zip(keys, (name, name.replace("-", " ").capitalize(), body, when)))
    reply = json.dumps({"general_skills": [entry("short-answers", "Answer in one line.", "Every task.")],
                        "task_specific_skills": {"math": [entry("carry-the-one", "Carry the one.", "Sums.")]},
                        "common_mistakes": ["long answers"]})
    out = one_shot_rewrite(FakeTeacher([reply]), ModelCard(name="t"), base, "qa tasks")
    assert [(s.name, s.body, s.description) for s in out.general] == [("short-answers", "Answer in one line.",
                                                                         "Every task.")]
    assert [(s.name, s.body) for s in out.task_specific["math"]] == [("carry-the-one", "Carry the one.")]
    assert out.common_mistakes == ["long answers"]
    # the prompt's own example reads back as the skill it shows
    shown = SkillSet.from_json({**asked, "task_specific_skills": {}}).general[0]
    example = asked["general_skills"][0]
    assert (shown.name, shown.body, shown.description) == (example["skill_id"], example["principle"],
                                                           example["when_to_apply"]) and shown.body
