#!/usr/bin/env bash
# The prepared GPU check (issues 24 and 44): one command for a bare GPU machine with PyTorch and no network, in at
# most 8 minutes of wall time (each part under its own timeout):
#   1. a preflight: torch, the CUDA device, which packages import (those missing: docs/gpu.md has the wheels);
#   2. the GPU tests (tests/test_gpu.py: the tiny model and a random Qwen3-0.6B);
#   3. NCCL across two processes, when the machine has two GPUs (else the summary says it was not run);
#   4. `bench gpu` on the random Qwen3-0.6B.
# Every figure goes to $OUT (when set, else a fresh temporary folder): environment.txt, test_gpu.txt (+ junit
# XML), nccl.txt, bench_gpu.txt, summary.txt, and all of them in one file, gpu_check.txt. Without CUDA (a CPU
# machine, a CPU build of torch) it says so, runs the GPU tests (they skip: they import) and skips the rest.
# Exit status: 0 when every part that ran passed (no CUDA included); 1 when one failed or timed out; 2 when
# python, torch or a package the tests need is missing.
#     bash tests/gpu_check.sh            (from anywhere; PYTHON=... picks the interpreter)
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python || command -v python3 || true)}"   # a bare image may have python3 only
if [ -z "$PY" ]; then
    echo "gpu_check: neither python nor python3 is on PATH (set PYTHON=...)"; exit 2
fi
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
start=$(date +%s)
summary=()

# 1. preflight: exit 0 CUDA ready, 3 no CUDA, 2 a needed package missing
{
    date -u
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    else
        echo "nvidia-smi: not on PATH"
    fi
    timeout -k 5 90 "$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
except ImportError as e:
    print(f"torch: MISSING ({e}): install the torch build for your CUDA first"); sys.exit(2)
print("torch", torch.__version__, "built for CUDA", torch.version.cuda, "available", torch.cuda.is_available())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, {p.total_memory / 2 ** 30:.1f} GiB, compute capability {p.major}.{p.minor}, "
          f"bf16 {torch.cuda.is_bf16_supported()}")
needed = ("numpy", "tokenizers", "safetensors", "requests", "yaml", "pytest")
optional = {"gguf": "only to convert a GGUF (the offline default model)",
            "openai": "the server-on-CUDA test answers the official client; skipped without it"}
missing = []
for name in needed + tuple(optional):
    try:
        module = importlib.import_module(name)
        print(f"import {name}: ok {getattr(module, '__version__', '')}")
    except ImportError:
        print(f"import {name}: MISSING" + (f" ({optional[name]})" if name in optional else " (needed)"))
        missing += [name] if name in needed else []
if missing:
    print(f"missing {', '.join(missing)}: bring the wheels (docs/gpu.md, 'A GPU machine without network')")
    sys.exit(2)
sys.exit(0 if torch.cuda.is_available() else 3)
EOF
    echo "preflight exit $?"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"
preflight=$(tail -n 1 "$OUT/environment.txt" | sed 's/preflight exit //')
case "$preflight" in
    0) cuda=1; gpus=$(grep -c '^cuda:' "$OUT/environment.txt") ;;
    3) cuda=0; gpus=0; summary+=("preflight: CUDA absent (torch sees no GPU): the GPU parts are skipped") ;;
    *) echo "gpu_check: preflight failed (exit $preflight): see $OUT/environment.txt" \
           | tee "$OUT/summary.txt"; exit 2 ;;
esac

# 2. the GPU tests (each skips without CUDA; run anyway, so a CPU machine shows they import)
timeout -k 10 250 "$PY" -m pytest tests/test_gpu.py -q -rs -p no:cacheprovider --durations=10 \
    --junitxml "$OUT/test_gpu.xml" 2>&1 | tee "$OUT/test_gpu.txt"
tests=${PIPESTATUS[0]}
summary+=("test_gpu exit $tests (124: timed out): $(tail -n 1 "$OUT/test_gpu.txt")")

# 3. NCCL on two processes: needs two GPUs (NCCL refuses two ranks on one device)
nccl=0
if [ "$cuda" = 1 ] && [ "${gpus:-0}" -ge 2 ]; then
    cat > "$OUT/nccl_check.py" <<'EOF'
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); torch.cuda.set_device(rank)
dist.init_process_group("nccl")
x = torch.full((1024,), float(rank + 1), device="cuda")
dist.all_reduce(x)
assert x.eq(3.0).all().item(), x[:4]
print(f"rank {rank}: NCCL all_reduce ok on {torch.cuda.get_device_name(rank)}")
dist.destroy_process_group()
EOF
    timeout -k 5 30 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 "$OUT/nccl_check.py" \
        > "$OUT/nccl.txt" 2>&1
    nccl=$?
    cat "$OUT/nccl.txt"
    summary+=("NCCL on two processes exit $nccl")
else
    echo "NCCL: not run (it needs two GPUs; this machine has ${gpus:-0})" | tee "$OUT/nccl.txt"
    summary+=("NCCL: not run (needs two GPUs, ${gpus:-0} here)")
fi

# 4. bench gpu on the random Qwen3-0.6B
bench=0
if [ "$cuda" = 1 ]; then
    timeout -k 10 120 "$PY" -m minskill.measure.bench gpu --config qwen3-0.6b --repeats 3 --micro-batch 2 2>&1 \
        | tee "$OUT/bench_gpu.txt"
    bench=${PIPESTATUS[0]}
    summary+=("bench gpu exit $bench (124: timed out)")
else
    echo "bench gpu: not run (no CUDA)" | tee "$OUT/bench_gpu.txt"
    summary+=("bench gpu: not run (no CUDA)")
fi

ok=$([ "$tests" -eq 0 ] && [ "$nccl" -eq 0 ] && [ "$bench" -eq 0 ] && echo passed || echo FAILED)
ran=$([ "$cuda" = 1 ] && echo "on $(grep -m 1 '^cuda:0' "$OUT/environment.txt")" \
      || echo "without CUDA: nothing ran on a GPU")
summary+=("gpu_check: $ok $ran, in $(( $(date +%s) - start )) s; figures in $OUT")
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
for part in environment test_gpu nccl bench_gpu summary; do   # every figure in one file too
    printf '==== %s.txt\n' "$part"; cat "$OUT/$part.txt"
done > "$OUT/gpu_check.txt"
[ "$ok" = passed ]
