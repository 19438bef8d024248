"""ChatClient over real loopback HTTP: retries (503, 429, resets, slow replies), Retry-After, errors
that must not be retried, malformed replies, URL/env handling, chat_many, and token accounting."""
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from minskill import client as client_module
from minskill.client import ChatClient, ChatError, ChatResult
from minskill.server import ScriptedBackend, start_server

MESSAGES = [{"role": "user", "content": "what is six times seven"}]


def ok_body(texts=("42",), prompt_tokens=5, completion_tokens=1):
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                        for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class ScriptServer:
    """A loopback HTTP server that answers request i with actions[i] (the last action repeats).

    Actions: ("json", status, body, headers) | ("raw", status, text) | "reset" (drop the connection
    without a reply) | ("slow", seconds) then a normal reply. Every request is recorded.
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
    client = fast_client(server.url, timeout=0.3)
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
    in_an_hour = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3600))
    assert 3500 < client_module._parse_retry_after(in_an_hour) <= 3600
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
