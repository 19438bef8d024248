"""Every JSONL reader reads files the way people and killed runs write them: a UTF-8 byte order mark and
CRLF line ends are accepted, bytes that are not UTF-8 are an error naming FILE:LINE (a cache file's torn
last line excepted), and the same text gives the same records whichever reader reads it."""
import json

import pytest

from minskill import rollout
from minskill.files import read_jsonl
from minskill.masa import rewriter_sft as sft
from minskill.rollout import Trajectory
from minskill.serve.caching import CachingClient
from minskill.serve.client import ChatResult
from minskill.tasks import load_suite

BOM = b"\xef\xbb\xbf"


class Inner:
    model = "m"

    def __init__(self):
        self.sent = []

    def chat_many(self, requests, return_exceptions=False):
        self.sent.extend(requests)
        return [ChatResult([f"caf\u00e9 \u2028 {len(self.sent)}"], ["stop"], 3, 4) for _ in requests]


def _cache_lines(tmp_path, k=3) -> list[bytes]:
    path = tmp_path / "made.jsonl"
    client = CachingClient(Inner(), path)
    for i in range(k):
        client.chat([{"role": "user", "content": f"q{i}"}])
    return path.read_bytes().splitlines(keepends=True)


def test_the_call_cache_accepts_a_byte_order_mark(tmp_path):
    path = tmp_path / "cache.jsonl"
    path.write_bytes(BOM + b"".join(line.replace(b"\n", b"\r\n") for line in _cache_lines(tmp_path)))
    restarted = CachingClient(Inner(), path)
    assert restarted.stats["cached_entries"] == 3
    assert restarted.chat([{"role": "user", "content": "q0"}]).texts == ["caf\u00e9 \u2028 1"]
    assert restarted.inner.sent == []                      # answered from the cache, BOM line included


def test_the_call_cache_refuses_invalid_utf8_but_drops_a_torn_last_line(tmp_path):
    lines = _cache_lines(tmp_path)
    path = tmp_path / "cache.jsonl"
    path.write_bytes(lines[0] + lines[1].replace("é".encode(), b"\xe9") + lines[2])
    with pytest.raises(ValueError, match=r"cache.jsonl:2: not UTF-8"):
        CachingClient(Inner(), path)
    cut = lines[2].index("é".encode()) + 1                # inside the two bytes of 'é'
    path.write_bytes(lines[0] + lines[1] + lines[2][:cut])
    assert CachingClient(Inner(), path).stats["cached_entries"] == 2


def test_a_cache_line_of_the_wrong_shape_is_an_error_naming_it(tmp_path):
    """A line that is JSON but not a cached call (edited, or another file): refused naming FILE:LINE and the
    field when the cache opens (it used to be a TypeError at the call it answered, mid-run)."""
    lines = _cache_lines(tmp_path)
    path = tmp_path / "cache.jsonl"
    record = json.loads(lines[1])
    record["result"]["texts"] = "abc"
    path.write_bytes(lines[0] + json.dumps(record).encode() + b"\n" + lines[2])
    with pytest.raises(ValueError, match=r"cache.jsonl:2: field result.texts: expected a list, got the string 'abc'"):
        CachingClient(Inner(), path)
    record["result"] = {**json.loads(lines[1])["result"], "extra": 1}    # a field more: kept out of the result
    path.write_bytes(lines[0] + json.dumps(record).encode() + b"\n" + lines[2])
    assert CachingClient(Inner(), path).chat([{"role": "user", "content": "q1"}]).texts == ["caf\u00e9 \u2028 2"]


def test_every_reader_reads_the_same_bom_crlf_file_alike(tmp_path):
    rows = [{"model_card": {"name": "m"}, "skills_in": {}, "task_description": "Sums \u2028 of numbers.",
             "skills_out": {}, "question": f"What is {i} + 1?", "answer": str(i + 1), "id": f"t{i}",
             "task_id": f"t{i}", "task_type": "qa", "messages": []} for i in range(3)]
    path = tmp_path / "data.jsonl"
    path.write_bytes(BOM + "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows).encode())
    assert [r for _, r in read_jsonl(path)] == rows
    assert sft.read_records([path], warn=pytest.fail)[0] == rows
    assert [t.id for t in load_suite("qa", "all", path=path)] == ["t0", "t1", "t2"]
    assert [t.task_id for t in rollout.load_trajectories(path)] == ["t0", "t1", "t2"]
