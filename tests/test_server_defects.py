"""Defects of the server and its client (issue 48): a stop string checked on the new text only
(the same answer as decoding the whole reply, which made decoding quadratic), a client that reads
no reply over max_reply_bytes, `python -m minskill.serve` errors instead of tracebacks (an
infinite --prefix-cache-mb, a port in use), and `max_completion_tokens` beside `max_tokens` never
ignored."""
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
import torch

from minskill.cli import client_args, reply_megabytes
from minskill.nn.sampling import _cut_at_stop, generate, stop_string_ended
from minskill.nn.tokenizer import Tokenizer
from minskill.nn.weights import load_model
from minskill.serve.constrained import BYTE_OF_CHAR
from minskill.serve.client import ChatClient, ChatError
from minskill.serve.scheduler import Engine, sequences_for
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import main, start_server
from tiny import make_tiny_model_dir, make_tiny_tokenizer_dir

torch.set_num_threads(1)
USER = [{"role": "user", "content": "hi"}]

# ---- stop strings: the new text only ------------------------------------------------------------

SNIPPETS = ["The answer is 42.", " café", " naïve résumé", " 日本語", " emoji 🙂", " ✓ → ≤ ≥ ±",
            "\n", " °C", " Then stop", "<think>", " a", "é"]


def _random_reply(tokenizer, rng) -> list[int]:
    """Tokens of text (multi-byte characters split across tokens) mixed with arbitrary tokens:
    merges, bytes that are no character alone (runs of UTF-8 continuation bytes), runs of the
    special tokens decode skips."""
    continuation = [tokenizer.token_to_id(char) for char, byte in BYTE_OF_CHAR.items()
                    if 0x80 <= byte < 0xC0]
    tokens = []
    while len(tokens) < 40:
        kind = rng.random()
        if kind < 0.45:
            tokens += tokenizer.encode(rng.choice(SNIPPETS), special_tokens=False)
        elif kind < 0.8:
            tokens.append(rng.randrange(3, tokenizer.backend.get_vocab_size()))
        elif kind < 0.9:
            tokens += rng.choices(continuation, k=rng.randrange(1, 6))
        else:    # <|endoftext|> <|im_start|> <|im_end|>: no text
            tokens += rng.choices(range(3), k=rng.randrange(1, 12))
    return tokens


def _stop_strings(text: str, rng) -> list[str]:
    """Pieces of the reply's text (across token boundaries, through multi-byte characters, U+FFFD
    too), or strings it lacks."""
    stops = []
    for _ in range(rng.randrange(1, 4)):
        if text and rng.random() < 0.8:
            start = rng.randrange(len(text))
            stops.append(text[start:start + rng.randrange(1, 12)])
        else:
            stops.append(rng.choice(["never here", "日本", "🙂!", "\ufffd\ufffd", "\ufffd" * 4, "zz"]))
    return stops


def test_the_stop_check_on_the_new_text_gives_the_full_decode_answer(tmp_path):
    """At every step of random replies, stop_string_ended equals _cut_at_stop on the whole decoded
    reply (as the engine and generate check it: after each token, so until the first stop)."""
    tokenizer = Tokenizer.from_pretrained(make_tiny_tokenizer_dir(tmp_path / "tok"))
    rng = random.Random(0)
    steps = stopped = late = 0
    for _ in range(400):
        reply = _random_reply(tokenizer, rng)
        stops = _stop_strings(tokenizer.decode(reply), rng)
        for i in range(1, len(reply) + 1):
            full = _cut_at_stop(tokenizer.decode(reply[:i]), stops) is not None
            assert stop_string_ended(tokenizer, reply[:i], stops) == full, (reply[:i], stops)
            steps += 1
            if full:
                stopped += 1
                late += i > max(map(len, stops)) + 8  # found through a window, not the whole reply
                break
    assert stopped > 200 and late > 100 and steps > 4000   # both answers, often, on long replies


