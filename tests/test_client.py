"""ChatClient over real loopback HTTP: retries (503, 429, resets, slow replies), Retry-After (capped,
finite), the whole-call deadline (against servers that trickle their reply), errors that must not be
retried, malformed replies (every failure a counted ChatError), URL/env handling, chat_many, and token
accounting (stats; usage: calls, tokens, request and busy seconds, cache hits apart)."""
import json
import math
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from minskill.serve import client as client_module
from minskill.serve.client import ChatClient, ChatError, ChatResult, Usage
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server

MESSAGES = [{"role": "user", "content": "what is six times seven"}]


def ok_body(texts=("42",), prompt_tokens=5, completion_tokens=1):
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                        for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class ScriptServer:
    """A loopback HTTP server that answers request i with actions[i] (the last action repeats).

    Actions: ("json", status, body, headers) | ("raw", status, text) | ("bytes", body): status 200 and the
    bytes as they are | "reset" (drop the connection without a reply) | ("slow", seconds) then a normal
    reply. Every request is recorded.
    """

    def __init__(self, actions):
        self.actions, self.seen = list(actions), []
        script = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.respond()

            def do_POST(self):
                self.respond()

            def respond(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                index = len(script.seen)
                script.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
                action = script.actions[min(index, len(script.actions) - 1)]
                if action == "reset":  # RST instead of a reply
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if action[0] == "slow":
                    time.sleep(action[1])
                    action = ("json", 200, ok_body(), {})
                if action[0] == "json":
                    _, status, payload, headers = action
                    data = json.dumps(payload).encode()
                elif action[0] == "bytes":
                    _, data = action
                    status, headers = 200, {}
                else:
                    _, status, text = action
                    data, headers = text.encode(), {}
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *args: None  # resets are on purpose
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def script_server():
    servers = []

    def make(*actions):
        servers.append(ScriptServer(actions))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def fast_sleep(monkeypatch):
    """Record backoff sleeps instead of sleeping."""
    slept = []
    monkeypatch.setattr(client_module, "sleep", slept.append)
    return slept


def fast_client(url, **kwargs):
    return ChatClient(url, model="m", **{"backoff_base": 0.001, "backoff_max": 0.01, **kwargs})


ERROR_503 = ("json", 503, {"error": {"message": "overloaded, try later"}}, {})


# ---- retries ----------------------------------------------------------------------------------------
def test_retries_503_then_succeeds(script_server):
    server = script_server(ERROR_503, ERROR_503, ERROR_503, ("json", 200, ok_body(["42"], 7, 1), {}))
    client = fast_client(server.url, max_retries=3)
    result = client.chat(MESSAGES)
    assert result.texts == ["42"] and result.finish_reasons == ["stop"]
    assert len(server.seen) == 4
    assert client.stats == dict(calls=1, prompt_tokens=7, completion_tokens=1, retries=3, failures=0)
    assert all(seen["body"] == server.seen[0]["body"] for seen in server.seen)  # the same request re-sent


def test_retries_connection_reset_and_slow_reply(script_server):
    server = script_server("reset", ("slow", 1.5), ("json", 200, ok_body(["fine"]), {}))
    client = fast_client(server.url, timeout=30, attempt_timeout=0.3)  # a slow attempt is cut and retried
    assert client.chat(MESSAGES).texts == ["fine"]
    assert len(server.seen) == 3
    assert client.stats["retries"] == 2 and client.stats["failures"] == 0


def test_gives_up_after_max_retries(script_server, fast_sleep):
    server = script_server(ERROR_503)
    client = fast_client(server.url, max_retries=2)
    with pytest.raises(ChatError) as caught:
        client.chat(MESSAGES)
    error = caught.value
    assert len(server.seen) == 3 and len(fast_sleep) == 2
    assert error.status == 503 and error.endpoint == server.url + "/chat/completions"
    assert "gave up after 3 attempts (2 retries)" in str(error) and "overloaded, try later" in str(error)
    assert client.stats == dict(calls=0, prompt_tokens=0, completion_tokens=0, retries=2, failures=1)


def test_gives_up_on_connection_refused(fast_sleep):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = fast_client(f"http://127.0.0.1:{port}/v1", max_retries=1)
    with pytest.raises(ChatError, match=r"gave up after 2 attempts.*connection failed") as caught:
        client.chat(MESSAGES)
    assert caught.value.status is None


def test_retry_after_is_honoured(script_server, fast_sleep):
    server = script_server(("json", 429, {"error": {"message": "rate limited"}}, {"Retry-After": "7"}),
                           ("json", 503, {"error": {"message": "busy"}}, {"Retry-After": "3"}),
                           ("json", 200, ok_body(), {}))
    client = fast_client(server.url, backoff_base=0.001)
    assert client.chat(MESSAGES).text == "42"
    assert len(fast_sleep) == 2 and fast_sleep[0] >= 7 and fast_sleep[1] >= 3


def test_retry_after_http_date():
    def http_date(seconds_ahead):
        return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + seconds_ahead))

    assert 25 < client_module._parse_retry_after(http_date(30)) <= 30
    assert client_module._parse_retry_after(http_date(3600)) == client_module.MAX_RETRY_AFTER
    assert client_module._parse_retry_after("2.5") == 2.5
    assert client_module._parse_retry_after("soon") == 0.0 and client_module._parse_retry_after(None) == 0.0


