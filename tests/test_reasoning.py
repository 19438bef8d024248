"""Reasoning models (Qwen3 and the like): extra request fields reach the server, and a reply's reasoning never
reaches a verifier or a parser.

* llama.cpp's own server (xllamacpp) on a tiny random Qwen3 GGUF written here with the `gguf` package and Qwen3's
  published chat template (tests/tiny.py QWEN3_TEMPLATE: Qwen/Qwen3-0.6B's tokenizer_config.json chat_template):
  `/apply-template` renders the reply prompt with thinking on (no think block) and off (the empty block), and
  ChatClient(extra_body={"chat_template_kwargs": {"enable_thinking": false}}) makes the request llama.cpp receives
  render with the empty block (its prompt_tokens are those of the thinking-off prompt).
* minskill's own server honours chat_template_kwargs.enable_thinking on a Qwen3 template, as vLLM does.
* scripted servers that think (`<think>…</think>answer` in the content, or the reasoning in reasoning_content):
  the verifier scores the answer, the teacher's JSON parser reads the answer, the trajectory keeps the reasoning.
"""
import json
import socket
import time

import numpy as np
import pytest
import requests
from safetensors.numpy import load_file

from minskill.cli import with_extra_body
from minskill.masa.teacher import ask_teacher, parse_attribution
from minskill.nn.tokenizer import Tokenizer
from minskill.rollout import run_rollouts
from minskill.serve.backends import ModelBackend, ScriptedBackend
from minskill.serve.client import ChatClient, split_reasoning
from minskill.serve.server import start_server
from minskill.tasks import Task, load_suite
from tiny import QWEN3_TEMPLATE, make_tiny_model_dir

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
USER = [{"role": "user", "content": "The capital of France is"}]
EMPTY_THINK = "<think>\n\n</think>\n\n"


# ---- the client sets reasoning apart --------------------------------------------------------------
@pytest.mark.parametrize("content, answer, reasoning", [
    ("42", "42", ""),                                                        # no tags: unchanged
    ("<think>\n6 times 7 is 41? no, 42\n</think>\n\nThe answer is 42", "The answer is 42", "6 times 7 is 41? no, 42"),
    ("<think>\n\n</think>\n\n42", "42", ""),                                 # Qwen3's empty block (thinking off)
    ("<think>\nlet me count: 1, 2, 3", "", "let me count: 1, 2, 3"),          # cut by max_tokens: no answer
    ("the prompt opened it</think>\n\nParis", "Paris", "the prompt opened it"),   # DeepSeek-R1 style
    ("The tag <think> opens a block", "The tag <think> opens a block", ""),   # quoted, not reasoning
])
def test_split_reasoning(content, answer, reasoning):
    assert split_reasoning(content) == (answer, reasoning)


def test_extra_body_is_checked_and_merged_into_every_request():
    with pytest.raises(ValueError, match="extra_body may not set n, temperature"):
        ChatClient("http://127.0.0.1:1/v1", extra_body={"n": 2, "temperature": 1})
    seen = []   # what the scripted model was asked for: chat_template_kwargs.enable_thinking reached it
    with start_server(ScriptedBackend(lambda _, request: seen.append(request.enable_thinking) or "ok")) as server:
        thinking = server.client(extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        assert thinking.chat(USER).text == "ok" and with_extra_body(thinking, None).chat(USER).text == "ok"
        assert with_extra_body(thinking, {"chat_template_kwargs": {"enable_thinking": True}}) is thinking
    assert seen == [True, False]


# ---- minskill's own server: chat_template_kwargs.enable_thinking on a Qwen3 template ---------------
@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("qwen3"), family="qwen3")