def test_a_window_that_opens_inside_a_character_is_not_read_as_replacement_characters(tmp_path):
    """日 is 3 bytes: a window of the last 10 tokens starts at its second byte and decodes it as two
    U+FFFD, which the reply does not hold."""
    tokenizer = Tokenizer.from_pretrained(make_tiny_tokenizer_dir(tmp_path / "tok"))
    byte = {b: tokenizer.token_to_id(char) for char, b in BYTE_OF_CHAR.items()}
    reply = [byte[b] for b in "日".encode()] + [0] * 7 + tokenizer.encode("a", special_tokens=False)
    assert tokenizer.decode(reply) == "日a" and tokenizer.decode(reply[-10:]) == "\ufffd\ufffda"
    for stop in ("\ufffda", "\ufffd\ufffd", "日a", "a"):
        want = _cut_at_stop(tokenizer.decode(reply), [stop]) is not None
        assert stop_string_ended(tokenizer, reply, [stop]) == want, stop


class CountingTokenizer:
    """A tokenizer that records how many tokens each decode call was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, []

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def decode(self, ids, **kwargs):
        self.decoded.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("defects") / "m", family="llama",
                               chat_format="chatml", init_std=0.2)
    model, tokenizer = load_model(str(path))
    return model.eval(), tokenizer, path


STOP = "never in any reply"
REPLY = 120


def _long_decodes(decoded: list[int]) -> int:
    """The decode calls given more tokens than a check needs
    (the stop string's length, a margin)."""
    return sum(n > 2 * (len(STOP) + 8) for n in decoded)


def test_generate_checks_a_stop_string_on_the_last_tokens_only(tiny):
    model, tokenizer, _ = tiny
    counting = CountingTokenizer(tokenizer)
    prompt = tokenizer.encode("Write a long story.", special_tokens=False)
    out = generate(model, [prompt], n=2, max_new_tokens=REPLY, temperature=1.0, seed=3,
                   tokenizer=counting, stop_strings=[STOP])
    assert [len(s.token_ids) for s in out] == [REPLY, REPLY]
    assert all(s.finish_reason == "length" for s in out)
    assert _long_decodes(counting.decoded) <= 2  # each sample's final text only, not every step


def test_the_engine_checks_a_stop_string_on_the_last_tokens_only(tiny):
    model, tokenizer, _ = tiny
    counting = CountingTokenizer(tokenizer)
    engine = Engine(model, counting, [], tokenizer.pad_token_id)
    prompt = tokenizer.encode("Write a long story.", special_tokens=False)
    rows = sequences_for(prompt, 2, 3, max_new_tokens=REPLY, stop_strings=(STOP,), temperature=1.0)
    engine.run(rows)
    assert ([len(s.tokens) for s in rows] == [REPLY, REPLY]
            and all(s.finish == "length" for s in rows))
    assert _long_decodes(counting.decoded) == 0


# ---- the client reads no reply over max_reply_bytes ---------------------------------------------

HUGE = 48 << 20         # what the server offers to send
CAP = 1 << 20           # what the client accepts


class HugeReplies(BaseHTTPRequestHandler):
    """Answers every POST with HUGE bytes: a JSON body with a Content-Length, or server-sent events,
    chunked, without one (`sent` counts what got out before the client hung up)."""
    protocol_version = "HTTP/1.1"
    streaming = False
    sent = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        if self.streaming:
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        event = b'data: {"choices": [{"delta": {"content": "xxxxxxxx"}}]}\n\n'
        piece = event * 1000 if self.streaming else b" " * 65536
        try:
            while type(self).sent < HUGE:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if self.streaming else piece)
                type(self).sent += len(piece)
        except OSError:
            return

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("streaming", [False, True])
def test_the_client_stops_reading_a_reply_over_its_cap(streaming):
    handler = type("Handler", (HugeReplies,), {"streaming": streaming, "sent": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = ChatClient(f"http://127.0.0.1:{server.server_port}/v1", model="m", max_retries=0,
                            timeout=60, max_reply_bytes=CAP)
        with pytest.raises(ChatError, match="reply body too large") as caught:
            client.chat(USER, max_tokens=4)
        said = f"more than {CAP} bytes arrived" if streaming else f"Content-Length is {HUGE} bytes"
        assert said in str(caught.value) and f"max_reply_bytes = {CAP}" in str(caught.value)
    finally:
        server.shutdown()
        server.server_close()
    assert handler.sent < HUGE // 2          # the client hung up: the rest was never sent


def test_a_reply_under_the_cap_is_read_whole():
    with start_server(ScriptedBackend(lambda messages, request: "word " * 200,
                                      name="echo")) as server:
        reply = server.client(max_reply_bytes=4096).chat(USER, max_tokens=400)
        assert reply.text.split() == ["word"] * 200
        with pytest.raises(ChatError, match="reply body too large"):
            server.client(max_reply_bytes=200).chat(USER, max_tokens=400)


def test_max_reply_mb_is_a_flag_of_the_scripts_that_reach_the_client():
    import evolve_masa
    args = evolve_masa.build_parser().parse_args(["--max-reply-mb", "0.5"])
    assert client_args(args, "task")["max_reply_bytes"] == 1 << 19
    assert client_args(args, "teacher")["max_reply_bytes"] == 1 << 19
    default = evolve_masa.build_parser().parse_args([])
    assert client_args(default, "task")["max_reply_bytes"] >= 64 << 20
    from minskill import rollout                   # the evaluation command reaches the client too
    args = rollout._parser().parse_args(["--suite", "qa", "--skills", "none", "--max-reply-mb", "2"])
    assert client_args(args, "task")["max_reply_bytes"] == 2 << 20
    for bad in ("0", "-1", "inf", "nan", "x"):
        with pytest.raises(Exception, match="--max-reply-mb must be a finite number > 0"):
            reply_megabytes(bad)
    with pytest.raises(ValueError, match="max_reply_bytes"):
        ChatClient("http://127.0.0.1:1/v1", max_reply_bytes=0)


# ---- python -m minskill.serve: errors, not tracebacks ------------------------------------------

@pytest.mark.parametrize("flag, value", [
    ("--prefix-cache-mb", "inf"), ("--prefix-cache-mb", "1e400"), ("--prefix-cache-mb", "nan"),
    ("--request-timeout", "inf"), ("--port", "70000")])
def test_serve_names_a_flag_it_cannot_use(tiny, capsys, flag, value):
    with pytest.raises(SystemExit) as stopped:
        main(["--model", str(tiny[2]), "--port", "0", flag, value, "--device", "cpu"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} must be" in err and "Traceback" not in err


def test_serve_says_the_port_is_in_use(tiny, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["--model", str(tiny[2]), "--port", str(port), "--prefix-cache-mb", "0",
                     "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot listen on --host 127.0.0.1 --port {port}" in err
    assert "in use" in err


# ---- max_completion_tokens beside max_tokens ----------------------------------------------------

@pytest.mark.parametrize("value, problem", [
    ("x", "'max_completion_tokens' must be an integer"),
    (5, "'max_tokens' (3) and 'max_completion_tokens' (5) differ")])
def test_max_completion_tokens_beside_max_tokens_is_never_ignored(value, problem):
    with start_server(ScriptedBackend(lambda messages, request: "a b c d e f",
                                      name="echo")) as server:
        url, body = server.url + "/chat/completions", {"messages": USER, "max_tokens": 3}
        reply = requests.post(url, json={**body, "max_completion_tokens": value}, timeout=30)
        assert reply.status_code == 400 and problem in reply.json()["error"]["message"]
        assert reply.json()["error"]["param"] == "max_completion_tokens"
        same = requests.post(url, json={**body, "max_completion_tokens": 3}, timeout=30)
        assert (same.status_code == 200
                and same.json()["choices"][0]["message"]["content"] == "a b c")


def test_bench_server_prints_the_stop_string_ratio():
    from minskill.measure.bench_server import STOP_LABELS, Call, WorkloadRow, ratios

    def row(label, wall, text):
        return WorkloadRow("new", label, [Call({"n": 16}, [text] * 16, 10, 1000, wall)], wall)
    lines = ratios([row(STOP_LABELS[0], 10.0, "a story"), row(STOP_LABELS[1], 10.5, "a story")])
    assert "new: decoding with a stop string that never matches / without: wall 1.05× " \
           "(the same replies)" in lines
    lines = ratios([row(STOP_LABELS[0], 10.0, "a story"), row(STOP_LABELS[1], 4.0, "a st")])
    assert any("wall 0.40× (REPLIES DIFFER)" in line for line in lines)
