"""`python -m minskill.measure.bench server`: minskill's server under one workload, engine
configuration after engine configuration, in one run, printed as one table.

    python -m minskill.measure.bench server --workload shared-prefix   # a ~1,000-token system
    prompt all requests share
    python -m minskill.measure.bench server --workload mixed-lengths   # replies of very different
    lengths: p50 latency
    python -m minskill.measure.bench server --workload rollouts        # python -m
    minskill.rollout's requests: held-out
                                                                # qa tasks under skills none / base
                                                                  / a long library
    python -m minskill.measure.bench server --workload clients         # the former sweep: 1, 4, 16
    closed-loop clients
    python -m minskill.measure.bench server --workload stop-string     # one request, with and
    without stop
    python -m minskill.measure.bench server --workload schema          # a JSON schema's mask per
    token (bench_schema)

Each configuration is a `python -m minskill.serve` subprocess (serve.embedded.embedded_client:
--model, --quantize,
--dtype, --max-batch, --threads as given here, then the configuration's own flags), started once,
warmed up with one short request, sent the same requests as every other configuration by --clients
closed-loop clients (a client sends its next request when its reply arrives), then stopped.
CONFIGURATIONS:

    today          --prefix-cache-mb 0  --scheduler static      static batching, no prefix cache,
                   --batch-invariant off                        not batch-invariant (asked for
                                                                explicitly: the server's default is
                                                                now `new`)
    prefix-cache   --prefix-cache-mb MB --scheduler static      (ablations, with --configs; all
    continuous     --prefix-cache-mb 0  --scheduler continuous   three --batch-invariant off)
    cascade        --prefix-cache-mb MB --scheduler continuous  shared prefixes kept once in the
                   --batch-invariant off                        batch (serve.cascade): the default
                                                                before invariance
    new            --prefix-cache-mb MB --scheduler continuous  the server's default: a request's
                   --batch-invariant on                         tokens do not depend on its batch
                                                                (serve.aligned);
                                                                `--configs cascade,new` is what
                                                                invariance costs
                                                                MB = --prefix-cache-mb (default 256)

The server's flags are read from `python -m minskill.serve --help` first (`plan`). A flag the
server lacks is left out when the configuration asks for today's value of it (TODAY: a server
without the flag behaves so); a configuration that needs another value of a missing flag, or a
choice the server does not list, is skipped, and the run says which and why. So the bench measures
what the server can do now, and the new engine as soon as its flags exist.

Workloads (the requests are fixed before any server starts; greedy, seed 0):

    shared-prefix  --requests (32) held-out qa tasks, each after the same system prompt: --library
                   rendered for the task (default: every qa base skill, repeated and cut to
                   --prefix-tokens, 1,000), replies of at most --max-tokens (16)
    mixed-lengths  --requests (32) "write a long story" prompts, the reply budgets --lengths cycled
                   in request order (8,8,8,128: a quarter of the replies 16x longer than the others)
    rollouts       rollout.run_rollouts on --requests (16) held-out qa tasks, --max-tokens (64)
                   per reply, once per skill set of --skill-sets (none,base,library): skills
                   none, the suite's base skills, the long library (as shared-prefix's)
    stop-string    one "write a long story" request of --n (16) samples, --max-tokens (512) each
                   (seeded, temperature 1), sent without a stop string, then with one that never
                   matches (NEVER_STOP): checking a stop string costs the new text only, so the
                   ratio of the two walls stays near 1 however long the replies (which are equal)

Columns, per configuration and workload (rollouts: per skill set):

    requests                 chat calls made
    prompt / completion      the server's usage counts, mean per request
    wall s                   first request sent -> last reply received
    requests/s, tokens/s     requests / wall, completion tokens / wall
    p50 / p90 latency s      a request's seconds from sent to replied (nearest rank)
    replies = first          requests whose reply texts equal the first configuration's, for the
                             same request
                             (greedy float32 replies must not change with the engine)

Then, per configuration after the first, its ratios to the first: throughput (requests/s) and p50
latency, for rollouts the wall of each skill set over the wall with no skill, and for stop-string
the wall with the stop string over the wall without.

Other servers, after the configurations (rollouts only): --against, comma-separated, of
    llama-cpp       llama.cpp's server in a subprocess (python -c LLAMA_CPP_LAUNCHER; xllamacpp,
                    tests/requirements.txt) on --gguf (default: the offline default's), CommonParams
                    port (free, loopback), use_jinja True (the GGUF's chat template), n_parallel
                    --llama-slots (8), n_ctx --llama-slots x --llama-ctx (4096), cpuparams(_batch)
                    .n_threads --threads (default: torch's); printed; stopped at the end
    NAME=URL[@PID]  an OpenAI-compatible server running at URL (ending in /v1; key and model:
                    OPENAI_API_KEY, OPENAI_MODEL, else its first); PID: its process, for CPU s
Each is warmed up and sent the same rollouts; its rows join the table above ("replies = first": "–",
another engine's greedy replies differ). For rollouts, a table per server and skill set:
    tasks                rollouts run (one per task)
    wall s, tasks/s      first request sent -> last reply received; tasks / wall
    completion tok/s     completion tokens (the server's usage counts) / wall
    server CPU s         utime + stime + cutime + cstime of the server's process (/proc/PID/stat),
                         after the skill set minus before; "–" off Linux or without its PID
    success              the mean reward of the rollouts
    wall vs REF          the wall over REF's on the skill set; REF: the first --against, else config
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import requests

from minskill.measure.bench_schema import bench_schema
from minskill.measure.other_servers import (Against, against_client, llama_cpp_gguf, parse_against,
                                            process_cpu_seconds)
from minskill.nn.tokenizer import Tokenizer
from minskill.nn.weights import resolve_model
from minskill.rollout import base_skills, load_skills, run_rollouts, skill_prompts
from minskill.serve.client import chat_as_completed
from minskill.serve.embedded import embedded_client
from minskill.skillsets import SkillSet
from minskill.tasks import load_suite

WORKLOADS = ("shared-prefix", "mixed-lengths", "rollouts", "stop-string", "clients", "schema")
DEFAULT_REQUESTS = {"shared-prefix": 32, "mixed-lengths": 32, "rollouts": 16, "stop-string": 1}
DEFAULT_MAX_TOKENS = {"shared-prefix": 16, "rollouts": 64, "stop-string": 512}
NEVER_STOP = "</never-stop>"   # stop-string's: as long as a usual stop string; no reply holds it
STOP_LABELS = ("no stop", "stop never matching")
MB = "MB"   # stands for --prefix-cache-mb in CONFIGURATIONS
CONFIGURATIONS = {
    "today": {"--prefix-cache-mb": "0", "--scheduler": "static", "--batch-invariant": "off"},
    "prefix-cache": {"--prefix-cache-mb": MB, "--scheduler": "static", "--batch-invariant": "off"},
    "continuous": {"--prefix-cache-mb": "0", "--scheduler": "continuous",
                   "--batch-invariant": "off"},
    "cascade": {"--prefix-cache-mb": MB, "--scheduler": "continuous", "--batch-invariant": "off"},
    "new": {"--prefix-cache-mb": MB, "--scheduler": "continuous", "--batch-invariant": "on",
            "--c-kernels": "on"},
}
# what a server without the flag does
TODAY = {"--prefix-cache-mb": "0", "--scheduler": "static", "--batch-invariant": "off",
         "--c-kernels": "off"}
SKILL_SETS = {"none": "rollouts, skills none", "base": "rollouts, skills base",
              "library": "rollouts, long library"}   # --skill-sets: the rollouts' labels
STORY_TOPICS = ("a lighthouse keeper", "a lost dog", "a city under the sea", "a clockmaker",
                "a mountain village", "a robot gardener", "two rival chefs", "a winter storm")


def add_server_args(p) -> None:
    """The flags of `bench server` (module docstring) on bench.py's parser."""
    p.add_argument("--workload", choices=WORKLOADS, default="shared-prefix",
                   help="server: the requests sent")
    p.add_argument("--configs", default="today,new", help="server: engine configurations, "
                                                          "comma-separated, of "
                   f"{', '.join(CONFIGURATIONS)} (default today,new)")
    p.add_argument("--clients", type=int, default=16, help="server: closed-loop clients (default "
                                                           "16)")
    p.add_argument("--requests", type=int, default=None,
                   help="server: requests, or rollout tasks (default "
                   "shared-prefix 32, mixed-lengths 32, rollouts 16)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="server: reply budget (default shared-prefix 16, "
                   "rollouts 64, stop-string 512)")
    p.add_argument("--n", type=int, default=16,
                   help="server, stop-string: samples of the request (default 16)")
    p.add_argument("--lengths", default="8,8,8,128", help="server, mixed-lengths: reply budgets, "
                                                          "cycled")
    p.add_argument("--prefix-tokens", type=int, default=1000,
                   help="server: tokens of the default long library")
    p.add_argument("--library", default=None, help="server: the long library (a MASA .json, a "
                   "skill-set folder or a text file, as rollout's --skills); default: the qa base "
                   "skills repeated to --prefix-tokens")
    p.add_argument("--prefix-cache-mb", default="256", help="server: the prefix cache of "
                                                            "prefix-cache and new")
    p.add_argument("--max-batch", type=int, default=16,
                   help="server: the server's --max-batch (default 16)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="float32",
                   help="server: the server's weights (default float32)")
    p.add_argument("--skill-sets", default="none,base,library",
                   help="server, rollouts: skill sets, comma-separated (default none,base,library)")
    p.add_argument("--against", default="", help="server, rollouts: other servers, comma-separated:"
                   " llama-cpp (started here), NAME=URL[@PID] (running; URL ends in /v1)")
    p.add_argument("--llama-slots", type=int, default=8, help="server: llama.cpp's slots (8)")
    p.add_argument("--llama-ctx", type=int, default=4096, help="server: llama.cpp's context a slot")


# -------------------------------------------------------------------------------------------
# configurations


def serve_help() -> str:
    """The text of `python -m minskill.serve --help`, run as embedded_client runs the server."""
    package_root = str(Path(__file__).resolve().parent.parent)
    paths = (package_root, os.environ.get("PYTHONPATH"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    done = subprocess.run([sys.executable, "-m", "minskill.serve", "--help"], capture_output=True,
                          text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"python -m minskill.serve --help failed ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    return done.stdout


def plan(names: list[str], help_text: str,
         cache_mb: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({configuration: its server flags}, {skipped configuration: why}) for a server whose --help
    is help_text (module docstring: a missing flag is dropped at today's value, else the
    configuration is skipped)."""
    runnable, skipped = {}, {}
    for name in names:
        if name not in CONFIGURATIONS:
            raise ValueError(f"--configs: unknown configuration {name!r}; choose from "
                             f"{', '.join(CONFIGURATIONS)}")
        flags, why = [], None
        for flag, value in CONFIGURATIONS[name].items():
            value = cache_mb if value == MB else value
            found = re.search(rf"{re.escape(flag)}(?![\w-])(?:[ =]\{{([^}}]*)\}})?", help_text)
            if found is None:
                if value != TODAY.get(flag):
                    why = f"python -m minskill.serve has no {flag} (needed: {flag} {value})"
                    break
            elif found.group(1) is not None and value not in found.group(1).split(","):
                why = f"the server's {flag} takes {{{found.group(1)}}}, not {value}"
                break
            else:
                flags += [flag, value]
        if why:
            skipped[name] = why
        else:
            runnable[name] = flags
    return runnable, skipped


# ------------------------------------------------------------------------------------------------
# workloads


def long_library(tokenizer, target_tokens: int, suite: str = "qa") -> str:
    """Every base skill of `suite` rendered as one system prompt, repeated and cut to target_tokens
    tokens:
    a stand-in of the length of MASA's released libraries, shared by every task whatever its
    type."""
    base = base_skills(suite)
    task_specific = [s for group in base.task_specific.values() for s in group]
    every = SkillSet(general=base.general + task_specific, common_mistakes=base.common_mistakes)
    one = tokenizer.encode(every.render(max_tokens=10**9), special_tokens=False)
    ids = one
    while len(ids) < target_tokens:
        ids = ids + tokenizer.encode("\n\n", special_tokens=False) + one
    return tokenizer.decode(ids[:target_tokens]).strip()


def library(args, tokenizer):
    """--library as rollout's --skills reads it, else long_library."""
    return load_skills(args.library, "qa") if args.library else long_library(tokenizer,
            args.prefix_tokens)


def _qa_requests(tasks, system: list[str], max_tokens: int) -> list[dict]:
    return [dict(messages=([{"role": "system", "content": s}] if s else []) +
                 [{"role": "user", "content": t.prompt or t.question}],
                 temperature=0.0, max_tokens=max_tokens, seed=0) for t, s in zip(tasks, system)]


def workload_requests(args, tokenizer) -> dict[str, list[dict] | tuple]:
    """{label: chat requests} for shared-prefix, mixed-lengths and stop-string; {label: (tasks,
    skills)} for rollouts."""
    n = args.requests or DEFAULT_REQUESTS[args.workload]
    max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS.get(args.workload, 16)
    if args.workload == "stop-string":
        story = f"Write a long, detailed story about {STORY_TOPICS[0]}."
        request = dict(messages=[{"role": "user", "content": story}], n=args.n, temperature=1.0,
                       max_tokens=max_tokens, seed=0)
        return dict(zip(STOP_LABELS, ([request], [dict(request, stop=[NEVER_STOP])])))
    if args.workload == "mixed-lengths":
        lengths = [int(x) for x in args.lengths.split(",")]
        return {"mixed-lengths": [dict(messages=[{"role": "user",
                                                  "content": f"Write a long, detailed story about "
                                                  f"{STORY_TOPICS[i % len(STORY_TOPICS)]} (story "
                                                  f"{i})."}],
                                       temperature=0.0, max_tokens=lengths[i % len(lengths)],
                                       seed=0)
                                  for i in range(n)]}
    tasks = load_suite("qa", split="heldout", seed=0, n=n)
    wants_library = args.workload == "shared-prefix" or "library" in skill_sets(args)
    long = library(args, tokenizer) if wants_library else None
    if args.workload == "shared-prefix":
        return {"shared-prefix": _qa_requests(tasks, skill_prompts(long, tasks), max_tokens)}
    skills = {"none": None, "base": base_skills("qa"), "library": long}
    return {label: (tasks, skills[name]) for name, label in SKILL_SETS.items()
            if name in skill_sets(args)}


# ----------------------------------------------------------------------------------------------
# measuring


@dataclass
class Call:
    request: dict
    texts: list[str]
    prompt_tokens: int
    completion_tokens: int
    seconds: float


@dataclass
class WorkloadRow:
    """One workload (or rollout skill set) under one configuration."""
    config: str
    label: str
    calls: list[Call] = field(default_factory=list)
    wall: float = 0.0
    reward: float | None = None
    tasks: int = 0                     # rollouts: tasks run
    server_cpu: float | None = None    # CPU seconds of the server process (None: unknown)
    minskill: bool = True              # False: an --against server (another engine)

    def replies(self) -> dict[str, list[str]]:
        return {request_text(c.request): c.texts for c in self.calls}


def request_text(request: dict) -> str:
    return json.dumps(request, sort_keys=True)


class Recorder:
    """A ChatClient whose chat calls are recorded (request, reply texts, usage, seconds) as they
    return."""

    def __init__(self, client):
        self.client, self.max_workers, self.calls, self._lock = client, client.max_workers, [
                ], threading.Lock()

    def chat(self, **request):
        t0 = time.perf_counter()
        result = self.client.chat(**request)
        call = Call(request, list(result.texts), result.prompt_tokens, result.completion_tokens,
                    time.perf_counter() - t0)
        with self._lock:
            self.calls.append(call)
        return result


def run_workload(client, config: str, label: str, work, max_tokens: int) -> WorkloadRow:
    """Send `work` (requests, or (tasks, skills) for rollouts) through `client`; the WorkloadRow of
    what came back."""
    recorder = Recorder(client)
    row = WorkloadRow(config, label)
    t0 = time.perf_counter()
    if isinstance(work, tuple):
        tasks, skills = work
        trajs = run_rollouts(recorder, tasks, skills, max_tokens=max_tokens, seed=0)
        failed = [t.error for t in trajs if t.error]
        if failed:
            raise RuntimeError(f"{config}, {label}: {len(failed)} rollouts failed; the first: "
                               f"{failed[0]}")
        row.reward, row.tasks = sum(t.reward for t in trajs) / len(trajs), len(tasks)
    else:
        for _, answer in chat_as_completed(recorder, work):
            if isinstance(answer, BaseException):
                raise RuntimeError(f"{config}, {label}: a request failed: {answer}") from answer
    row.wall, row.calls = time.perf_counter() - t0, recorder.calls
    return row


def measure(args, runnable: dict[str, list[str]], work: dict,
            against: list[Against] = ()) -> list[WorkloadRow]:
    """Every workload of `work` under every configuration, a fresh server each, then on every
    --against server (module docstring)."""
    rows, max_tokens = [], args.max_tokens or DEFAULT_MAX_TOKENS.get(args.workload, 16)
    base_flags = ["--max-batch", str(args.max_batch), "--dtype", args.dtype,
                  *(["--threads", str(args.threads)] if args.threads else [])]
    for config, flags in runnable.items():
        print(f"{config}: python -m minskill.serve {' '.join(base_flags + flags)}", flush=True)
        engine = dict(zip(flags[::2], flags[1::2]))   # each configuration names its engine, never
                                                      # the default
        with embedded_client(model_spec=args.model, quantize=args.quantize, device=args.device,
                             prefix_cache_mb=engine.get("--prefix-cache-mb",
                                                       TODAY["--prefix-cache-mb"]),
                             scheduler=engine.get("--scheduler", TODAY["--scheduler"]),
                             server_args=base_flags + flags, max_workers=args.clients,
                             timeout=3600) as client:
            rows += measure_server(client, config, work, max_tokens, client.server_process.pid)
    for server in against:
        with against_client(args, server) as (client, pid):
            rows += measure_server(client, server.name, work, max_tokens, pid, minskill=False)
    return rows


def measure_server(client, name: str, work: dict, max_tokens: int, pid: int | None,
                   minskill: bool = True) -> list[WorkloadRow]:
    """Every workload of `work` through `client` after a warm-up, each with the CPU seconds that
    process `pid` used meanwhile."""
    # warm-up (allocation, first kernels) on a prompt no workload shares, so no prefix is cached yet
    client.chat([{"role": "system", "content": "Warm-up."}, {"role": "user", "content": "hi"}],
                max_tokens=2)
    rows = []
    for label, sent in work.items():
        before = process_cpu_seconds(pid)
        row = run_workload(client, name, label, sent, max_tokens)
        after = process_cpu_seconds(pid)
        row.server_cpu = after - before if before is not None and after is not None else None
        row.minskill = minskill
        rows.append(row)
        print(f"  {label}: {len(row.calls)} requests in {row.wall:.1f} s", flush=True)
    return rows


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q <= 1) of values."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


COLUMNS = ("configuration", "workload", "requests", "prompt tokens (mean)",
           "completion tokens (mean)", "wall s", "requests/s", "completion tokens/s",
           "p50 latency s", "p90 latency s", "replies = first")


def workload_table(rows: list[WorkloadRow]) -> str:
    """The markdown table of COLUMNS (module docstring), a row per configuration and workload."""
    first = {row.label: row.replies() for row in rows if row.config == rows[0].config}
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        n, latencies = len(row.calls), [c.seconds for c in row.calls]
        same = sum(first[row.label].get(key) == texts for key, texts in row.replies().items())
        same = f"{same}/{n}" if row.minskill else "–"   # another engine: its greedy replies differ
        lines.append(f"| {row.config} | {row.label} | {n} | "
                     f"{sum(c.prompt_tokens for c in row.calls) / n:.0f} | "
                     f"{sum(c.completion_tokens for c in row.calls) / n:.1f} | {row.wall:.1f} | "
                     f"{n / row.wall:.2f} | "
                     f"{sum(c.completion_tokens for c in row.calls) / row.wall:.1f} | "
                     f"{percentile(latencies, 0.5):.2f} | {percentile(latencies, 0.9):.2f} | "
                     f"{same} |")
    return "\n".join(lines)


SERVER_COLUMNS = ("server", "skill set", "tasks", "wall s", "tasks/s", "completion tok/s",
                  "server CPU s", "success")


def server_table(rows: list[WorkloadRow], reference: str) -> str:
    """The markdown table of SERVER_COLUMNS and the wall against `reference`'s, a row per server and
    skill set (module docstring)."""
    columns = SERVER_COLUMNS + (f"wall vs {reference}",)
    skill_set = {label: name for name, label in SKILL_SETS.items()}
    walls = {row.label: row.wall for row in rows if row.config == reference}
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        tokens = sum(c.completion_tokens for c in row.calls)
        cpu = "–" if row.server_cpu is None else f"{row.server_cpu:.1f}"
        server = f"minskill {row.config}" if row.minskill else row.config
        lines.append(f"| {server} | {skill_set[row.label]} | {row.tasks} | {row.wall:.1f} | "
                     f"{row.tasks / row.wall:.2f} | {tokens / row.wall:.1f} | {cpu} | "
                     f"{row.reward:.3f} | {row.wall / walls[row.label]:.2f}× |")
    return "\n".join(lines)


def ratios(rows: list[WorkloadRow]) -> list[str]:
    """Each later configuration against the first; for rollouts, each skill set's wall against no
    skill."""
    lines, first = [], {row.label: row for row in rows if row.config == rows[0].config}
    for row in rows:
        ref = first[row.label]
        if row.config != ref.config:
            speed = (len(row.calls) / row.wall) / (len(ref.calls) / ref.wall)
            p50 = percentile([c.seconds for c in row.calls],
                             0.5) / percentile([c.seconds for c in ref.calls], 0.5)
            lines.append(f"{row.config} / {ref.config}, {row.label}: throughput {speed:.2f}×, p50 "
                         f"latency {p50:.2f}×")
    for config in dict.fromkeys(row.config for row in rows):
        by_label = {row.label: row for row in rows if row.config == config}
        if all(label in by_label for label in STOP_LABELS):
            without, stop = (by_label[label] for label in STOP_LABELS)
            same = [c.texts for c in without.calls] == [c.texts for c in stop.calls]
            lines.append(f"{config}: decoding with a stop string that never matches / without: "
                         f"wall {stop.wall / without.wall:.2f}× "
                         f"({'the same replies' if same else 'REPLIES DIFFER'})")
        none = by_label.get("rollouts, skills none")
        if none is not None:
            lines.append(f"{config}: wall vs no skill: " + ", ".join(
                f"{label.removeprefix('rollouts, ')} {row.wall / none.wall:.2f}× (reward "
                f"{row.reward:.3f})"
                for label, row in by_label.items()))
            # a skill set also changes how long the replies are: the wall per completion token sets
            # that apart
            lines.append(f"{config}: wall per completion token vs no skill: " + ", ".join(
                f"{label.removeprefix('rollouts, ')} {_per_token(row) / _per_token(none):.2f}×"
                for label, row in by_label.items()))
    return lines


def _per_token(row) -> float:
    return row.wall / max(1, sum(c.completion_tokens for c in row.calls))


def check_args(args) -> list[Against]:
    """--against's servers; SystemExit naming the flag when a size is not a positive integer, a
    skill set or an --against entry is unknown, or llama.cpp cannot be started."""
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        raise SystemExit(f"bench server: --lengths must be comma-separated integers, got "
                         f"{args.lengths!r}")
    for flag, value in (("--clients", args.clients), ("--requests", args.requests),
                        ("--max-tokens", args.max_tokens), ("--n", args.n),
                        ("--prefix-tokens", args.prefix_tokens), ("--max-batch", args.max_batch),
                        ("--llama-slots", args.llama_slots), ("--llama-ctx", args.llama_ctx),
                        *(("--lengths", x) for x in lengths)):
        if value is not None and value < 1:
            raise SystemExit(f"bench server: {flag} must be >= 1, got {value}")
    names = skill_sets(args)
    if not names or any(name not in SKILL_SETS for name in names):
        raise SystemExit(f"bench server: --skill-sets: give some of {', '.join(SKILL_SETS)}, "
                         f"got {args.skill_sets!r}")
    against = parse_against(args.against)
    if against and args.workload != "rollouts":
        raise SystemExit("bench server: --against: for --workload rollouts only")
    if clash := [s.name for s in against if s.name in configurations(args)]:
        raise SystemExit(f"bench server: --against: {clash[0]!r} is a configuration's name")
    return [replace(s, gguf=llama_cpp_gguf(args)) if s.url is None else s for s in against]


def skill_sets(args) -> list[str]:
    return [name.strip() for name in args.skill_sets.split(",") if name.strip()]


def configurations(args) -> list[str]:
    return [c.strip() for c in args.configs.split(",") if c.strip()]


def bench_server(args) -> list[WorkloadRow]:
    """`bench server`: plan the configurations, build the workload, measure, print the tables
    (module docstring)."""
    if args.workload in ("clients", "schema"):
        (client_sweep if args.workload == "clients" else bench_schema)(args)
        return []
    against = check_args(args)
    runnable, skipped = plan(configurations(args), serve_help(), args.prefix_cache_mb)
    for name, why in skipped.items():
        print(f"skipped configuration {name}: {why}", flush=True)
    if not runnable:
        raise RuntimeError("bench server: the server accepts none of --configs " + args.configs)
    tokenizer = Tokenizer.from_pretrained(str(resolve_model(args.model)))
    rows = measure(args, runnable, workload_requests(args, tokenizer), against)
    print(f"\n{args.workload}: {args.clients} clients, model {args.model}, {args.dtype}, quantize "
          f"{args.quantize}, max batch {args.max_batch}\n{workload_table(rows)}")
    if against:
        print("(replies = first: – for " + ", ".join(s.name for s in against) +
              ", another engine, whose greedy replies differ)")
    for line in ratios(rows) + [f"(skipped {name}: {why})" for name, why in skipped.items()]:
        print(line)
    if args.workload == "rollouts":
        reference = against[0].name if against else next(iter(runnable))
        max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS["rollouts"]
        print(f"\nrollouts per server: {args.clients} clients, --max-tokens {max_tokens}\n"
              f"{server_table(rows, reference)}")
    return rows


# ------------------------------------------------------------------------------ the former sweep
# (clients)


def client_sweep(args) -> None:
    """Completions/s and tokens/s of the default server (its default engine) at 1, 4 and 16
    closed-loop clients (--decode-tokens replies)."""
    questions = [f"Write one sentence about the number {i}." for i in range(64)]
    rows = []
    with embedded_client(None, None, model_spec=args.model, max_workers=32,
                         quantize=args.quantize) as client:
        client.chat([{"role": "user", "content": "hi"}], max_tokens=4)  # warm-up
        for clients in (1, 4, 16):
            requests = [{"messages": [{"role": "user", "content": q}],
                         "max_tokens": args.decode_tokens,
                         "temperature": 0.0} for q in questions[: max(clients * 2, 8)]]
            before = client.stats["completion_tokens"]
            lock = threading.Lock()
            todo = list(requests)

            def worker():
                while True:
                    with lock:
                        if not todo:
                            return
                        req = todo.pop()
                    client.chat(**req)
            t0 = time.perf_counter()
            threads = [threading.Thread(target=worker) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            sec = time.perf_counter() - t0
            tokens = client.stats["completion_tokens"] - before
            rows.append((clients, len(requests) / sec, tokens / sec))
            print(f"{clients:>2} clients: {len(requests)} completions in {sec:.1f}s", flush=True)
    base = rows[0][2]
    print("\n| concurrent clients | completions/s | tokens/s | tokens/s vs 1 client (sequential "
          "serving) |")
    print("|---|---|---|---|")
    for clients, cps, tps in rows:
        print(f"| {clients} | {cps:.2f} | {tps:.1f} | {tps / base:.2f}× |")
