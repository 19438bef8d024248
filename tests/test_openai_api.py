"""The OpenAI API as clients send it, over real loopback HTTP: content as a list
of text parts (joined with "\\n"; other part types a 400 naming the part); `"stream": true` as server-sent
events (role delta, content deltas, finish reason, usage chunk, [DONE]) from a scripted and a tiny random
model, the same text as without streaming, sent while the model still decodes, with the official `openai`
client; a streaming client that closes its socket cancels its request; /v1/embeddings equal to a hand
computation (mean of the final norm's hidden states over the text's tokens, L2-normalised), through
requests and the `openai` client, and its 400s. What a vLLM client sends: logprobs / top_logprobs equal to a
full forward's (streamed too), top_k, the fields refused by name (and the harmless ones accepted, as
docs/http-api.md lists them), developer as system, an assistant's null content, models.retrieve, and legacy
/v1/completions (the model's text, its prompts in one batch, streamed, logprobs)."""
import json
import socket
import threading
import time

import numpy as np
import pytest
import requests
import torch

from minskill.serve.backends import _TextStream
from minskill.serve.errors import BackendError
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import ModelBackend, start_server

USER = [{"role": "user", "content": "what is six times seven"}]


def echo(messages, request):
    return f"echo {messages[-1]['content']} #{request.sample_index}"


@pytest.fixture(scope="module")
def echo_server():
    with start_server(ScriptedBackend(echo, name="echo", max_context=64)) as server:
        yield server


def post(server, body, path="/chat/completions", **kwargs):
    return requests.post(server.url + path, json=body, timeout=60, **kwargs)


def events(reply) -> list:
    """The `data:` payloads of an SSE reply, decoded (the final "[DONE]" kept as a string)."""
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Type"].startswith("text/event-stream")
    out = []
    for line in reply.iter_lines(decode_unicode=True):
        if line:
            assert line.startswith("data: "), line
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def streamed_texts(chunks, n=1) -> list[str]:
    texts = [""] * n
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    return texts