def test_backoff_is_full_jitter_under_the_exponential_cap():
    client = ChatClient("http://127.0.0.1:1/v1", model="m", backoff_base=0.5, backoff_max=3.0)
    for attempt, cap in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 3.0), (10, 3.0)]:
        delays = [client.backoff_delay(attempt) for _ in range(300)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > 0.8 * cap and min(delays) < 0.2 * cap  # spread over the whole range
    assert all(client.backoff_delay(0, retry_after=9.0) == 9.0 for _ in range(20))


# ---- errors that are not retried -------------------------------------------------------------------
def test_client_error_is_not_retried(script_server, fast_sleep):
    server = script_server(("json", 400, {"error": {"message": "'temperature' must be <= 2", "type":
                                                    "invalid_request_error", "param": "temperature"}}, {}))
    client = fast_client(server.url)
    with pytest.raises(ChatError) as caught:
        client.chat(MESSAGES, temperature=5)
    assert len(server.seen) == 1 and fast_sleep == []
    error = caught.value
    assert (error.status, error.message, error.endpoint) == (400, "'temperature' must be <= 2",
                                                             server.url + "/chat/completions")
    assert "HTTP 400" in str(error) and "/chat/completions" in str(error)
    assert client.stats["failures"] == 1 and client.stats["retries"] == 0


def test_client_error_with_plain_text_body(script_server):
    server = script_server(("raw", 404, "404 page not found"))
    with pytest.raises(ChatError, match="404 page not found") as caught:
        fast_client(server.url).chat(MESSAGES)
    assert caught.value.status == 404 and len(server.seen) == 1


def test_non_json_reply_quotes_the_body(script_server):
    html = "<html><body>" + "proxy login page " * 40 + "</body></html>"
    server = script_server(("raw", 200, html))
    with pytest.raises(ChatError) as caught:
        fast_client(server.url).chat(MESSAGES)
    message = str(caught.value)
    assert "not JSON" in message and "<html><body>proxy login page" in message
    assert html[:200] in message and html[:300] not in message  # quotes the start only
    assert len(server.seen) == 1


@pytest.mark.parametrize("body, problem", [
    ({"object": "chat.completion"}, "no 'choices'"),
    ({"choices": [{"index": 0, "text": "legacy"}]}, "without 'message.content'"),
    ({"choices": [{"index": 0, "message": {"content": 5}}]}, "non-string"),
    (["not", "an", "object"], "no 'choices'"),
])
def test_wrong_shape_reply(script_server, body, problem):
    server = script_server(("json", 200, body, {}))
    with pytest.raises(ChatError, match=problem) as caught:
        fast_client(server.url).chat(MESSAGES)
    assert json.dumps(body)[:20] in str(caught.value)


def test_too_few_choices_is_an_error(script_server):
    server = script_server(("json", 200, ok_body(["one"]), {}))
    with pytest.raises(ChatError, match="1 choices where n=2"):
        fast_client(server.url).chat(MESSAGES, n=2)


# ---- text from a model is Unicode text -------------------------------------------------------------
def test_lone_surrogates_and_bad_bytes_in_a_reply_become_replacement_characters(script_server):
    # "\ud800" is a valid JSON escape that decodes to no Unicode text; \xff is no UTF-8 at all
    body = ('{"choices": [{"index": 0, "message": {"role": "assistant", "content": "a\\ud800b\\udc00"},'
            ' "finish_reason": "stop"}, {"index": 1, "message": {"content": "\\ud83d\\ude00 \xff ok"},'
            ' "finish_reason": "stop"}], "usage": {"prompt_tokens": 1}}')
    server = script_server(("bytes", body.encode("latin-1")),
                           ("raw", 400, '{"error": {"message": "no \\ud800 here"}}'))
    client = fast_client(server.url)
    result = client.chat(MESSAGES, n=2)
    assert result.texts == ["a\ufffdb\ufffd", "\U0001F600 \ufffd ok"]   # a real pair stays one character
    with pytest.raises(ChatError) as caught:       # error messages from the server are text too
        client.chat(MESSAGES)
    assert "no \ufffd here" in str(caught.value)


def test_a_scripted_model_that_writes_a_lone_surrogate_reaches_callers_as_text():
    with start_server(ScriptedBackend(lambda messages, request: "The answer is 3.\ud800")) as server:
        text = server.client().chat(MESSAGES).text
    assert text == "The answer is 3.\ufffd"


# ---- request content, URL and environment ----------------------------------------------------------
def test_request_payload_and_choice_order(script_server):
    body = ok_body(["b", "a"])
    body["choices"][0]["index"], body["choices"][1]["index"] = 1, 0  # servers may list choices in any order
    server = script_server(("json", 200, body, {}))
    client = ChatClient(server.url + "/", model="tiny", api_key="secret")
    result = client.chat(MESSAGES, n=2, temperature=0.7, top_p=0.9, max_tokens=12, stop="\n", seed=3)
    assert result.texts == ["a", "b"]
    seen = server.seen[0]
    assert seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["Authorization"] == "Bearer secret"
    assert seen["body"] == {"model": "tiny", "messages": MESSAGES, "n": 2, "temperature": 0.7, "top_p": 0.9,
                            "max_tokens": 12, "stop": ["\n"], "seed": 3}


def test_environment_and_url_normalisation(script_server, monkeypatch):
    server = script_server(("json", 200, ok_body(), {}))
    root = server.url[:-len("/v1")]
    monkeypatch.setenv("OPENAI_BASE_URL", root)  # a bare host:port gets /v1
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    client = ChatClient(model="m")
    assert client.base_url == server.url
    client.chat(MESSAGES)
    assert server.seen[-1]["path"] == "/v1/chat/completions"
    assert server.seen[-1]["headers"]["Authorization"] == "Bearer from-env"
    for url in (server.url, server.url + "/"):
        assert ChatClient(url, model="m").endpoint == server.url + "/chat/completions"
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ValueError, match="OPENAI_BASE_URL"):
        ChatClient()
    with pytest.raises(ValueError, match="http://host:port/v1"):
        ChatClient("localhost:8000")


