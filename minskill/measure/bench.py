"""Side-by-side benchmarks: minskill against its reference, in one run, printed as ratios.

    python -m minskill.measure.bench model     # speed and memory vs HF transformers and llama.cpp
    python -m minskill.measure.bench server --workload shared-prefix|mixed-lengths|rollouts|...
                                               # the server, engine configurations side by side
    python -m minskill.measure.bench profile   # where a rollout's time goes in the server's engine
    python -m minskill.measure.bench grpo      # seconds per Skill-R1 training step, by phase
    python -m minskill.measure.bench sft       # SFT tokens/s vs HF transformers on the same batch
    python -m minskill.measure.bench gpu --config qwen3-4b   # one CUDA GPU, no weights needed
    python -m minskill.measure.bench memory --config qwen3-1.7b   # an update's peak memory

Decisions (each figure's definition: docs/measure.md; the numbers: docs/benchmarks.md):
1. Both sides run on the same weights, the same inputs and the same thread count.
2. The references are Hugging Face `transformers` (same HF weights) and llama.cpp (the `xllamacpp`
   wheel, on the GGUF the offline default is converted from), imported only here and only when a
   bench runs: not runtime dependencies of minskill (tests/requirements.txt).
3. Decode is B · N / seconds for B rows of N greedy tokens, shown beside the bandwidth bound and
   the matrix-vector ceiling, so a ratio says how far from the hardware it is.
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from minskill.measure.bench_profile import bench_profile
from minskill.measure.bench_server import add_server_args, bench_server
from minskill.device import resolve_device, set_up_device
from minskill.nn.lora import AdaptersOff, apply_lora, trainable_parameters
from minskill.nn.memory import QWEN3_COMMON, QWEN3_CONFIGS, UpdateShape, memory_report
from minskill.nn.model import Transformer
from minskill.nn.quantize import QUANTIZE_CHOICES, quantize_int8
from minskill.nn.sampling import completion_logprobs, generate
from minskill.nn.shared_prefix import grouped_logprobs
from minskill.nn.tokenizer import Tokenizer
from minskill.nn.weights import (DEFAULT_MODEL, config_from_hf, default_gguf_path, load_model,
                                 load_pretrained, resolve_model)
from minskill.rollout import run_rollouts
from minskill.serve.embedded import embedded_client
from minskill.sft import sft_throughput
from minskill.skill_r1.grpo import bilevel_advantages, policy_loss
from minskill.skill_r1.loop import HistoryEntry, Instance, Outcome, editor_messages
from minskill.tasks import load_suite


def _rss_kb(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    try:  # Linux: writing 5 resets VmHWM to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _release_freed_memory() -> None:
    """Hand memory that earlier workloads freed back to the OS (glibc keeps it otherwise), so that
    the workload measured second does not start with a warm heap and look smaller than the first."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak RSS above the level at entry, in MiB (Linux /proc; 0 elsewhere)."""

    def __enter__(self):
        gc.collect()
        _release_freed_memory()
        self.base = _rss_kb()
        _reset_peak_rss()
        return self

    def __exit__(self, *exc):
        self.peak_mib = max(0, _rss_kb("VmHWM") - self.base) / 1024


