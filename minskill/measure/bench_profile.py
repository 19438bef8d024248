"""`python -m minskill.measure.bench profile`: where a rollout's time goes inside the server's
engine.

    python -m minskill.measure.bench profile --clients 1 --requests 4 --quantize int8 --threads 2
    python -m minskill.measure.bench profile --clients 8 --requests 16 --quantize int8 --threads 2

The engine the server runs (serve.backends.ModelBackend with the server's defaults: prefix cache,
continuous batching, batch-invariant), driven in this process without HTTP: --requests held-out
qa prompts under the suite's base skills (what `python -m minskill.rollout --skills base` sends;
greedy, replies up to --max-tokens), at most --clients in flight, a new one joining as soon as one
ends. ProfiledRun three times on the same prompts (the prefix cache emptied before each):

  1. timed phases, on the main thread: prefill + join (Engine.add: each newcomer's prompt prefilled
     alone, its row merged into the batch), decoding (the forward of each step), sampling
     (Engine._choose), leaving (Engine._leave: the ended rows' keys dropped), the rest of the loop;
  2. the same on a second thread: torch's OpenMP parallel regions started from a thread other than
     the one that started them first were measured slower here (why the server runs its model on
     the main thread: serve/server.py);
  3. under torch.profiler, PROFILED_STEPS decoding steps after the first (and their prefills):
     each op's own CPU seconds, summed by op, the ten largest, and the time no op took.

Tokenising the prompts (the chat template and the tokenizer) is timed apart. HTTP is not in these
figures: `bench server` measures the same rollouts through the server (docs/benchmarks.md).
"""
from __future__ import annotations

import collections
import threading
import time

import torch

from minskill.rollout import base_skills, skill_prompts
from minskill.serve.backends import ModelBackend
from minskill.serve.request_parsing import parse_chat_request
from minskill.serve.embedded import DEFAULT_PREFIX_CACHE_MB
from minskill.serve.errors import BackendError
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine, sequences_for
from minskill.tasks import load_suite

PROFILED_STEPS = 128
OUTSIDE_OPS = "outside any op (Python, dispatch)"
PHASES = {"add": "prefill + join", "_decode": "decoding forward", "_choose": "sampling",
          "_leave": "leave (rows dropped)"}


def bench_profile(args) -> None:
    """The three runs of the module docstring, printed as tables."""
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        backend = ModelBackend.from_spec(args.model, dtype=getattr(torch, args.dtype.replace(
            "auto", "float32")), quantize=args.quantize, prefix_cache_mb=DEFAULT_PREFIX_CACHE_MB,
            scheduler="continuous", batch_invariant=True)
    except (ValueError, OSError) as error:
        raise SystemExit(f"bench profile: cannot load --model {args.model!r}: {error}")
    n, in_flight = args.requests or 4, args.clients
    t0 = time.perf_counter()
    try:
        prompts = rollout_prompts(backend, n, args.max_tokens or 256)
    except BackendError as error:   # a prompt longer than the model's context, say
        raise SystemExit(f"bench profile: {backend.name}: {error}")
    tokenising = time.perf_counter() - t0
    print(f"profile: {n} held-out qa prompts (base skills), {in_flight} in flight, replies up to "
          f"{args.max_tokens or 256} tokens, {backend.name}, {torch.get_num_threads()} threads; "
          f"tokenising them: {tokenising * 1e3:.0f} ms", flush=True)
    run = ProfiledRun(backend.engine, prompts, in_flight, args.max_tokens or 256)
    main = run.timed()
    print(phase_table("main thread", main))
    box = []
    worker = threading.Thread(target=lambda: box.append(run.timed()))
    worker.start()
    worker.join()
    print(phase_table("a second thread", box[0]))
    print(f"a second thread / the main thread: wall {box[0]['wall'] / main['wall']:.2f}×")
    # the profiler keeps every event in memory (a whole run of 16 rollouts took 24 GB): the ops of
    # PROFILED_STEPS decoding steps only (after one of warm-up), and the prefills among them
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=PROFILED_STEPS, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=schedule) as profiler:
        run.timed(after_step=profiler.step)
    ops = collections.Counter()
    for event in profiler.key_averages():   # a step's own time is what no op took: Python, dispatch
        name = OUTSIDE_OPS if event.key.startswith("ProfilerStep") else event.key
        ops[name] += event.self_cpu_time_total / 1e6
    total = sum(ops.values())
    print(f"\nops' own CPU seconds in decoding steps 2 to {PROFILED_STEPS + 1} (ops {total:.1f} s)"
          "\n| op | s | share of ops |\n|---|---|---|")
    for name, seconds in ops.most_common(10):
        print(f"| {name} | {seconds:.2f} | {seconds / total:.0%} |")
    print(f"| every other op | {total - sum(s for _, s in ops.most_common(10)):.2f} | |")


def rollout_prompts(backend, n: int, max_tokens: int) -> list[list[int]]:
    """The token ids the server would prefill for `n` held-out qa rollouts under the base skills."""
    tasks = load_suite("qa", split="heldout", seed=0, n=n)
    prompts = []
    for system, task in zip(skill_prompts(base_skills("qa"), tasks), tasks):
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": task.prompt or task.question}]
        request = parse_chat_request(dict(messages=messages, max_tokens=max_tokens, temperature=0),
                                     backend)
        prompts.append(backend._prompt(request))
    return prompts


class ProfiledRun:
    """The engine serving `prompts`, at most `in_flight` at once, its phases timed."""

    def __init__(self, engine: Engine, prompts, in_flight: int, max_tokens: int):
        self.engine, self.prompts, self.in_flight, self.max_tokens = engine, prompts, in_flight, \
            max_tokens

    def timed(self, after_step=None) -> dict:
        """{phase: seconds, "wall": s, "tokens": generated tokens}; the engine's methods are timed
        for the run only; after_step() is called after each decoding step."""
        engine, seconds = self.engine, collections.Counter()
        engine.prefix_cache = PrefixCache(DEFAULT_PREFIX_CACHE_MB)    # every run starts cold
        timed = {name: _timer(getattr(engine, name), seconds, PHASES[name]) for name in PHASES}
        for name, fn in timed.items():
            setattr(engine, name, fn)
        sequences = [sequences_for(p, 1, 0, max_new_tokens=self.max_tokens)[0]
                     for p in self.prompts]
        waiting = list(sequences)
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                while waiting or engine.rows:
                    room = self.in_flight - len(engine.rows)
                    if room > 0 and waiting:
                        engine.add(waiting[:room])
                        waiting = waiting[room:]
                    engine.step()
                    if after_step is not None:
                        after_step()
                wall = time.perf_counter() - t0
        finally:
            for name in timed:
                delattr(engine, name)
        return dict(seconds, wall=wall, tokens=sum(len(s.tokens) for s in sequences))


def _timer(fn, seconds: collections.Counter, label: str):
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - t0
    return timed


def phase_table(where: str, result: dict) -> str:
    wall = result["wall"]
    lines = [f"\n{where}: wall {wall:.1f} s, {result['tokens']} tokens, "
             f"{result['tokens'] / wall:.1f} tok/s\n| phase | s | share of wall |\n|---|---|---|"]
    rest = wall - sum(result.get(label, 0.0) for label in PHASES.values())
    for label in list(PHASES.values()) + ["the rest of the loop"]:
        s = rest if label == "the rest of the loop" else result.get(label, 0.0)
        lines.append(f"| {label} | {s:.2f} | {s / wall:.1%} |")
    return "\n".join(lines)