def test_model_is_discovered_when_not_given(script_server):
    server = script_server(("json", 200, {"object": "list", "data": [{"id": "served-name"}]}, {}),
                           ("json", 200, ok_body(), {}))
    client = ChatClient(server.url)
    assert client.chat(MESSAGES).text == "42" and client.model == "served-name"
    assert [s["path"] for s in server.seen] == ["/v1/models", "/v1/chat/completions"]
    assert server.seen[1]["body"]["model"] == "served-name"


def test_bad_messages_argument():
    with pytest.raises(TypeError, match="list of"):
        ChatClient("http://127.0.0.1:1/v1", model="m").chat("hello")


# ---- against the real minskill server: chat_many and accounting ------------------------------------
def echo(messages, request):
    return f"{messages[-1]['content']} reply{request.sample_index}"


def test_chat_many_keeps_order_and_counts_tokens():
    with start_server(ScriptedBackend(echo)) as server:
        client = server.client(max_workers=6)
        requests = [{"messages": [{"role": "user", "content": f"q{i} " + "w " * i}], "n": 1 + i % 3}
                    for i in range(30)]
        results = client.chat_many(requests)
        assert all(isinstance(r, ChatResult) for r in results)
        for i, result in enumerate(results):
            n = 1 + i % 3
            assert result.texts == [f"q{i} " + "w " * i + f" reply{j}" for j in range(n)]
            assert result.prompt_tokens == 1 + i and result.completion_tokens == n * (2 + i)
        assert client.stats == dict(calls=30, retries=0, failures=0,
                                    prompt_tokens=sum(r.prompt_tokens for r in results),
                                    completion_tokens=sum(r.completion_tokens for r in results))