def _timed(fn, repeats: int = 3) -> float:
    fn()  # warm-up: first calls pay for allocation and kernel selection
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth_gbs(mbytes: int = 256) -> float:
    """Memory bandwidth of a large tensor copy (bytes read + bytes written per second), GB/s."""
    src = torch.empty(mbytes * 2**20 // 4, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    sec = _timed(lambda: dst.copy_(src), repeats=5)
    return 2 * src.numel() * 4 / sec / 1e9


def weight_bytes_per_token(model) -> int:
    cfg = model.config
    per_param = torch.finfo(model.dtype).bits // 8
    total = sum(p.numel() for p in model.parameters())
    embed = cfg.vocab_size * cfg.hidden_size
    # untied embeddings are only gathered (a row a token); tied ones are read in full as lm_head
    return (total - (0 if cfg.tie_word_embeddings else embed - cfg.hidden_size)) * per_param


def matmul_only_tokens_per_s(model, repeats: int) -> float:
    """Batch-1 decode speed if a token cost nothing but its matrix-vector products: one input row
    through every weight matrix a decode step reads (q, k, v, o, gate, up, down of each layer,
    lm_head), by the same F.linear the model calls. It is the ceiling the BLAS kernel sets on this
    machine, whatever the model code."""
    mats = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    rows = {n: torch.randn(1, n, dtype=model.dtype, device=model.device)
            for n in {w.shape[1] for w in mats}}

    @torch.no_grad()
    def run():
        for w in mats:
            torch.nn.functional.linear(rows[w.shape[1]], w)
    return 1 / _timed(run, repeats)


class BenchUnavailable(RuntimeError):
    """What a benchmark needs is missing here (a reference package, a CUDA GPU): exit status 2."""


def _hf_model(folder: str, dtype):
    try:  # imported here: transformers is the benchmarks' reference, not a dependency of minskill
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise BenchUnavailable("the benchmark reference needs transformers: pip install -r "
                               "tests/requirements.txt")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.eval()
    return model


def _prompts(tokenizer, batch: int, length: int = 16) -> list[list[int]]:
    text = "Once upon a time in a small village by the sea there lived an old fisherman who " * 8
    ids = tokenizer.encode(text)
    return [ids[i:i + length] for i in range(batch)]


# ---------------------------------------------------------------------------------------------
# model


def llama_cpp_decode(gguf_path, batch: int, tokens: int, threads: int, repeats: int) -> float:
    """llama.cpp's decode tok/s: `batch` concurrent completions of `tokens` tokens each (module
    docstring)."""
    try:  # imported here: llama.cpp is the benchmarks' reference, not a dependency of minskill
        import xllamacpp
    except ImportError:
        raise BenchUnavailable("the llama.cpp reference needs xllamacpp: pip install -r "
                               "tests/requirements.txt")
    params = xllamacpp.CommonParams()
    params.model.path = str(gguf_path)
    params.n_ctx, params.n_parallel, params.warmup = 256 * batch, batch, False
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)
    prompt = "Once upon a time in a small village by the sea there lived an old fisherman who"

    def run():
        with ThreadPoolExecutor(max_workers=batch) as pool:
            list(pool.map(lambda i: server.handle_completions(
                {"prompt": f"{prompt} {i}", "n_predict": tokens, "temperature": 0.0,
                 "ignore_eos": True}),
                range(batch)))
    return batch * tokens / _timed(run, repeats)


def bench_decode_vs_llama_cpp(args, folder: str, tokenizer, decode: dict, hf_decode: dict) -> None:
    """Decode of minskill in float32 and bfloat16 (`decode`, measured by bench_model) and int8
    (minskill.nn.quantize, measured here) against llama.cpp and HF."""
    N, rows = args.decode_tokens, dict(decode)
    model = quantize_int8(load_pretrained(folder, dtype=torch.float32).eval())
    for batch in (1, 8):
        prompts = _prompts(tokenizer, batch)
        rows[("int8", batch)] = batch * N / _timed(
            lambda: generate(model, prompts, n=1, max_new_tokens=N, temperature=0.0), args.repeats)
    del model
    gguf_path = default_gguf_path() if args.model == DEFAULT_MODEL else args.gguf
    if gguf_path is None:
        print("(no GGUF for this model: pass --gguf FILE to compare with llama.cpp)")
        return
    llama = {b: llama_cpp_decode(gguf_path, b, N, torch.get_num_threads(), args.repeats)
             for b in (1, 8)}
    print(f"\nDecode tok/s, {N} greedy tokens; llama.cpp on {Path(gguf_path).name}\n"
          "| minskill | batch | tok/s | vs llama.cpp | vs HF (same dtype) | batch 8 / batch 1 "
          "|\n|---|---|---|---|---|---|")
    for (name, batch), tps in rows.items():
        hf = hf_decode.get((name, batch))
        print(f"| {name} | {batch} | {tps:.1f} | {tps / llama[batch]:.2f}× | "
              f"{f'{tps / hf:.2f}×' if hf else '–'} | {rows[(name, 8)] / rows[(name, 1)]:.2f}× |")
    print(f"| llama.cpp | 1 | {llama[1]:.1f} | 1.00× | – | {llama[8] / llama[1]:.2f}× |")
    print(f"| llama.cpp | 8 | {llama[8]:.1f} | 1.00× | – | |")



