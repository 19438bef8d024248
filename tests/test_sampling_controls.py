"""Sampling controls users send (minskill.serve.penalties): `logit_bias`, `repetition_penalty`,
`frequency_penalty`, `presence_penalty` on chat and legacy completions, and `echo` on legacy ones.

Each control's logits equal a hand computation of its formula; a tiny random model's greedy reply
through the engine equals a hand-written greedy loop over full forwards with the same formula; a
row's reply does not depend on what shares its batch; bad values are a 400 naming the field; the
official openai client sends them all (vLLM's repetition_penalty through extra_body)."""
import pytest
import requests
import torch

from minskill.serve.request_parsing import parse_chat_request, parse_completion_request
from minskill.serve.penalties import Penalties, penalized_logits
from minskill.serve.server import ModelBackend, start_server

USER = [{"role": "user", "content": "Say something long."}]


def hand_penalized(logits: list[float], prompt: list[int], output: list[int], frequency=0.0,
                   presence=0.0, repetition=1.0, bias=None) -> list[float]:
    """The module docstring's formula, one logit at a time."""
    out = list(logits)
    for token, value in (bias or {}).items():
        out[token] += value
    for token in set(prompt) | set(output):
        out[token] = out[token] / repetition if out[token] > 0 else out[token] * repetition
    for token in set(output):
        out[token] -= frequency * output.count(token) + presence
    return out


@pytest.mark.parametrize("controls", [
    dict(frequency=0.7), dict(presence=-1.5), dict(repetition=1.3), dict(repetition=0.8),
    dict(bias={3: 5.0, 7: -100.0}),
    dict(frequency=0.5, presence=0.25, repetition=1.2, bias={1: 2.0, 9: -3.0})])
def test_each_control_equals_its_formula(controls):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(12, generator=generator)
    prompt, output = [1, 2, 2, 5], [5, 5, 7, 9, 5]
    penalties = Penalties(controls.get("frequency", 0.0), controls.get("presence", 0.0),
                          controls.get("repetition", 1.0),
                          tuple(sorted(controls.get("bias", {}).items())))
    got = penalized_logits(logits, penalties, prompt, output)
    want = hand_penalized(logits.tolist(), prompt, output, **controls)
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    assert got.tolist() != pytest.approx(logits.tolist())


# ---- a tiny model, through the engine ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory):
    from tiny import make_tiny_model_dir
    from minskill.nn.tokenizer import Tokenizer
    from minskill.nn.weights import load_pretrained
    path = make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-llama", family="llama",
                               chat_format="chatml", init_std=0.2)
    return ModelBackend(load_pretrained(path).eval(), Tokenizer.from_pretrained(path), "tiny")


@pytest.fixture(scope="module")
def tiny_server(tiny_backend):
    with start_server(tiny_backend) as server:
        yield server


def hand_greedy(backend, prompt: list[int], steps: int, **controls) -> str:
    """Greedy decoding by full forwards, each step's logits penalized by hand_penalized."""
    output = []
    with torch.no_grad():
        for _ in range(steps):
            logits = backend.model(torch.tensor([prompt + output]))[0, -1].float().tolist()
            logits = hand_penalized(logits, prompt, output, **controls)
            token = max(range(len(logits)), key=logits.__getitem__)
            if token in backend.tokenizer.stop_token_ids:
                break
            output.append(token)
    return backend.tokenizer.decode(output)