def test_chat_many_exceptions():
    with start_server(ScriptedBackend(echo)) as server:
        client = server.client(backoff_base=0.001)
        requests = [{"messages": MESSAGES}, {"messages": MESSAGES, "temperature": 9.0}, {"messages": MESSAGES}]
        results = client.chat_many(requests, return_exceptions=True)
        assert isinstance(results[0], ChatResult) and isinstance(results[2], ChatResult)
        assert isinstance(results[1], ChatError) and results[1].status == 400 and "temperature" in str(results[1])
        with pytest.raises(ChatError, match="temperature"):
            client.chat_many(requests)
        assert client.chat_many([]) == []


# ---- the client keeps its promises -------------------------------------------------------------
class TrickleServer:
    """Answers each request with a valid 200 reply sent one byte every `gap` seconds: from the status
    line on (headers_too) or, after headers sent at once, the body only. Requests' timeouts bound each
    socket read, so without a deadline for the whole call such a server holds a client for minutes."""

    def __init__(self, gap=0.1, headers_too=True):
        self.gap, self.headers_too, self.stopped = gap, headers_too, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        with connection:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                head, body = data.split(b"\r\n\r\n", 1)
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                while len(body) < (int(length.group(1)) if length else 0):
                    body += connection.recv(65536)
                self.requests += 1
                reply = json.dumps(ok_body(["x" * 300])).encode()
                headers = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(reply)}\r\n\r\n").encode()
                slow = headers + reply if self.headers_too else reply
                if not self.headers_too:
                    connection.sendall(headers)
                for i in range(len(slow)):
                    if self.stopped.is_set():
                        return
                    connection.sendall(slow[i:i + 1])
                    time.sleep(self.gap)
            except OSError:  # the client cut the connection: what the test wants
                return

    def close(self):
        self.stopped.set()
        self.listener.close()


@pytest.mark.parametrize("headers_too, max_retries, proxy", [(True, 0, False), (False, 0, False), (True, 3, False),
                                                            (True, 0, True)],
                         ids=["trickled-headers", "trickled-body", "trickled-with-retries", "through-a-proxy"])