def bench_model(args) -> None:
    folder = str(resolve_model(args.model))
    tokenizer = Tokenizer.from_pretrained(folder)
    N = args.decode_tokens
    results = []  # (figure, minskill value, hf value, unit, higher_is_better)
    ours_by_dtype: dict[str, dict] = {}
    theirs_by_dtype: dict[str, dict] = {}
    bw = copy_bandwidth_gbs()
    print(f"model {args.model} ({folder}); threads {torch.get_num_threads()}; copy bandwidth "
          f"{bw:.1f} GB/s",
          flush=True)
    for dtype in (torch.float32, torch.bfloat16):
        dname = str(dtype).replace("torch.", "")
        for impl in ("minskill", "hf"):
            gc.collect()
            with PeakMemory() as mem:
                model = load_pretrained(folder, dtype=dtype) if impl == "minskill" else \
                    _hf_model(folder, dtype)
                model.eval()
                figures = {}
                for batch in (1, 8):
                    prompts = _prompts(tokenizer, batch)
                    if impl == "minskill":
                        def run():
                            generate(model, prompts, n=1, max_new_tokens=N, temperature=0.0)
                    else:
                        ids = torch.tensor(prompts)

                        def run():
                            with torch.no_grad():
                                model.generate(ids, attention_mask=torch.ones_like(ids),
                                               max_new_tokens=N, min_new_tokens=N, do_sample=False,
                                               pad_token_id=0)
                    figures[f"decode b{batch}"] = batch * N / _timed(run, args.repeats)
                long_ids = torch.tensor([(tokenizer.encode("word " * 600))[:512]])
                with torch.no_grad():
                    figures["prefill 512"] = 512 / _timed(lambda: model(long_ids), args.repeats)
                train_ids = torch.tensor([(tokenizer.encode("the quick brown fox " * 200))[i:i
                        + 256]
                                          for i in range(4)])
                model.train()

                def step():
                    logits = model(train_ids)
                    logits = getattr(logits, "logits", logits)
                    loss = torch.nn.functional.cross_entropy(
                        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                        train_ids[:, 1:].reshape(-1))
                    loss.backward()
                    model.zero_grad(set_to_none=True)
                figures["fwd+bwd 4x256 (s)"] = _timed(step, max(1, args.repeats - 1))
                if impl == "minskill":
                    figures["bound"] = bw * 1e9 / weight_bytes_per_token(model)
                    figures["matmuls only"] = matmul_only_tokens_per_s(model, args.repeats)
            figures["peak MiB"] = mem.peak_mib
            if impl == "minskill":
                ours = ours_by_dtype[dname] = figures
            else:
                theirs = theirs_by_dtype[dname] = figures
            del model
        for key in ("decode b1", "decode b8", "prefill 512"):
            results.append((f"{key} tok/s {dname}", ours[key], theirs[key], True))
        results.append((f"fwd+bwd 4x256 s {dname}", ours["fwd+bwd 4x256 (s)"],
                        theirs["fwd+bwd 4x256 (s)"], False))
        results.append((f"peak memory MiB {dname}", ours["peak MiB"], theirs["peak MiB"], False))
        if "bound" in ours:
            print(f"{dname}: batch-1 decode {ours['decode b1']:.1f} tok/s = "
                  f"{ours['decode b1'] / ours['bound']:.0%} of the bandwidth bound "
                  f"{ours['bound']:.1f} tok/s; its matrix-vector products alone (F.linear, batch "
                  f"1) run at {ours['matmuls only']:.1f} tok/s = "
                  f"{ours['matmuls only'] / ours['bound']:.0%} of the bound", flush=True)
    _print_table(results, "minskill", "HF transformers")
    decode = {
        (d, b): figures[f"decode b{b}"] for d, figures in ours_by_dtype.items() for b in (1, 8)
    }
    hf_decode = {(d, b): figures[f"decode b{b}"] for d, figures in theirs_by_dtype.items()
                 for b in (1, 8)}
    bench_decode_vs_llama_cpp(args, folder, tokenizer, decode, hf_decode)


