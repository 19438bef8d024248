"""A client of a fresh local `python -m minskill.serve` (or of a given URL): what the scripts use
when no --task-url is given. The server is a subprocess on a free loopback port; it is stopped when
the block exits and stops itself if the process that started it is gone (PARENT_PID_ENV)."""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import requests

from minskill.serve.client import ChatClient

# the server's --prefix-cache-mb: a 1,000-token prefix of the default model is ~46 MB in float32
DEFAULT_PREFIX_CACHE_MB = 256
DEFAULT_SCHEDULER = "continuous"  # its --scheduler; "static" with --prefix-cache-mb 0: no prefix
                                  # cache, static batches
API_KEY_ENV = "MINSKILL_API_KEY"  # a parent passes the key here, not on the command line
PARENT_PID_ENV = "MINSKILL_PARENT_PID"  # the server exits when the process it names is gone
URL_LINE = re.compile(r"(https?://\S+/v1)\s*$")
# a call's time limit on the local server, unless the caller sets one: it answers every request it
# accepts, and how long that takes is the machine's load; a short limit would turn load into errors,
# and a run's figures with them (a server that dies fails its connections at once)
LOCAL_TIMEOUT = 3600.0


@contextmanager
def embedded_client(url=None, model=None, api_key=None, model_spec="smollm2-135m",
                    startup_timeout=600.0, server_args=(), quantize: str = "none",
                    device: str | None = None, prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
                    scheduler=DEFAULT_SCHEDULER, **client_kwargs):
    """Yield a ChatClient: for `url` if given, else for a fresh local server on `model_spec`.

    `model` is the name to ask `url` for; a local server is asked for the one model it serves (its
    name from /v1/models), whatever `model` says, since it answers any other name with 404
    model_not_found.

    The local server is `python -m minskill.serve --model model_spec --port 0 --quantize quantize`
    on 127.0.0.1 (quantize="int8" or "auto": int8 weights, minskill.nn.quantize) with a random API
    key (passed through the environment); it is terminated when the block exits, also on an
    exception. If it dies or is not healthy within startup_timeout seconds, RuntimeError shows the
    tail of its stderr. The yielded client's `server_process` is the subprocess.Popen. `device`:
    the server's --device (the script's own, resolved; None: the server's default, auto).
    prefix_cache_mb, scheduler: the server's --prefix-cache-mb and --scheduler (the server's
    defaults; later server_args override them). Its decoding step is torch's (--c-kernels off):
    the scripts' recorded runs are those of their commands, whatever C compiler a machine has."""
    if url is not None:
        yield ChatClient(url, model=model, api_key=api_key, **client_kwargs)
        return
    api_key = api_key or secrets.token_hex(16)
    # the folder holding minskill/, for `-m minskill.serve`
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, **{API_KEY_ENV: api_key, PARENT_PID_ENV: str(os.getpid())})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "minskill.serve", "--model", str(model_spec), "--port", "0",
               "--quantize", quantize, *(("--device", str(device)) if device else ()),
               "--prefix-cache-mb", str(prefix_cache_mb), "--scheduler", scheduler,
               "--c-kernels", "off", *server_args]
    with tempfile.TemporaryFile("w+b") as stderr_file:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr_file, env=env,
                                   text=True, stdin=subprocess.DEVNULL)
        lines: list[str] = []

        def drain_stdout():  # keeps reading so that the server never blocks on a full pipe
            for line in process.stdout:
                lines.append(line)

        threading.Thread(target=drain_stdout, daemon=True).start()

        def failure(problem: str) -> RuntimeError:
            stderr_file.seek(0)
            tail = stderr_file.read().decode("utf-8", "replace")[-3000:].strip()
            return RuntimeError(f"embedded server ({' '.join(command)}) {problem}; "
                                f"its stderr ends:\n{tail or '(empty)'}")

        try:
            deadline, server_url = time.monotonic() + startup_timeout, None
            while True:
                if server_url is None:
                    server_url = next((m.group(1) for line in list(lines)
                                       if (m := URL_LINE.search(line))), None)
                if process.poll() is not None:
                    raise failure(f"exited with code {process.returncode} before it was ready")
                if time.monotonic() > deadline:
                    raise failure(f"was not ready within {startup_timeout:.0f} s")
                if server_url is not None:
                    try:
                        if requests.get(server_url[:-len("/v1")] + "/health",
                                        timeout=5).status_code == 200:
                            break
                    except requests.RequestException:
                        pass
                time.sleep(0.1)
            client = ChatClient(server_url, api_key=api_key,
                                **{"timeout": LOCAL_TIMEOUT, **client_kwargs})
            client.resolve_model()           # client.model names the served model from the start
            client.server_process = process  # for callers that want its pid or exit code
            yield client
        finally:
            stop_process(process)
            process.stdout.close()


def stop_process(process: subprocess.Popen, grace: float = 30.0) -> None:
    """Terminate `process` if it still runs; kill it if it has not exited `grace` seconds later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