def test_timeout_bounds_the_whole_call(monkeypatch, headers_too, max_retries, proxy):
    server = TrickleServer(gap=0.1, headers_too=headers_too)  # ~40 s to send a whole reply
    url = server.url
    if proxy:  # requests sends "POST http://chat.test/v1/..." to the proxy, which trickles its reply
        monkeypatch.setenv("HTTP_PROXY", server.url[:-len("/v1")])
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        url = "http://chat.test/v1"
    try:
        client = fast_client(url, timeout=1.0, max_retries=max_retries)
        started = time.monotonic()
        with pytest.raises(ChatError, match="1.0 s") as caught:
            client.chat(MESSAGES)
        assert time.monotonic() - started < 10  # the old per-read timeout let this run for ~40 s
        assert caught.value.status is None and server.requests >= 1
        assert client.stats["failures"] == 1 and client.stats["calls"] == 0
    finally:
        server.close()


def test_a_retry_that_would_start_after_the_deadline_is_not_made(script_server):
    server = script_server(("json", 503, {"error": {"message": "busy"}}, {"Retry-After": "30"}),
                           ("json", 200, ok_body(), {}))
    client = fast_client(server.url, timeout=2.0, max_retries=1)
    started = time.monotonic()
    with pytest.raises(ChatError, match="busy") as caught:
        client.chat(MESSAGES)
    assert time.monotonic() - started < 10  # the old client slept the whole 30 s first
    assert "deadline" in str(caught.value) and caught.value.status == 503 and len(server.seen) == 1
    assert client.stats["failures"] == 1 and client.stats["retries"] == 0


def test_retry_after_is_capped_and_must_be_finite(script_server, fast_sleep):
    busy = [("json", 503, {"error": {"message": "busy"}}, {"Retry-After": value})
            for value in ("86400", "inf", "nan", "-3", "1e309")]
    server = script_server(*busy, ("json", 200, ok_body(), {}))
    client = fast_client(server.url, timeout=1e6, max_retries=len(busy))
    assert client.chat(MESSAGES).text == "42"
    cap = client_module.MAX_RETRY_AFTER
    assert 0 < cap <= 600 and len(fast_sleep) == len(busy)
    assert fast_sleep[0] == cap                     # a day is cut to the cap
    assert all(0 <= s <= 0.01 for s in fast_sleep[1:])  # non-finite and negative values are ignored
    assert client_module._parse_retry_after("86400") == cap
    for value in ("inf", "-inf", "nan", "-3", "1e309"):
        assert client_module._parse_retry_after(value) == 0.0


@pytest.mark.parametrize("usage", ['{"prompt_tokens": "five"}', '{"prompt_tokens": 1.5}',
                                   '{"completion_tokens": [1]}', '{"prompt_tokens": -2}',
                                   '{"completion_tokens": true}', '{"prompt_tokens": NaN}',
                                   '{"completion_tokens": 1e999}'])
def test_non_integer_usage_is_a_chat_error(script_server, usage):
    body = json.dumps(ok_body())
    body = body[:body.index('"usage"')] + f'"usage": {usage}}}'
    server = script_server(("raw", 200, body))
    client = fast_client(server.url)
    with pytest.raises(ChatError, match="usage"):
        client.chat(MESSAGES)
    assert client.stats["failures"] == 1


DEEP = "[" * 100_000 + "]" * 100_000
BAD_REPLIES = [  # (id, model: None = ask /v1/models first, n, what the server answers, words in the ChatError)
    ("deeply-nested-reply", "m", 1, [("raw", 200, DEEP)], "not JSON"),
    ("deeply-nested-error", "m", 1, [("raw", 400, '{"error": ' + DEEP + "}")], "HTTP 400"),
    ("deeply-nested-503", "m", 1, [("raw", 503, DEEP)], "gave up"),
    ("non-string-finish-reason", "m", 1, [("json", 200, {"choices": [{"index": 0, "message": {"content": "a"},
                                                                  "finish_reason": 7}]}, {})], "finish_reason"),
    ("unsortable-indices", "m", 2, [("json", 200, {"choices": [{"index": "0", "message": {"content": "a"}},
                                                            {"index": 1, "message": {"content": "b"}}]}, {})], "index"),
    ("model-list-deeply-nested", None, 1, [("raw", 200, DEEP)], "GET"),
    ("model-id-not-a-string", None, 1, [("json", 200, {"data": [{"id": 7}]}, {}), ("json", 200, ok_body(), {})], "GET"),
    ("model-id-empty", None, 1, [("json", 200, {"data": [{"id": ""}]}, {}), ("json", 200, ok_body(), {})], "GET"),
]