def _print_table(results, a: str, b: str) -> None:
    print(f"\n| figure | {a} | {b} | ratio {a}/{b} |\n|---|---|---|---|")
    for name, x, y, higher in results:
        ratio = x / y if y else float("nan")
        print(f"| {name} | {x:.2f} | {y:.2f} | {ratio:.2f}{'' if higher else ' (lower is better)'} "
              f"|")


# ----------------------------------------------------------------------------------------------
# grpo


def _editor_prompt(tok, tasks, candidates: int, context_tokens: int) -> list[int]:
    """An editor prompt as the second generation of the default run sees it: the instance's tasks,
    the seed skill and K earlier candidates with their outcomes, trimmed to context_tokens."""
    instance = Instance("bench", tasks[0].type, tasks)
    outcomes = [Outcome(t.question, 0.0, "I think the answer is 7.") for t in tasks]
    history = [HistoryEntry(0, "", 0.25, outcomes)]
    history += [HistoryEntry(1, f"Read the question twice. Write the final answer as a number. "
                                f"Check step {i}.",
                             0.25 * (i % 2), outcomes) for i in range(candidates)]
    messages = editor_messages(instance, "", 0.25, history,
                               lambda m: len(tok.apply_chat_template(m,
                                                                     add_generation_prompt=True)),
                                                                     context_tokens)
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def _update_seconds(editor, optimizer, logprobs, prompt, samples, advantages) -> float:
    """Seconds of one policy update (forward, loss, backward, AdamW step) over the K candidates."""
    t0 = time.perf_counter()
    logp, mask = logprobs(editor, [prompt] * len(samples), [s.token_ids for s in samples])
    loss, _ = policy_loss(logp, logp.detach(), advantages, mask)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def bench_grpo(args) -> None:
    """One Skill-R1 step on one instance, split into its phases; the update both ways, back to
    back."""
    editor, tok = load_model(args.model)
    tasks = [t for t in load_suite("qa", split="train", seed=0) if t.type == "arithmetic"][:4]
    prompt = _editor_prompt(tok, tasks, args.candidates, args.context_tokens)
    K = args.candidates
    phases = {"editor sampling": [], "task rollouts": [], "update, prompt per candidate": [],
              "update, shared prefix": []}
    optimizer = torch.optim.AdamW(editor.parameters(), lr=0.0)   # lr 0: every repeat sees the same
                                                                 # weights
    with embedded_client(None, None, model_spec=args.model, quantize=args.quantize) as client:
        for step in range(args.repeats):
            t0 = time.perf_counter()
            editor.eval()
            samples = generate(editor, [prompt], n=K, max_new_tokens=args.skill_tokens,
                               temperature=1.0, stop_token_ids=tok.stop_token_ids, seed=step,
                               tokenizer=tok)
            t1 = time.perf_counter()
            # the K candidates are scored concurrently, as train_grpo does, so the server batches
            # them
            with ThreadPoolExecutor(max_workers=K) as pool:
                runs = list(pool.map(lambda s: run_rollouts(client, tasks, s.text,
                                                            max_tokens=args.decode_tokens),
                                     samples))
            rewards = [sum(t.reward for t in trs) / len(trs) for trs in runs]
            t2 = time.perf_counter()
            editor.train()
            # never all zero
            adv = bilevel_advantages(rewards, 0.0, 0.5) + torch.linspace(-0.1, 0.1, K)
            for name, fn in (("update, prompt per candidate", completion_logprobs),
                             ("update, shared prefix", grouped_logprobs)):
                phases[name].append(_update_seconds(editor, optimizer, fn, prompt, samples, adv))
            for k, v in zip(phases, (t1 - t0, t2 - t1)):
                phases[k].append(v)
            print(f"step {step + 1}: {time.perf_counter() - t0:.1f}s", flush=True)
    median = {k: statistics.median(v) for k, v in phases.items()}
    total = median["editor sampling"] + median["task rollouts"] + median["update, shared prefix"]
    print(f"\nOne Skill-R1 step on the default model: a {len(prompt)}-token editor prompt, K={K} "
          f"candidates of ≤{args.skill_tokens} tokens, {len(tasks)} qa tasks each, median of "
          f"{args.repeats}")
    print("| phase | seconds | share of a step (shared prefix) |\n|---|---|---|")
    for k, v in median.items():
        print(f"| {k} | {v:.2f} | "
              f"{'' if k == 'update, prompt per candidate' else f'{v / total:.0%}'} |")
    print(f"| total (shared prefix) | {total:.2f} | 100% |")
    print(f"update: shared prefix "
          f"{median['update, prompt per candidate'] / median['update, shared prefix']:.2f}× faster "
          f"than a prompt per candidate")