def test_the_server_honours_enable_thinking_on_a_qwen3_template(qwen3_dir):
    tokenizer = Tokenizer.from_pretrained(qwen3_dir)
    off, on = (tokenizer.render_chat(USER, enable_thinking=thinking) for thinking in (False, True))
    assert off == on + EMPTY_THINK and on.endswith("<|im_start|>assistant\n")   # the default stays off
    think_tokens = len(tokenizer.encode(EMPTY_THINK))
    with start_server(ModelBackend.from_spec(str(qwen3_dir))) as server:
        url = server.url + "/chat/completions"
        headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}

        def prompt_tokens(**extra):
            reply = requests.post(url, json={"messages": USER, "max_tokens": 1, **extra}, headers=headers, timeout=60)
            return reply.status_code, reply.json()

        _, default = prompt_tokens()
        _, thinking = prompt_tokens(chat_template_kwargs={"enable_thinking": True, "other_key": 1})  # others ignored
        _, not_thinking = prompt_tokens(**THINKING_OFF)
        assert default["usage"]["prompt_tokens"] == not_thinking["usage"]["prompt_tokens"] == \
            thinking["usage"]["prompt_tokens"] + think_tokens
        for bad, param in (([1], "chat_template_kwargs"),
                           ({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking")):
            status, body = prompt_tokens(chat_template_kwargs=bad)
            assert status == 400 and body["error"]["param"] == param


# ---- scripted servers that think: the verifier scores the answer ----------------------------------
def capital_tasks():
    return [Task(id="fr", type="qa", question="Capital of France?", answer="Paris", verifier="exact"),
            Task(id="it", type="qa", question="Capital of Italy?", answer="Rome", verifier="contains")]


def in_content(messages, request):      # a Qwen3 with thinking on behind a server without a reasoning parser
    if "France" in messages[-1]["content"]:
        return "<think>\nNot Rome, that is Italy.\n</think>\n\nParis"
    return "<think>\nRome? No: the capital of Italy must be Milan.\n</think>\n\nMilan"


def in_field(messages, request):        # the same behind vLLM --reasoning-parser qwen3: the reasoning apart
    reasoning, _, answer = in_content(messages, request).partition("</think>")
    return reasoning.replace("<think>", "").strip(), answer.strip()


@pytest.mark.parametrize("script", [in_content, in_field])
def test_the_verifier_scores_the_answer_and_the_trajectory_keeps_the_reasoning(script, tmp_path):
    with start_server(ScriptedBackend(script)) as server:
        client = server.client()
        trajectories = run_rollouts(client, capital_tasks(), max_tokens=64, out_path=tmp_path / "t.jsonl")
        usage = client.usage
    france, italy = trajectories
    assert (france.reply, france.reward) == ("Paris", 1.0)       # "exact": the thinking would make it 0
    assert (italy.reply, italy.reward) == ("Milan", 0.0)         # "contains": "Rome" in the thinking would make it 1
    assert france.reasoning == "Not Rome, that is Italy." and "Milan" in italy.reasoning
    assert france.messages[-1] == {"role": "assistant", "content": "Paris"}   # no thinking in a later prompt
    written = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert {w["task_id"]: w["reasoning"] for w in written} == {"fr": france.reasoning, "it": italy.reasoning}
    if script is in_content:   # estimated from the characters: the scripted server counts words, not reasoning
        assert 0 < usage["reasoning_tokens"] < usage["completion_tokens"]


def test_an_agent_acts_on_its_answer_and_keeps_each_steps_reasoning():
    tasks = load_suite("household", split="heldout", n=1)
    think = "Maybe Action: go to shelf 1 first?"
    reply = f"<think>\n{think}\n</think>\n\nAction: look"
    with start_server(ScriptedBackend(lambda messages, request: reply)) as server:
        (trajectory,) = run_rollouts(server.client(), tasks, max_steps=2)
    assert trajectory.actions == ["look", "look"] and trajectory.steps == 2
    assert trajectory.reasoning == f"{think}\n\n{think}"
    assert all("<think>" not in m["content"] for m in trajectory.messages)


def test_a_reply_cut_while_thinking_has_no_answer():
    with start_server(ScriptedBackend(lambda messages, request: "<think> " + "hmm " * 50)) as server:
        result = server.client().chat(USER, max_tokens=8)
    assert (result.text, result.finish_reasons, result.reasoning) == ("", ["length"], "hmm " * 6 + "hmm")
    assert result.reasoning_tokens == result.completion_tokens == 8


def test_the_teacher_parser_reads_the_answer_not_the_thinking():
    decoy = '{"failure_categories": [{"category": "draft", "count": 9}], "summary": "a first guess"}'
    answer = {"failure_categories": [{"category": "arithmetic", "count": 2, "evidence": ["2+2=5"],
                                      "suggested_fix": "check sums"}], "summary": "sums"}
    reply = f"<think>\nA first draft: {decoy}. No, recount.\n</think>\n\n{json.dumps(answer)}"
    with start_server(ScriptedBackend(lambda messages, request: reply)) as server:
        parsed = ask_teacher(server.client(), USER, parse_attribution, what="attribution", retries=0)
    assert [c["category"] for c in parsed["failure_categories"]] == ["arithmetic"]


# ---- llama.cpp's own server: the prompt with and without thinking ---------------------------------
def write_qwen3_gguf(folder, path) -> None:
    """The tiny random Qwen3 checkpoint of `folder` (tests/tiny.py) as a float32 GGUF llama.cpp loads, with its
    BPE vocabulary, merges and Qwen3's chat template."""
    gguf = pytest.importorskip("gguf")
    config = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.get)
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.USER_DEFINED if t in ("<think>", "</think>")
             else gguf.TokenType.NORMAL for t in tokens]
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(QWEN3_TEMPLATE)
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for name, weight in load_file(str(folder / "model.safetensors")).items():
        parts = name.split(".")
        writer.add_tensor(top.get(name) or f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.weight",
                          weight.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def llama_cpp(qwen3_dir, tmp_path_factory):
    """The base URL of llama.cpp's server (xllamacpp, in this process, --jinja) on the tiny Qwen3 GGUF."""
    xllamacpp = pytest.importorskip("xllamacpp")
    path = tmp_path_factory.mktemp("gguf") / "qwen3-tiny.gguf"
    write_qwen3_gguf(qwen3_dir, path)
    with socket.socket() as probe:   # a free loopback port (llama.cpp takes a port number, not 0)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    params = xllamacpp.CommonParams()
    params.model.path, params.port, params.use_jinja = str(path), port, True
    params.n_ctx, params.n_parallel, params.warmup = 256, 1, False
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(params)   # noqa: F841 (serves while referenced)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.1)
    yield base
    del server


def test_llama_cpp_renders_qwen3_with_and_without_thinking_and_the_client_passes_the_flag(llama_cpp, qwen3_dir):
    def template(**extra):
        reply = requests.post(llama_cpp + "/apply-template", json={"messages": USER, **extra}, timeout=30)
        return reply.json()["prompt"]

    def tokens(prompt):
        reply = requests.post(llama_cpp + "/tokenize", json={"content": prompt, "parse_special": True}, timeout=30)
        return len(reply.json()["tokens"])

    on, off = template(), template(**THINKING_OFF)
    assert on == "<|im_start|>user\nThe capital of France is<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + EMPTY_THINK == template(chat_template_kwargs={"enable_thinking": True}) + EMPTY_THINK
    tokenizer = Tokenizer.from_pretrained(qwen3_dir)   # minskill's renderer agrees with llama.cpp's Jinja, both ways
    assert (tokenizer.render_chat(USER, enable_thinking=True), tokenizer.render_chat(USER)) == (on, off)
    assert tokens(off) > tokens(on)
    # what llama.cpp receives from minskill's client renders with the empty think block only with the flag
    plain = ChatClient(llama_cpp + "/v1", model="tiny").chat(USER, max_tokens=2)
    thinking_off = ChatClient(llama_cpp + "/v1", model="tiny", extra_body=THINKING_OFF).chat(USER, max_tokens=2)
    assert (plain.prompt_tokens, thinking_off.prompt_tokens) == (tokens(on), tokens(off))