@pytest.mark.parametrize("model, n, actions, words", [case[1:] for case in BAD_REPLIES],
                         ids=[case[0] for case in BAD_REPLIES])
def test_every_failure_is_a_counted_chat_error(script_server, fast_sleep, model, n, actions, words):
    server = script_server(*actions)
    client = ChatClient(server.url, model=model, max_retries=1, backoff_base=0.001)
    with pytest.raises(ChatError, match=words) as caught:
        client.chat(MESSAGES, n=n)
    if model is None:  # the failure names the request that failed
        assert f"GET {server.url}/models" in str(caught.value) and len(server.seen) == 1
    assert client.stats["failures"] == 1 and client.stats["calls"] == 0


def test_an_unsendable_api_key_is_a_chat_error(script_server):
    server = script_server(("json", 200, ok_body(), {}))
    client = fast_client(server.url, api_key="ключ")  # not latin-1: no HTTP header can carry it
    with pytest.raises(ChatError, match="Authorization|latin-1"):
        client.chat(MESSAGES)
    assert client.stats["failures"] == 1 and server.seen == []


# ---- cost accounting: calls, tokens, seconds (client.Usage, ChatClient.usage, CachingClient.usage) --------
def test_usage_sums_the_reported_tokens_and_times_the_calls(script_server):
    """A scripted server reports known usage counts: the client's usage equals their sum; a failed call counts
    as a failure with no tokens; request seconds sum the calls, busy seconds are wall time (<= their sum)."""
    replies = [("json", 200, ok_body(["a"], 11, 3), {}), ("json", 200, ok_body(["b"], 7, 5), {}),
               ("json", 400, {"error": {"message": "bad"}}, {}), ("json", 200, ok_body(["c"], 2, 1), {})]
    server = script_server(*replies)
    client = fast_client(server.url, max_retries=0)
    assert client.chat(MESSAGES).seconds > 0 and client.chat(MESSAGES).text == "b"
    with pytest.raises(ChatError):
        client.chat(MESSAGES)
    client.chat(MESSAGES)
    usage = client.usage
    assert (usage["calls"], usage["failures"], usage["prompt_tokens"], usage["completion_tokens"]) == (3, 1, 20, 9)
    assert 0 < usage["busy_seconds"] <= usage["request_seconds"] + 1e-6 and math.isfinite(usage["request_seconds"])
    assert client.stats["calls"] == 3                            # stats unchanged alongside


def test_concurrent_request_seconds_exceed_the_busy_wall_seconds():
    """8 slow calls in flight together: their summed request seconds are several times the wall (busy) seconds."""
    server = ScriptServer([("slow", 0.2)])
    try:
        client = fast_client(server.url, max_workers=8)
        client.chat_many([{"messages": MESSAGES}] * 8)
        usage = client.usage
        assert usage["calls"] == 8 and usage["prompt_tokens"] == 8 * 5 and usage["completion_tokens"] == 8
        assert usage["request_seconds"] > 3 * usage["busy_seconds"] > 0
    finally:
        server.close()


