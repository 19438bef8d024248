"""A request body as minskill.serve.server reads it: by its Content-Length or chunked, then decoded
as JSON.

`read_body(rfile, headers, max_bytes, timeout)` reads exactly the body the headers announce:
`Content-Length: N`, or `Transfer-Encoding: chunked` (what a client sends when it streams its body
or does not know its length in advance: chunks of `<hex size>[;extension]\r\n<data>\r\n`, ended by
a zero-size chunk and optional trailers). Neither is a 411; both at once a 400 (the two could
disagree on where the body ends: request smuggling); another transfer coding a 501. A body over
`max_bytes` is a 413, one cut short a 400 (never served as if complete), one that does not arrive
in time a 408; the reads share the connection's deadline (minskill.serve.server).
`decode_json(raw)` is the payload, or a 400 naming what is wrong with it. """
from __future__ import annotations

import json
import re

from minskill.serve.backends import ClientGone
from minskill.serve.client import lone_surrogate_at
from minskill.serve.errors import BackendError, bad_request

MAX_CHUNK_LINE = 1024   # bytes of a chunk-size line or a trailer line


def read_body(rfile, headers, max_bytes: int, timeout: float) -> bytes:
    """The body of the request whose `headers` were just read from `rfile` (module docstring)."""
    coding, length = headers.get("Transfer-Encoding"), headers.get("Content-Length")
    try:
        if coding is None:
            return _read_sized(rfile, length, max_bytes)
        if length is not None:
            raise bad_request("the request has both Content-Length and Transfer-Encoding: send one")
        if coding.strip().lower() != "chunked":
            raise BackendError(501, f"Transfer-Encoding {coding!r:.50} is not implemented: send "
                                    f"'chunked' or a Content-Length", "invalid_request_error",
                                    "not_implemented")
        return _read_chunked(rfile, max_bytes)
    except TimeoutError:
        raise BackendError(408, f"the request body did not arrive within {timeout} s",
                           "invalid_request_error", "request_timeout") from None
    except ConnectionError:
        raise ClientGone() from None


def _too_large(size: int, max_bytes: int) -> BackendError:
    return BackendError(413, f"the request body has {size} bytes; the limit is {max_bytes}",
                        "invalid_request_error", "request_too_large")


def _read_sized(rfile, length: str | None, max_bytes: int) -> bytes:
    if length is None:
        raise BackendError(411, "a Content-Length header (or Transfer-Encoding: chunked) is "
                                "required",
                           "invalid_request_error", "length_required")
    if not re.fullmatch("[0-9]{1,18}", length):  # (str.isdigit() and int() also take '²' and '٣')
        raise bad_request(f"bad Content-Length header {length!r:.50}: want a decimal byte count")
    if int(length) > max_bytes:
        raise _too_large(int(length), max_bytes)
    raw = rfile.read(int(length))
    if len(raw) < int(length):  # the client half-closed early: what came is no request, even if it
                                # parses
        raise bad_request(f"the request body ended after {len(raw)} of the {int(length)} bytes its "
                          "Content-Length announces")
    return raw


def _line(rfile, what: str) -> bytes:
    line = rfile.readline(MAX_CHUNK_LINE + 1)
    if not line.endswith(b"\n"):
        raise bad_request(f"the chunked request body ended or has a {what} line over "
                          f"{MAX_CHUNK_LINE} bytes")
    return line.rstrip(b"\r\n")


def _read_chunked(rfile, max_bytes: int) -> bytes:
    body = bytearray()
    while True:
        size_text = _line(rfile, "chunk-size").split(b";")[0].strip()
        if not re.fullmatch(rb"[0-9A-Fa-f]{1,15}", size_text):
            raise bad_request(f"bad chunk size {size_text[:50]!r} in the chunked request body: "
                              f"want hex digits")
        size = int(size_text, 16)
        if size == 0:
            while _line(rfile, "trailer"):   # trailers, if any, up to the empty line
                pass
            return bytes(body)
        if len(body) + size > max_bytes:
            raise _too_large(len(body) + size, max_bytes)
        data = rfile.read(size)
        if len(data) < size or rfile.read(2) != b"\r\n":
            raise bad_request("the chunked request body ended inside a chunk (or a chunk lacks its "
                              "CRLF)")
        body += data


def decode_json(raw: bytes):
    """The JSON payload of a body, or a 400 naming what is wrong: not UTF-8 JSON, too deep, a lone
    surrogate."""
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise bad_request(f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply to decode") from None
    if (where := lone_surrogate_at(payload)) is not None:
        raise bad_request(f"{where} has a lone surrogate (a \\ud800-\\udfff escape without its "
                          f"pair): strings must be Unicode text", where)
    return payload
