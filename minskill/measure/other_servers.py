"""The servers `bench server` measures minskill's against: llama.cpp's (started by the bench, in
a subprocess of its own, from the xllamacpp wheel) and any OpenAI-compatible URL (`--against
NAME=URL[@PID]`), with the CPU seconds each process used (docs/benchmarks.md)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
import torch

from minskill.nn.weights import DEFAULT_MODEL, default_gguf_path
from minskill.serve.client import ChatClient
from minskill.serve.embedded import stop_process

LLAMA_CPP = "llama-cpp"   # the name of llama.cpp's server in tables and --against


def process_cpu_seconds(pid: int | None) -> float | None:
    """The CPU seconds process `pid` has used so far, its waited-for children's included: utime +
    stime + cutime + cstime of /proc/PID/stat; None without a pid, off Linux (no /proc) or once
    it is gone."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the fields after the command name (which may hold spaces), from field 3 (state) on
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------- other servers


@dataclass
class Against:
    """A server of --against: llama.cpp started here on `gguf` (url None), or one running at url."""
    name: str
    url: str | None = None
    pid: int | None = None
    gguf: str | None = None


def parse_against(text: str) -> list[Against]:
    """--against's entries (module docstring); SystemExit naming the flag and the entry when one is
    bad."""
    servers = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        name, has_url, target = entry.partition("=")
        url, has_pid, pid = target.rpartition("@")
        if not pid.isdigit():   # no @PID: the @ (if any) belongs to the URL
            url, has_pid, pid = target, "", ""
        why = None
        if not has_url and name != LLAMA_CPP:
            why = f"unknown server; give {LLAMA_CPP} or NAME=URL[@PID]"
        elif has_url and not re.fullmatch(r"[\w.-]+", name):
            why = "NAME must be letters, digits, '_', '.' or '-'"
        elif has_url and not re.fullmatch(r"https?://[^\s/]+(/\S*)?/v1/?", url):
            why = "the URL must be an http(s) base URL ending in /v1, e.g. http://127.0.0.1:8080/v1"
        elif has_pid and int(pid) < 1:
            why = "the PID must be >= 1"
        elif name in (s.name for s in servers):
            why = "named twice"
        if why:
            raise SystemExit(f"bench server: --against: {entry!r}: {why}")
        servers.append(Against(name, url.rstrip("/") if has_url else None,
                               int(pid) if has_pid else None))
    return servers


def llama_cpp_gguf(args) -> str:
    """The GGUF llama.cpp serves: --gguf, else the offline default's; SystemExit saying what is
    missing."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise SystemExit(f"bench server: --against {LLAMA_CPP} needs xllamacpp: "
                         "pip install -r tests/requirements.txt")
    if args.gguf is None and args.model != DEFAULT_MODEL:
        raise SystemExit(f"bench server: --against {LLAMA_CPP}: pass --gguf (of {args.model})")
    try:
        gguf = Path(args.gguf) if args.gguf else default_gguf_path()
    except FileNotFoundError as error:
        raise SystemExit(f"bench server: --against {LLAMA_CPP}: {error}")
    if not gguf.is_file():
        raise SystemExit(f"bench server: --gguf: no such file: {gguf}")
    return str(gguf)


@contextmanager
def against_client(args, server: Against):
    """(a ChatClient, the server's pid or None) for an --against server; llama.cpp is started here
    and stopped when the block exits."""
    if server.url is not None:
        print(f"{server.name}: {server.url}, pid {server.pid or '– (no CPU seconds)'}", flush=True)
        yield ChatClient(server.url, max_workers=args.clients, timeout=3600), server.pid
        return
    threads = args.threads or torch.get_num_threads()
    params = {"model.path": server.gguf, "port": free_port(), "use_jinja": True,
              "n_parallel": args.llama_slots, "n_ctx": args.llama_slots * args.llama_ctx,
              "cpuparams.n_threads": threads, "cpuparams_batch.n_threads": threads}
    shown = ", ".join(f"{key}={value}" for key, value in params.items())
    print(f"{server.name}: xllamacpp.Server(CommonParams {shown}) in a subprocess "
          f"(LLAMA_CPP_LAUNCHER); as llama-server: -m {server.gguf} --port {params['port']} "
          f"--jinja -np {args.llama_slots} -c {params['n_ctx']} -t {threads} -tb {threads}",
          flush=True)
    with llama_cpp_server(params) as (url, process):
        yield ChatClient(url, api_key="", max_workers=args.clients, timeout=3600), process.pid


# Run as `python -c LLAMA_CPP_LAUNCHER PARAMS_JSON`: llama.cpp's server in a process of its own, so
# that its CPU seconds are its own. A key "a.b" sets params.a.b. It serves until killed, or until
# its parent (the bench) is gone.
LLAMA_CPP_LAUNCHER = """
import functools, json, os, sys, time, xllamacpp
params = xllamacpp.CommonParams()
for key, value in json.loads(sys.argv[1]).items():
    *path, last = key.split(".")
    setattr(functools.reduce(getattr, path, params), last, value)
server = xllamacpp.Server(params)
parent = os.getppid()
while os.getppid() == parent:
    time.sleep(1)
"""


@contextmanager
def llama_cpp_server(params: dict, startup_timeout: float = 600.0):
    """(base URL ending in /v1, subprocess.Popen) of llama.cpp's server started with `params`
    (CommonParams keys), once /health answers 200; terminated when the block exits, also on an error
    or Ctrl-C."""
    command = [sys.executable, "-c", LLAMA_CPP_LAUNCHER, json.dumps(params)]
    base = f"http://127.0.0.1:{params['port']}"
    with tempfile.TemporaryFile("w+b") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + startup_timeout
            while not healthy(base):
                if (code := process.poll()) is not None or time.monotonic() > deadline:
                    log.seek(0)
                    problem = f"exited with code {code}" if code is not None else "was not healthy"
                    tail = log.read().decode("utf-8", "replace")[-3000:]
                    raise RuntimeError(f"llama.cpp's server ({json.dumps(params)}) {problem}; its "
                                       f"output ends:\n{tail}")
                time.sleep(0.2)
            yield base + "/v1", process
        finally:
            stop_process(process)


def healthy(base: str) -> bool:
    try:
        return requests.get(base + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def free_port() -> int:
    """A loopback port free now (llama.cpp takes a port number, not 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