def test_caching_client_counts_cache_hits_apart_at_no_cost_and_continues_saved_counts(tmp_path):
    from minskill.serve.caching import CachingClient

    with start_server(ScriptedBackend(echo)) as server:
        inner = server.client()
        first = CachingClient(inner, tmp_path / "cache.jsonl")
        requests = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(4)]
        sent = first.chat_many(requests)
        before = first.usage
        assert before["calls"] == 4 and before["cache_hits"] == 0
        assert before["prompt_tokens"] == sum(r.prompt_tokens for r in sent) > 0
        assert before["completion_tokens"] == sum(r.completion_tokens for r in sent) > 0
        hits = first.chat_many(requests)                     # all four from the cache
        after = first.usage
        assert after["cache_hits"] == 4 and all(r.seconds == 0 for r in hits)
        assert {k: after[k] for k in Usage.FIELDS if k != "busy_seconds"} == \
               {k: before[k] for k in Usage.FIELDS if k != "busy_seconds"}   # hits cost no call, token or second
        # two wrappers on one inner client count only their own calls; a saved usage is continued
        other = CachingClient(inner, None, usage=after)
        other.chat(requests[0]["messages"])
        again = other.usage
        assert again["calls"] == 5 and again["cache_hits"] == 4 and first.usage["calls"] == 4
        assert again["prompt_tokens"] == after["prompt_tokens"] + sent[0].prompt_tokens
        assert inner.usage["calls"] == 5                     # the inner client saw every call sent


# ---- reasoning models -------------------------------------------------------------------------------
def test_extra_body_is_merged_into_the_request_and_reasoning_fields_are_set_apart(script_server):
    body = ok_body(["Paris", "<think>\nRome?\n</think>\n\nParis"], completion_tokens=40)
    body["choices"][0]["message"]["reasoning_content"] = "France: Paris"     # vLLM --reasoning-parser
    body["usage"]["completion_tokens_details"] = {"reasoning_tokens": 30}    # reported: counted as given
    server = script_server(("json", 200, body, {}), ("json", 200, ok_body(["<think>a b c d e f</think>42"]), {}),
                           ("json", 200, ok_body(["42"]), {}))
    client = ChatClient(server.url, model="m", extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                                           "top_k": 20})
    result = client.chat(MESSAGES, n=2, max_tokens=64)
    assert server.seen[0]["body"] == {"model": "m", "messages": MESSAGES, "n": 2, "temperature": 0.0, "top_p": 1.0,
                                      "max_tokens": 64, "chat_template_kwargs": {"enable_thinking": False}, "top_k": 20}
    assert (result.texts, result.reasonings) == (["Paris", "Paris"], ["France: Paris", "Rome?"])
    assert result.reasoning_tokens == 30
    estimated = client.chat(MESSAGES)   # not reported: completion_tokens (1) × 11 reasoning chars / 13 chars
    assert (estimated.text, estimated.reasoning, estimated.reasoning_tokens) == ("42", "a b c d e f", 1)
    assert client.usage["reasoning_tokens"] == 31
    plain = ChatClient(server.url, model="m").chat(MESSAGES)
    assert plain.reasonings is None and plain.reasoning == "" and plain.reasoning_tokens == 0


def test_the_cache_keys_on_the_extra_body_and_keeps_the_reasoning(tmp_path):
    from minskill.serve.caching import CachingClient, request_key

    request = {"messages": MESSAGES}
    assert request_key("m", request) == request_key("m", request, {}) != request_key("m", request, {"a": 1})
    with start_server(ScriptedBackend(lambda messages, request: "<think>hmm hmm hmm</think>yes")) as server:
        for extra in (None, {"chat_template_kwargs": {"enable_thinking": False}}):
            CachingClient(server.client(extra_body=extra), tmp_path / "cache.jsonl").chat(MESSAGES)
        reread = CachingClient(server.client(), tmp_path / "cache.jsonl")
        hit = reread.chat(MESSAGES)
    assert reread.stats == {"calls": 0, "cache_hits": 1, "cached_entries": 2}   # two keys: one per extra body
    assert (hit.text, hit.reasoning, hit.reasoning_tokens) == ("yes", "hmm hmm hmm", 2)   # 3 words × 11 / 14 chars