# ---- content parts --------------------------------------------------------------------------------
def test_text_parts_are_joined_with_newlines(echo_server):
    parts = [{"type": "text", "text": "six times"}, {"type": "text", "text": "seven"}]
    body = post(echo_server, {"messages": [{"role": "user", "content": parts}], "max_tokens": 50}).json()
    assert body["choices"][0]["message"]["content"] == "echo six times\nseven #0"
    assert body["usage"]["prompt_tokens"] == 3                     # the scripted backend counts words
    openai = pytest.importorskip("openai")
    reply = openai.OpenAI(base_url=echo_server.url, api_key="none").chat.completions.create(
        model="echo", messages=[{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                                {"role": "user", "content": parts}], max_tokens=50)
    assert reply.choices[0].message.content == "echo six times\nseven #0"


BAD_CONTENT = [  # (content, status words, param)
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "type 'image_url'",
     "messages[0].content[0]"),
    ([{"type": "text", "text": "hi"}, {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
     "type 'input_audio'", "messages[0].content[1]"),
    ([{"text": "no type"}], "type None", "messages[0].content[0]"),
    (["hi"], "must be an object", "messages[0].content[0]"),
    ([{"type": "text", "text": 3}], "text must be a string", "messages[0].content[0].text"),
    ([], "empty list", "messages[0].content"),
    ({"type": "text", "text": "hi"}, "string or a list of text parts", "messages[0].content"),
]


@pytest.mark.parametrize("content, words, param", BAD_CONTENT, ids=[c[2] + ":" + c[1][:12] for c in BAD_CONTENT])
def test_other_parts_are_a_400_naming_the_part(echo_server, content, words, param):
    reply = post(echo_server, {"messages": [{"role": "user", "content": content}]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"
    assert post(echo_server, {"messages": USER, "max_tokens": 50}).status_code == 200


# ---- streaming: the events ------------------------------------------------------------------------
def test_stream_events_as_openai_sends_them(echo_server):
    plain = post(echo_server, {"messages": USER, "n": 2, "max_tokens": 50}).json()
    chunks = events(post(echo_server, {"messages": USER, "n": 2, "max_tokens": 50, "stream": True,
                                       "stream_options": {"include_usage": True}}, stream=True))
    assert chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {"echo"}
    first = [c["choices"][0] for c in chunks[:2]]     # a role delta per choice before any content
    assert [(f["index"], f["delta"]) for f in first] == [(0, {"role": "assistant", "content": ""}),
                                                         (1, {"role": "assistant", "content": ""})]
    *body, usage = chunks
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    assert all(c["usage"] is None for c in body)      # as OpenAI: "usage": null until the last chunk
    finishes = [(ch["index"], ch["finish_reason"]) for c in body for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == [(0, "stop"), (1, "stop")]
    assert all(ch["delta"] == {} for c in body for ch in c["choices"] if ch["finish_reason"])
    contents = [ch["delta"]["content"] for c in body for ch in c["choices"] if ch["delta"].get("content")]
    assert len(contents) > 2                            # word by word, not one lump
    assert streamed_texts(body, 2) == [c["message"]["content"] for c in plain["choices"]]


def test_stream_without_usage_and_with_length_cut(echo_server):
    chunks = events(post(echo_server, {"messages": USER, "max_tokens": 3, "stream": True}, stream=True))
    assert chunks[-1] == "[DONE]" and all("usage" not in c for c in chunks[:-1])
    assert streamed_texts(chunks[:-1]) == ["echo what is"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("fields, words, param", [
    ({"stream": "yes"}, "'stream' must be true or false", "stream"),
    ({"stream_options": {"include_usage": True}}, "only allowed when 'stream' is true", "stream_options"),
    ({"stream": True, "stream_options": [1]}, "must be an object", "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage' must be true or false",
     "stream_options.include_usage"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "not implemented",
     "stream_options.continuous_usage_stats"),
])
def test_bad_stream_options_are_a_400(echo_server, fields, words, param):
    reply = post(echo_server, {"messages": USER, **fields})
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]
    assert reply.json()["error"]["param"] == param


def test_a_stream_that_fails_before_its_first_event_gets_the_status():
    def busy(messages, request):
        raise BackendError(503, "overloaded", retry_after=2)

    with start_server(ScriptedBackend(busy)) as server:
        reply = post(server, {"messages": USER, "stream": True})
        assert reply.status_code == 503 and reply.headers["Retry-After"] == "2"
        assert reply.json()["error"]["message"] == "overloaded"


def test_openai_client_streams(echo_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=echo_server.url, api_key="none")
    chunks = list(client.chat.completions.create(model="echo", messages=USER, max_tokens=50, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo what is six times seven #0"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 5 + 7
    with client.chat.completions.create(model="echo", messages=USER, max_tokens=50, stream=True) as stream:
        assert "".join(c.choices[0].delta.content or "" for c in stream) == text   # keep-alive reused after


# ---- streaming: _TextStream holds back what may still change --------------------------------------
class ByteTokenizer:
    """Tokens are byte strings; decode as a byte-level BPE does (U+FFFD for an incomplete character)."""
    PIECES = {1: b"Hel", 2: b"lo ", 3: b"\xc3", 4: b"\xa9 ", 5: b"EN", 6: b"D!", 7: b"E", 8: b"x"}
    stop_token_ids = [0]

    def decode(self, ids):
        return b"".join(self.PIECES[i] for i in ids).decode("utf-8", "replace")


def test_text_stream_deltas_are_a_prefix_of_the_final_text():
    sent = []
    stream = _TextStream(ByteTokenizer(), ["END"], sent.append)
    for token in (1, 2, 3):
        stream.push(token)
    assert sent == ["Hel", "lo "]                       # half of "é" is held back
    stream.push(4)
    stream.push(5)
    assert sent[-1] == "é "                             # "EN" could start the stop string: held back
    stream.push(6)                                      # "END!": cut at the stop string, nothing of it sent
    stream.push(8)
    assert "".join(sent) == "Hello é "
    other = []
    stream = _TextStream(ByteTokenizer(), ["END"], other.append)
    for token in (5, 8, 7, 0, 8):                       # "ENx" is no stop: sent; the stop token ends the reply
        stream.push(token)
    assert "".join(other) == "ENx"                      # the last "E" held back, the rest from the final text


def _full_decode_deltas(tokenizer, stop, tokens):
    """The deltas of a stream that decodes the whole reply at every token (what _TextStream did
    before it decoded only the new text): the reference its deltas must equal."""
    sent, out = 0, []
    for i in range(1, len(tokens) + 1):
        if tokens[i - 1] in tokenizer.stop_token_ids:
            break
        text = tokenizer.decode([t for t in tokens[:i]])
        cuts = [j for j in (text.find(s) for s in stop) if j >= 0]
        if cuts:
            text = text[:min(cuts)]
        else:
            held = max((k for s in stop for k in range(1, min(len(s) - 1, len(text)) + 1)
                        if s.startswith(text[-k:])), default=0)
            text = text[:len(text) - held].rstrip("\ufffd")
        if len(text) > sent:
            out.append(text[sent:])
            sent = len(text)
        if cuts:
            break
    return out


class CountingByteTokenizer(ByteTokenizer):
    PIECES = {**ByteTokenizer.PIECES, 9: b"\xe2\x82", 10: b"\xac", 11: b"\x82", 12: b"\xf0\x9f\x98",
              13: b"\x80D"}

    def __init__(self):
        self.sizes = []

    def decode(self, ids):
        self.sizes.append(len(ids))
        return super().decode(ids)


def test_text_stream_deltas_equal_a_whole_decode_at_every_token_and_cost_the_new_text():
    import random
    rng = random.Random(0)
    for trial in range(400):
        tokenizer = CountingByteTokenizer()
        tokens = [rng.choice(list(tokenizer.PIECES)) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.2:
            tokens.insert(rng.randrange(len(tokens)), 0)          # a stop token somewhere
        stop = rng.choice([[], ["END"], ["D!"], ["\u20ac", "lo E"], ["\ufffdx", "xx"]])
        sent = []
        stream = _TextStream(tokenizer, stop, sent.append)
        for token in tokens:
            stream.push(token)
        assert sent == _full_decode_deltas(CountingByteTokenizer(), stop, tokens), \
            (trial, tokens, stop)
    tokenizer = CountingByteTokenizer()
    stream = _TextStream(tokenizer, ["END"], [].append)
    for token in [1, 2, 8] * 300:                  # a long reply of whole characters
        stream.push(token)
    assert max(tokenizer.sizes) <= 2               # each push decodes the new token and one before


# ---- a tiny random model -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory):
    from tiny import make_tiny_model_dir
    from minskill.nn.tokenizer import Tokenizer
    from minskill.nn.weights import load_pretrained
    path = make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama", family="llama", chat_format="chatml",
                               init_std=0.2)
    return ModelBackend(load_pretrained(path).eval(), Tokenizer.from_pretrained(path), "tiny")


@pytest.fixture(scope="module")
def tiny_server(tiny_backend):
    with start_server(tiny_backend) as server:
        yield server


@pytest.mark.parametrize("fields", [{"temperature": 0, "max_tokens": 24},
                                    {"temperature": 0.9, "seed": 5, "n": 2, "max_tokens": 24, "stop": ["e", "a"]}])
def test_model_stream_equals_the_plain_reply(tiny_server, fields):
    body = {"messages": USER, **fields}
    plain = post(tiny_server, body).json()
    chunks = events(post(tiny_server, {**body, "stream": True, "stream_options": {"include_usage": True}},
                         stream=True))[:-1]
    n = fields.get("n", 1)
    assert streamed_texts(chunks, n) == [c["message"]["content"] for c in plain["choices"]]
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == \
        [c["finish_reason"] for c in plain["choices"]]
    assert chunks[-1]["usage"] == plain["usage"]


def slowed(backend, seconds=0.02):
    """The backend's model sleeps before each forward pass (a decoding step); returns the step log."""
    steps, forward = [], backend.model.forward

    def slow_forward(*args, **kwargs):
        steps.append(time.monotonic())
        time.sleep(seconds)
        return forward(*args, **kwargs)

    backend.model.forward = slow_forward
    return steps


@pytest.fixture
def endless_backend(tmp_path):
    """A tiny model that never stops by itself (no stop tokens), ~20 ms per decoding step."""
    from tiny import make_tiny_model_dir
    from minskill.nn.weights import load_model
    model, tokenizer = load_model(str(make_tiny_model_dir(tmp_path / "m", family="llama")))
    tokenizer.stop_token_ids = []
    backend = ModelBackend(model, tokenizer, name="tiny")
    backend.steps = slowed(backend)
    return backend


def test_model_stream_sends_deltas_while_it_decodes(endless_backend):
    openai = pytest.importorskip("openai")
    with start_server(endless_backend) as server:
        client = openai.OpenAI(base_url=server.url, api_key="none")
        seen = []
        for chunk in client.chat.completions.create(model="tiny", messages=USER, max_tokens=40, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                seen.append((chunk.choices[0].delta.content, server.state.scheduler.batches_served))
        assert len(seen) >= 10                            # token by token
        assert seen[0][1] == 0                            # the first delta came while its batch still ran
        during = sum(1 for _, batches in seen if batches == 0)
        assert during >= len(seen) - 1                    # all but a held-back rest (U+FFFD, say) came early


def _wait_until(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_a_streaming_client_that_closes_its_socket_cancels_its_request(endless_backend):
    with start_server(endless_backend) as server:
        body = json.dumps({"messages": [{"role": "user", "content": "count"}], "max_tokens": 200,
                           "stream": True}).encode()
        sock = socket.create_connection((server.host, server.port), timeout=30)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while received.count(b"data: ") < 4:              # the role chunk and a few content deltas
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
        sock.close()
        scheduler = server.state.scheduler
        assert _wait_until(lambda: scheduler.cancelled_requests == 1)
        assert _wait_until(lambda: scheduler.batches_served == 1)    # generation stopped early
        assert len(endless_backend.steps) < 150
        reply = server.client().chat([{"role": "user", "content": "count"}], max_tokens=5)
        assert reply.finish_reasons == ["length"] and reply.completion_tokens == 5
        assert requests.get(server.url[:-len("/v1")] + "/health", timeout=10).status_code == 200


# ---- /v1/embeddings -------------------------------------------------------------------------------
TEXTS = ["The capital of France is Paris.", "one", "2 + 3 = 5, and <|im_start|> is text here",
         "a longer text about counting apples and oranges in a basket, twice over"]


def hand_embedding(backend, text):
    """mean_t norm(x_t) over the text's tokens, then / its L2 norm: what /v1/embeddings must give."""
    ids = backend.tokenizer.encode(text, special_tokens=False)
    with torch.no_grad():
        hidden = backend.model.hidden_states(torch.tensor([ids]))[0]            # (T, H), after the final norm
    mean = hidden.mean(0)
    return (mean / mean.norm()).numpy(), len(ids)


def test_embeddings_equal_the_hand_computation(tiny_server, tiny_backend):
    reply = post(tiny_server, {"model": "tiny", "input": TEXTS}, path="/embeddings")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "list" and body["model"] == "tiny"
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", i) for i in range(len(TEXTS))]
    expected = [hand_embedding(tiny_backend, text) for text in TEXTS]
    for d, (vector, _) in zip(body["data"], expected):
        assert len(d["embedding"]) == 64
        np.testing.assert_allclose(d["embedding"], vector, atol=1e-5)
        assert abs(np.linalg.norm(d["embedding"]) - 1) < 1e-5
    tokens = sum(n for _, n in expected)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    single = post(tiny_server, {"input": TEXTS[1]}, path="/embeddings").json()     # a string alone
    np.testing.assert_allclose(single["data"][0]["embedding"], expected[1][0], atol=1e-5)


def test_openai_client_embeddings(tiny_server, tiny_backend):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tiny_server.url, api_key="none")
    reply = client.embeddings.create(model="tiny", input=TEXTS[:2])          # the client asks for base64
    for item, text in zip(reply.data, TEXTS[:2]):
        np.testing.assert_allclose(item.embedding, hand_embedding(tiny_backend, text)[0], atol=1e-5)
    as_floats = client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(as_floats.data[0].embedding, reply.data[0].embedding, atol=1e-6)
    assert reply.usage.prompt_tokens == sum(hand_embedding(tiny_backend, t)[1] for t in TEXTS[:2])


BAD_EMBEDDINGS = [  # (body, status, words, param)
    ({}, 400, "'input' must be a string or a non-empty list", "input"),
    ({"input": []}, 400, "non-empty list", "input"),
    ({"input": ""}, 400, "input[0] is an empty string", "input[0]"),
    ({"input": ["ok", 7]}, 400, "input[1] must be a string", "input[1]"),
    ({"input": [[1, 2, 3]]}, 400, "token-id arrays are not accepted", "input[0]"),
    ({"input": ["x"] * 2049}, 400, "at most 2048", "input"),
    ({"input": "word " * 300}, 400, "context is 256", "input[0]"),
    ({"input": "hi", "encoding_format": "int8"}, 400, "'encoding_format' must be one of float, base64",
     "encoding_format"),
    ({"input": "hi", "dimensions": 8}, 400, "embedding size (64)", "dimensions"),
    ({"input": "hi", "model": "text-embedding-3-small"}, 404, "does not exist", "model"),
]


@pytest.mark.parametrize("body, status, words, param", BAD_EMBEDDINGS, ids=[b[2][:30] for b in BAD_EMBEDDINGS])
def test_bad_embedding_requests(tiny_server, body, status, words, param):
    reply = post(tiny_server, body, path="/embeddings")
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["param"] == param
    assert post(tiny_server, {"input": "still fine"}, path="/embeddings").status_code == 200


def test_scripted_embeddings():
    with start_server(ScriptedBackend(echo, embed_fn=lambda text: [len(text), 0.5])) as server:
        body = post(server, {"input": ["abc", "de f"]}, path="/embeddings").json()
        assert [d["embedding"] for d in body["data"]] == [[3.0, 0.5], [4.0, 0.5]]
        assert body["usage"]["prompt_tokens"] == 3           # words
    with start_server(ScriptedBackend(echo, name="plain")) as server:
        reply = post(server, {"input": "abc"}, path="/embeddings")
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "embeddings_not_supported"
        assert post(server, {"messages": USER}).status_code == 200


def test_embeddings_wait_their_turn_and_do_not_join_chat_batches(tiny_backend):
    """An embedding request runs alone, between chat batches, on the one scheduler thread."""
    seen = []

    class Recording:
        name, max_context = tiny_backend.name, tiny_backend.max_context

        def count_prompt_tokens(self, messages):
            return tiny_backend.count_prompt_tokens(messages)

        def embedding_tokens(self, text):
            return tiny_backend.embedding_tokens(text)

        def complete(self, batch):
            seen.append(("chat", len(batch), threading.current_thread().name))
            return tiny_backend.complete(batch)

        def embed(self, request):
            seen.append(("embed", len(request.texts), threading.current_thread().name))
            return tiny_backend.embed(request)

    with start_server(Recording()) as server:
        threads = [threading.Thread(target=post, args=(server, {"messages": USER, "max_tokens": 3})) for _ in range(2)]
        threads.append(threading.Thread(target=post, args=(server, {"input": TEXTS}, "/embeddings")))
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert {name for *_, name in seen} == {"minskill-scheduler"}
    assert ("embed", len(TEXTS), "minskill-scheduler") in seen
    assert sum(n for kind, n, _ in seen if kind == "chat") == 2


# ---- logprobs, top_k, roles, legacy completions, models/{id}: what a vLLM client sends ----------------
def full_logprobs(backend, prompt_ids, reply_ids):
    """log_softmax of the model's logits at each reply position (T = 1): what logprobs must report."""
    with torch.no_grad():
        logits = backend.model(torch.tensor([prompt_ids + reply_ids]))[0].float()
    return torch.log_softmax(logits[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(reply_ids)], -1)


def test_chat_logprobs_are_the_model_s_with_the_top_alternatives(tiny_server, tiny_backend):
    body = post(tiny_server, {"messages": USER, "temperature": 0, "max_tokens": 12, "logprobs": True,
                              "top_logprobs": 3}).json()
    choice = body["choices"][0]
    entries = choice["logprobs"]["content"]
    assert len(entries) == body["usage"]["completion_tokens"] - (choice["finish_reason"] == "stop")
    assert b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", "replace") == choice["message"]["content"]
    tokenizer = tiny_backend.tokenizer
    prompt = tokenizer.apply_chat_template(USER)
    from minskill.nn.sampling import generate
    [sample] = generate(tiny_backend.model, [prompt], max_new_tokens=12, temperature=0, tokenizer=tokenizer,
                        stop_token_ids=tokenizer.stop_token_ids, pad_id=tokenizer.pad_token_id)
    reply = sample.token_ids[:len(entries)]
    expected = full_logprobs(tiny_backend, prompt, reply)
    assert sample.text == choice["message"]["content"] and len(reply) == len(entries)
    for t, entry in enumerate(entries):
        top = expected[t].topk(3)
        assert entry["logprob"] == pytest.approx(float(expected[t, reply[t]]), abs=1e-4)
        assert [a["logprob"] for a in entry["top_logprobs"]] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [bytes(a["bytes"]) for a in entry["top_logprobs"]] == \
            [tiny_backend._piece(i, tokenizer.backend.get_added_tokens_decoder())[1] for i in top.indices.tolist()]
        assert entry["top_logprobs"][0]["token"] == entry["token"]               # greedy: the most likely
    plain = post(tiny_server, {"messages": USER, "temperature": 0, "max_tokens": 12}).json()["choices"][0]
    assert plain["logprobs"] is None and plain["message"] == choice["message"]   # asking changes no token


def test_openai_client_reads_logprobs_also_streamed(tiny_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tiny_server.url, api_key="none")
    fields = dict(model="tiny", messages=USER, max_tokens=10, temperature=0.8, seed=3, n=2, logprobs=True,
                  top_logprobs=2)
    reply = client.chat.completions.create(**fields)
    assert all(len(e.top_logprobs) == 2 for c in reply.choices for e in c.logprobs.content)
    streamed = [[], []]
    for chunk in client.chat.completions.create(**fields, stream=True):
        for c in chunk.choices:
            streamed[c.index] += [e.logprob for e in (c.logprobs.content if c.logprobs else [])]
    assert streamed == [[e.logprob for e in c.logprobs.content] for c in reply.choices]


def test_top_k_is_implemented(tiny_server):
    greedy = post(tiny_server, {"messages": USER, "temperature": 0, "max_tokens": 16}).json()
    texts = {post(tiny_server, {"messages": USER, "temperature": 2.0, "seed": s, "max_tokens": 16, **k}).json()[
        "choices"][0]["message"]["content"] for s in range(3) for k in [{"top_k": 1}]}
    assert texts == {greedy["choices"][0]["message"]["content"]}                 # top_k 1 is greedy at any T
    hot = post(tiny_server, {"messages": USER, "temperature": 2.0, "seed": 0, "max_tokens": 16, "top_k": -1}).json()
    assert hot["choices"][0]["message"]["content"] != greedy["choices"][0]["message"]["content"]  # -1: none


REFUSED = [  # (field, value): changes what is sampled or returned, not implemented (the penalties
    #          and logit_bias: not by a scripted backend; tests/test_sampling_controls.py serves them)
    ("presence_penalty", 0.5), ("frequency_penalty", -1), ("repetition_penalty", 1.1), ("min_p", 0.05),
    ("logit_bias", {"5": 10}), ("response_format", {"type": "json_object"}),
    ("best_of", 3), ("stop_token_ids", [3]), ("guided_json", {"type": "object"}),
    ("reasoning_effort", "low"), ("ignore_eos", True), ("temprature", 0.3)]
NEUTRAL_VALUES = [("presence_penalty", 0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0), ("min_p", 0),
                  ("logit_bias", {}), ("response_format", {"type": "text"}), ("tools", []), ("tool_choice", "auto"),
                  ("user", "u-1"), ("metadata", {"a": "b"}), ("store", False), ("parallel_tool_calls", True),
                  ("logprobs", False), ("top_logprobs", 0), ("top_k", 0), ("stream_options", None)]


@pytest.mark.parametrize("field, value", REFUSED, ids=[f for f, _ in REFUSED])
def test_fields_that_change_the_reply_and_are_not_implemented_are_a_400(echo_server, field, value):
    for path, body in (("/chat/completions", {"messages": USER}), ("/completions", {"prompt": "hi"})):
        reply = post(echo_server, {**body, field: value}, path=path)
        assert reply.status_code == 400, (path, reply.text)
        error = reply.json()["error"]
        assert error["param"] == field and f"'{field}'" in error["message"]
        assert error["code"] == ("unrecognized_field" if field == "temprature" else "unsupported_field")


def test_harmless_and_neutral_fields_are_accepted(echo_server):
    body = {"messages": USER, "max_tokens": 50, **dict(NEUTRAL_VALUES)}
    reply = post(echo_server, body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "echo what is six times seven #0"


def test_the_docs_list_every_field_as_the_server_treats_it():
    from pathlib import Path
    from minskill.serve.fields import CHAT_FIELDS, COMPLETION_FIELDS, IGNORED, NEUTRAL
    doc = (Path(__file__).resolve().parents[1] / "docs" / "http-api.md").read_text(encoding="utf-8")
    for name in {*CHAT_FIELDS, *COMPLETION_FIELDS, *IGNORED, *NEUTRAL}:
        assert f"`{name}`" in doc, name


def test_developer_is_system_and_an_assistant_turn_may_have_null_content(tiny_server):
    def reply(messages):
        return post(tiny_server, {"messages": messages, "temperature": 0, "max_tokens": 8}).json()
    system = reply([{"role": "system", "content": "be brief"}, *USER])
    assert reply([{"role": "developer", "content": "be brief"}, *USER]) | {"id": 0, "created": 0} == \
        system | {"id": 0, "created": 0}
    empty = reply([*USER, {"role": "assistant", "content": ""}, {"role": "user", "content": "and?"}])
    null = reply([*USER, {"role": "assistant", "content": None}, {"role": "user", "content": "and?"}])
    assert null["choices"] == empty["choices"] and null["usage"] == empty["usage"]


@pytest.mark.parametrize("message, param", [
    ({"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{"}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "function", "content": "42", "name": "f"}, "messages[1].role"),
    ({"role": "user", "content": None}, "messages[1].content")])
def test_bad_tool_turns_and_a_user_s_null_content_are_a_400(echo_server, message, param):
    reply = post(echo_server, {"messages": [*USER, message]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_scripted_backend_has_no_logprobs(echo_server):
    reply = post(echo_server, {"messages": USER, "logprobs": True})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "logprobs"
    assert post(echo_server, {"messages": USER, "top_logprobs": 2}).json()["error"]["param"] == "top_logprobs"


def test_models_retrieve(echo_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=echo_server.url, api_key="none")
    assert client.models.retrieve("echo").id == "echo"
    with pytest.raises(openai.NotFoundError, match="'gpt-4o' does not exist"):
        client.models.retrieve("gpt-4o")
    with start_server(ScriptedBackend(echo, name="org/model-1")) as server:
        for path in ("/models/org/model-1", "/models/org%2Fmodel-1"):
            assert requests.get(server.url + path, timeout=10).json()["id"] == "org/model-1"


def test_legacy_completions_are_the_model_s_text_batched(tiny_backend):
    openai = pytest.importorskip("openai")
    prompts = ["The capital of France", "2 + 3 ="]
    with start_server(tiny_backend) as server:
        client = openai.OpenAI(base_url=server.url, api_key="none")
        reply = client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=6, temperature=0,
                                          logprobs=2)
        assert server.state.scheduler.batches_served == 1              # both prompts in one batch
        streamed = [""] * 4
        for chunk in client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=6, temperature=0,
                                               stream=True):
            for c in chunk.choices:
                streamed[c.index] += c.text
        default = client.completions.create(model="tiny", prompt=prompts[0], temperature=0)
    from minskill.nn.sampling import generate
    tokenizer = tiny_backend.tokenizer
    ids = [tokenizer.backend.encode(p, add_special_tokens=True).ids for p in prompts]
    samples = generate(tiny_backend.model, ids, max_new_tokens=6, temperature=0, tokenizer=tokenizer,
                       stop_token_ids=tokenizer.stop_token_ids, pad_id=tokenizer.pad_token_id)
    assert [c.text for c in reply.choices] == [s.text for s in samples for _ in range(2)] == streamed
    assert reply.usage.prompt_tokens == sum(map(len, ids))
    assert reply.usage.completion_tokens == 2 * sum(len(s.token_ids) for s in samples)
    first = reply.choices[0].logprobs
    assert first.token_logprobs == pytest.approx(samples[0].logprobs[:len(first.tokens)], abs=1e-5)
    assert all(t in alts and len(alts) <= 3 for t, alts in zip(first.tokens, first.top_logprobs))
    assert default.usage.completion_tokens <= 16                        # OpenAI's default max_tokens


@pytest.mark.parametrize("body, param", [({"prompt": [1, 2, 3]}, "prompt"), ({"prompt": []}, "prompt"),
                                         ({"prompt": ["a", ""]}, "prompt[1]"), ({}, "prompt"),
                                         ({"prompt": "a", "logprobs": 21}, "logprobs"),
                                         ({"prompt": ["a"] * 9, "n": 2}, "n")])
def test_bad_legacy_completions_are_a_400(echo_server, body, param):
    reply = post(echo_server, body, path="/completions")
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_legacy_completions_of_a_scripted_model_streamed_and_not(echo_server):
    body = {"prompt": ["six times", "seven"], "n": 2, "max_tokens": 50}
    reply = post(echo_server, body, path="/completions").json()
    texts = ["echo six times #0", "echo six times #1", "echo seven #0", "echo seven #1"]
    assert [c["text"] for c in reply["choices"]] == texts and [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    assert reply["object"] == "text_completion" and reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 14,
                                                                       "total_tokens": 17}
    chunks = events(post(echo_server, {**body, "stream": True, "stream_options": {"include_usage": True}},
                         path="/completions", stream=True))
    assert chunks[-1] == "[DONE]" and chunks[-2]["usage"] == reply["usage"]
    streamed = [""] * 4
    for chunk in chunks[:-2]:
        assert chunk["object"] == "text_completion"
        for c in chunk["choices"]:
            streamed[c["index"]] += c["text"]
    assert streamed == texts


def test_logprobs_of_a_reply_cut_by_a_stop_string_end_with_the_token_that_holds_the_cut(tiny_server):
    body = post(tiny_server, {"messages": USER, "temperature": 0.9, "seed": 5, "n": 4, "max_tokens": 24,
                              "stop": ["e", "a"], "logprobs": True}).json()
    cut = [c for c in body["choices"] if c["finish_reason"] == "stop"]
    assert cut                                                          # the stop strings cut some replies
    for choice in cut:
        pieces = [bytes(e["bytes"]) for e in choice["logprobs"]["content"]]
        text = choice["message"]["content"]
        assert b"".join(pieces).decode("utf-8", "replace").startswith(text)
        assert not b"".join(pieces[:-1]).decode("utf-8", "replace").startswith(text) if text else pieces == []