CONTROLS = [  # (request fields, hand_penalized's arguments)
    ({"frequency_penalty": 1.5}, dict(frequency=1.5)),
    ({"presence_penalty": 2.0}, dict(presence=2.0)),
    ({"repetition_penalty": 1.8}, dict(repetition=1.8)),
    ({"frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.3},
     dict(frequency=0.5, presence=0.5, repetition=1.3))]


@pytest.mark.parametrize("fields, controls", CONTROLS, ids=[",".join(f) for f, _ in CONTROLS])
def test_a_greedy_reply_equals_the_hand_loop(tiny_backend, fields, controls):
    body = {"messages": USER, "temperature": 0, "max_tokens": 20, **fields}
    [[choice]] = tiny_backend.complete([parse_chat_request(body, tiny_backend)])
    prompt = tiny_backend.tokenizer.apply_chat_template(USER)
    assert choice.text == hand_greedy(tiny_backend, prompt, 20, **controls)
    [[plain]] = tiny_backend.complete([parse_chat_request({**body, **dict.fromkeys(fields)},
                                                          tiny_backend)])
    assert plain.text == hand_greedy(tiny_backend, prompt, 20)
    assert choice.text != plain.text          # the control changed the reply


def test_logit_bias_forces_and_bans_tokens(tiny_backend):
    tokenizer = tiny_backend.tokenizer
    forced = tokenizer.encode("a", special_tokens=False)[0]
    body = {"messages": USER, "temperature": 1.0, "seed": 3, "max_tokens": 6,
            "logit_bias": {str(forced): 100}}
    [[choice]] = tiny_backend.complete([parse_chat_request(body, tiny_backend)])
    assert choice.text == tokenizer.decode([forced] * 6)
    greedy = {"messages": USER, "temperature": 0, "max_tokens": 8, "logprobs": True}
    [[plain]] = tiny_backend.complete([parse_chat_request(greedy, tiny_backend)])
    first = plain.logprobs[0].token_bytes
    first_id = next(t for t in range(tokenizer.vocab_size)
                    if tiny_backend._piece(t, {})[1] == first)
    [[banned]] = tiny_backend.complete([parse_chat_request(
        {**greedy, "logit_bias": {str(first_id): -100}}, tiny_backend)])
    assert first not in [t.token_bytes for t in banned.logprobs]


def test_a_row_s_reply_does_not_depend_on_its_batch(tiny_backend):
    mine = {"messages": USER, "temperature": 0.9, "seed": 5, "max_tokens": 16,
            "frequency_penalty": 1.0, "logit_bias": {"7": 3}}
    other = {"messages": [{"role": "user", "content": "Other words here"}], "temperature": 0.7,
             "seed": 1, "max_tokens": 10, "presence_penalty": -2, "repetition_penalty": 1.5, "n": 2}
    [alone] = tiny_backend.complete([parse_chat_request(mine, tiny_backend)])
    together = tiny_backend.complete([parse_chat_request(other, tiny_backend),
                                      parse_chat_request(mine, tiny_backend)])
    assert [c.text for c in together[1]] == [c.text for c in alone]


BAD = [  # (field, value, param)
    ("frequency_penalty", 2.5, "frequency_penalty"), ("presence_penalty", "1", "presence_penalty"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("repetition_penalty", 11, "repetition_penalty"),
    ("logit_bias", [1, 2], "logit_bias"), ("logit_bias", {"abc": 1}, "logit_bias.abc"),
    ("logit_bias", {"5": 101}, "logit_bias.5"), ("logit_bias", {"5": True}, "logit_bias.5"),
    ("logit_bias", {"99999999": 1}, "logit_bias.99999999")]


@pytest.mark.parametrize("field, value, param", BAD, ids=[f"{f}={v}" for f, v, _ in BAD])
def test_bad_values_are_a_400_naming_the_field(tiny_server, field, value, param):
    for path, body in (("/chat/completions", {"messages": USER}),
                       ("/completions", {"prompt": "hi"})):
        reply = requests.post(tiny_server.url + path, json={**body, field: value}, timeout=60)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param


# ---- echo ----------------------------------------------------------------------------------------
def test_echo_puts_the_prompt_before_the_reply_streamed_and_not(tiny_server, tiny_backend):
    body = {"prompt": ["Once upon", "a time"], "temperature": 0, "max_tokens": 6}
    plain = requests.post(tiny_server.url + "/completions", json=body, timeout=60).json()
    echoed = requests.post(tiny_server.url + "/completions", json={**body, "echo": True},
                           timeout=60).json()
    assert [c["text"] for c in echoed["choices"]] == [p + c["text"] for p, c in
                                                     zip(body["prompt"], plain["choices"])]
    assert echoed["usage"] == plain["usage"]
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tiny_server.url, api_key="none")
    texts = ["", ""]
    for chunk in client.completions.create(model="tiny", stream=True, echo=True, **body):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c["text"] for c in echoed["choices"]]
    reply = requests.post(tiny_server.url + "/completions",
                          json={**body, "echo": True, "logprobs": 1}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "echo"


def test_echo_stays_refused_on_chat(tiny_server):
    reply = requests.post(tiny_server.url + "/chat/completions",
                          json={"messages": USER, "echo": True}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "echo"


# ---- the official client -------------------------------------------------------------------------
def test_openai_client_sends_every_control(tiny_server, tiny_backend):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tiny_server.url, api_key="none")
    fields = {"frequency_penalty": 0.4, "presence_penalty": 0.3, "logit_bias": {"9": 2.5}}
    reply = client.chat.completions.create(model="tiny", messages=USER, temperature=0,
                                           max_tokens=12, extra_body={"repetition_penalty": 1.4},
                                           **fields)
    prompt = tiny_backend.tokenizer.apply_chat_template(USER)
    want = hand_greedy(tiny_backend, prompt, 12, frequency=0.4, presence=0.3, repetition=1.4,
                       bias={9: 2.5})
    assert reply.choices[0].message.content == want
    legacy = client.completions.create(model="tiny", prompt="Once upon", temperature=0,
                                       max_tokens=8, extra_body={"repetition_penalty": 1.4},
                                       **fields)
    ids = tiny_backend._text_prompt("Once upon")
    assert legacy.choices[0].text == hand_greedy(tiny_backend, ids, 8, frequency=0.4, presence=0.3,
                                                 repetition=1.4, bias={9: 2.5})
    [request] = parse_completion_request({"prompt": "x", **fields}, tiny_backend)
    assert request.penalties is not None