# -----------------------------------------------------------------------------------------------
# sft


def bench_sft(args) -> None:
    """Tokens/s of a full SFT step (forward, masked CE, backward, clip, AdamW) on one batch,
    minskill vs HF."""
    folder = str(resolve_model(args.model))
    g = torch.Generator().manual_seed(0)
    B, T = args.sft_batch or 4, args.sft_length or 256
    ids = torch.randint(10, 40000, (B, T), generator=g)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, T // 2:] = True  # targets: the second half, as the answer part of an SFT record
    results = {}
    for impl in ("minskill", "hf"):
        gc.collect()
        with PeakMemory() as mem:
            if impl == "minskill":
                model = load_pretrained(folder)
                tps = sft_throughput(model, ids, loss_mask, steps=args.repeats)["tokens_per_s"]
            else:
                model = _hf_model(folder, torch.float32)
                model.train()
                opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
                labels = ids.masked_fill(~loss_mask, -100)

                def step():
                    opt.zero_grad(set_to_none=True)
                    model(input_ids=ids, labels=labels).loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                tps = B * T / _timed(step, args.repeats)
        results[impl] = (tps, mem.peak_mib)
        del model
    _print_table([(f"SFT tokens/s float32 ({B}×{T})", results["minskill"][0], results["hf"][0],
                   True),
                  ("peak memory MiB", results["minskill"][1], results["hf"][1], False)],
                  "minskill", "HF transformers")


# -----------------------------------------------------------------------------------------------
# gpu

GPU_CONFIGS = QWEN3_CONFIGS   # the published Qwen3 architectures (minskill.nn.memory), and "tiny"
GPU_LORA_RANK = 16
GPU_BETA = 0.04       # the KL weight of the micro-batched update's row (a reference model's
                      # forward per micro-batch)


def random_model(name: str, device, dtype=torch.float32) -> Transformer:
    """A Transformer of a GPU_CONFIGS architecture with random weights (N(0, 0.02), norms 1), built
    on `device` directly in `dtype` (no float32 copy first: an 8B bf16 base must fit where its
    float32 would not)."""
    with torch.device("meta"):
        model = Transformer(config_from_hf({**QWEN3_COMMON, **GPU_CONFIGS[name]}))
    model.to(dtype)                      # still on meta: free
    if torch.device(device).type == "meta":
        return model
    model.to_empty(device=device)
    if model.config.tie_word_embeddings:  # to_empty gave lm_head a tensor of its own
        model.lm_head.weight = model.model.embed_tokens.weight
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if param_name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model


class DeviceMemory:
    """Peak memory of a workload in MiB: CUDA's allocator peak on a GPU, the RSS peak (PeakMemory)
    on a CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.rss = PeakMemory().__enter__()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak_mib = torch.cuda.max_memory_allocated() / 2**20
        else:
            self.rss.__exit__(*exc)
            self.peak_mib = self.rss.peak_mib


def _free(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def gpu_decode(args, device) -> dict:
    """Decode tok/s (rows · N / seconds, median of --repeats) of the bf16 model at batch 1 and 8
    (greedy; on CUDA also compiled, nn/compiled_decode.py) and of n = K samples of one prompt (as
    the editor samples), the last also as the editor runs: bf16 autocast over float32 weights."""
    V, N, K = random_model(args.config,
                           "meta").config.vocab_size, args.decode_tokens, args.candidates
    g = torch.Generator().manual_seed(0)
    rows, cuda = {}, torch.device(device).type == "cuda"   # a CPU compile would take minutes
    for dtype, label, batch, n, compiled in (
        (torch.bfloat16, "batch 1", 1, 1, False),
        (torch.bfloat16, "batch 8", 8, 1, False),
        *[(torch.bfloat16, f"batch {b}, compiled", b, 1, True) for b in (1, 8) if cuda],
        (torch.bfloat16, f"n = K = {K} from one prompt", 1, K, False),
        (torch.float32, f"n = K = {K}, bf16 autocast, float32 weights", 1, K, False),
    ):
        model = random_model(args.config, device, dtype).eval()
        prompts = torch.randint(10, V, (batch, 16), generator=g).tolist()

        def run():
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16,
                                enabled=dtype != torch.bfloat16):
                generate(model, prompts, n=n, max_new_tokens=N, temperature=1.0 if n > 1 else 0.0,
                         seed=0, compiled=compiled)
            _sync(device)
        rows[f"decode tok/s, {label}" + (" (bf16 weights)" if dtype == torch.bfloat16 else "")] = \
            batch * n * N / _timed(run, args.repeats)
        del model
        _free(device)
    return rows


def gpu_update(args, device, lora: bool, beta: float = 0.0, micro_batch: int | None = None,
               masked: bool = False) -> tuple[float, float]:
    """(seconds, peak MiB) of one Skill-R1 policy update (module docstring: full vs LoRA) over K
    candidates in micro-batches of `micro_batch` (None: all K at once); β > 0 adds the KL to a
    frozen reference (LoRA: the adapters off; full: a copy); masked: each candidate has its own
    prompt, all of other lengths, so the update runs the padded, masked forward of
    --no-shared-prefix (sampling.completion_logprobs) instead of the shared one."""
    model = random_model(args.config, device, torch.bfloat16 if lora else torch.float32)
    if lora:
        apply_lora(model, GPU_LORA_RANK)
    ref = ((AdaptersOff(model) if lora else copy.deepcopy(model).requires_grad_(False))
           if beta > 0 else None)
    model.gradient_checkpointing = args.grad_checkpointing
    model.train()
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-6, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(0)
    V, K = model.config.vocab_size, args.candidates
    prompt = torch.randint(10, V, (args.context_tokens,), generator=g).tolist()
    prompts = [prompt[:max(1, len(prompt) - 13 * i)] if masked else prompt for i in range(K)]
    completions = torch.randint(10, V, (K, args.skill_tokens), generator=g).tolist()
    advantages, M = torch.linspace(-1.0, 1.0, K), micro_batch or K
    logprobs = completion_logprobs if masked else grouped_logprobs

    def step():
        for i in range(0, K, M):
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                logp, mask = logprobs(model, prompts[i:i + M], completions[i:i + M])
                with torch.no_grad():
                    ref_logp = logprobs(ref, prompts[i:i + M],
                                        completions[i:i + M])[0] if ref is not None else None
                loss, _ = policy_loss(logp, logp.detach(), advantages[i:i + M], mask,
                                      ref_logp=ref_logp, beta=beta)
            (loss * len(logp) / K).backward()
        torch.nn.utils.clip_grad_norm_(trainable_parameters(model), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
    with DeviceMemory(device) as mem:   # the first step allocates AdamW's moments: inside the peak
        seconds = _timed(step, args.repeats)
    del model, optimizer, ref
    _free(device)
    return seconds, mem.peak_mib


def gpu_sft(args, device, lora: bool) -> tuple[float, float]:
    """(tokens/s, peak MiB) of SFT steps on one --sft-length sequence, bf16 autocast, gradient
    checkpointing."""
    model = random_model(args.config, device, torch.bfloat16 if lora else torch.float32)
    if lora:
        apply_lora(model, GPU_LORA_RANK)
    T = args.sft_length or 4096
    ids = torch.randint(10, model.config.vocab_size, (args.sft_batch or 1, T),
                        generator=torch.Generator().manual_seed(0))
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, T // 2:] = True
    with DeviceMemory(device) as mem:
        tps = sft_throughput(model, ids, loss_mask, steps=args.repeats, bf16=True,
                             gradient_checkpointing=True)["tokens_per_s"]
    del model
    _free(device)
    return tps, mem.peak_mib


def _guarded(fn, *a, **kw) -> tuple:
    """fn(*a, **kw), or (None, None) when the GPU runs out of memory (a full fine-tune of 4B+ on a
    smaller card)."""
    try:
        return fn(*a, **kw)
    except torch.cuda.OutOfMemoryError:
        _free(a[1])
        return None, None


def bench_gpu(args) -> None:
    """One GPU, no weights: decode, a Skill-R1 update and SFT on a random model of --config (module
    docstring)."""
    device = args.device or "cuda"   # --device was resolved at parse time (minskill.cli): cuda
                                     # without a GPU stops there
    set_up_device(device)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise BenchUnavailable("bench gpu needs a CUDA GPU, and torch sees none (for a smoke test "
                               "of the code path on a CPU: --device cpu --config tiny)")
    where = torch.cuda.get_device_name(torch.device(device)) if torch.device(
            device).type == "cuda" else "CPU"
    n_params = sum(p.numel() for p in random_model(args.config, "meta").parameters())
    print(f"bench gpu: {args.config} ({n_params:,} parameters, random weights) on {where}, torch "
          f"{torch.__version__}; update: K={args.candidates} x {args.skill_tokens} tokens after a "
          f"{args.context_tokens}-token prompt; SFT: {args.sft_batch or 1} x "
          f"{args.sft_length or 4096} tokens; median of {args.repeats}", flush=True)
    rows = gpu_decode(args, device)
    updates = (("", {}), (f", micro-batch {args.micro_batch}, β = {GPU_BETA}",
                           dict(beta=GPU_BETA, micro_batch=args.micro_batch)),
               (", masked: a prompt per candidate", dict(masked=True)))
    for lora in (False, True):
        mode = f"LoRA r={GPU_LORA_RANK}, bf16 base" if lora else "full, float32 weights + AdamW"
        for label, kw in updates:
            seconds, peak = _guarded(gpu_update, args, device, lora, **kw)
            rows[f"Skill-R1 update s{label} ({mode})"] = seconds
            rows[f"Skill-R1 update peak MiB{label} ({mode})"] = peak
        tps, peak = _guarded(gpu_sft, args, device, lora)
        rows[f"SFT tok/s, grad checkpointing ({mode})"], rows[f"SFT peak MiB ({mode})"] = tps, peak
    print("| measurement | value |\n|---|---|")
    for name, value in rows.items():
        shown = ("out of memory" if value is None
                 else f"{value:.2f}" if value < 100 else f"{value:.0f}")
        print(f"| {name} | {shown} |")


def bench_memory(args) -> None:
    """The predicted peak of one Skill-R1 update (minskill.nn.memory); the micro-batch that fits."""
    print(memory_report(args.config, UpdateShape(
        candidates=args.candidates, prompt_tokens=args.context_tokens,
        skill_tokens=args.skill_tokens, micro_batch=args.micro_batch, lora_rank=args.lora_rank,
        lora_base_bytes=2 if args.lora_base_dtype == "bfloat16"
        else 4, bf16=args.bf16, grad_checkpointing=args.grad_checkpointing,
        device=torch.device(args.device).type if args.device else "cuda"), args.gpu_gib))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m minskill.measure.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["model", "server", "profile", "grpo", "sft", "gpu", "memory"])
    p.add_argument("--model", default="smollm2-135m", help="model spec (HF folder or smollm2-135m)")
    p.add_argument("--decode-tokens", type=int, default=64,
                   help="new tokens per decode measurement")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions (median is reported)")
    p.add_argument("--candidates", "-K", type=int, default=4, help="grpo: K")
    p.add_argument("--skill-tokens", type=int, default=64,
                   help="grpo: editor tokens per candidate (default 64, "
                   "as train_grpo.py's --max-skill-tokens)")
    p.add_argument("--context-tokens", "--prompt-tokens", type=int, default=512,
                   help="grpo: the editor prompt's budget (default 512, "
                   "as train_grpo.py)")
    p.add_argument("--sft-batch", type=int, default=None,
                   help="sequences per SFT step (default 4; gpu: 1)")
    p.add_argument("--sft-length", type=int, default=None,
                   help="tokens per SFT sequence (default 256; gpu: 4096)")
    p.add_argument("--config", choices=sorted(GPU_CONFIGS), default="qwen3-0.6b",
                   help="gpu: the published "
                   "architecture to build with random weights (default qwen3-0.6b; tiny: a CPU "
                   "smoke test)")
    p.add_argument("--device", type=resolve_device, default=None,
                   help="gpu: the device (default cuda; cpu only to "
                   "smoke-test the code); server: the server's --device (default: the server's "
                   "auto); memory: whose attention layout to predict (default cuda)")
    p.add_argument("--grad-checkpointing", action="store_true",
                   help="gpu, memory: also recompute layers in the "
                   "Skill-R1 update (SFT always does)")
    p.add_argument("--micro-batch", type=int, default=4,
                   help="memory, gpu: candidates per micro-batch (default 4)")
    p.add_argument("--lora-rank", type=int, default=0, help="memory: LoRA adapters of rank R "
                                                            "(default 0: full)")
    p.add_argument("--lora-base-dtype", choices=["float32", "bfloat16"], default="bfloat16",
                   help="memory: the "
                   "frozen LoRA base's storage (default bfloat16: the trainers' default on CUDA)")
    p.add_argument("--bf16", action="store_true", help="memory: bf16 autocast over float32 weights")
    p.add_argument("--gpu-gib", type=float, default=80.0,
                   help="memory: the GPU's memory (default 80)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice); "
                   "server: the servers' threads, llama.cpp's too")
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES, default="none",
                   help="server, grpo: the embedded "
                   "server's weights (default none = float)")
    p.add_argument("--gguf", default=None, help="model, server --against llama-cpp: the GGUF of "
                   "--model for llama.cpp (the offline default finds its own)")
    add_server_args(p)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        {"model": bench_model, "server": bench_server, "grpo": bench_grpo, "sft": bench_sft,
         "gpu": bench_gpu, "memory": bench_memory, "profile": bench_profile}[args.what](args)
    except BenchUnavailable as e:
        print(e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
