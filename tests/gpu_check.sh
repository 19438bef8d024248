#!/usr/bin/env bash
# The prepared GPU check of issue 24, in at most 8 minutes: the GPU tests (tests/test_gpu.py: the tiny model and a
# random Qwen3-0.6B) and `bench gpu` on the random Qwen3-0.6B. Each part runs under its own timeout; the results go
# to $OUT (when set, else a fresh temporary folder): environment.txt, test_gpu.txt (+ junit XML), bench_gpu.txt,
# summary.txt. Exit status: 0 when both parts passed.
#     bash tests/gpu_check.sh            (from the repository root; needs a CUDA build of torch)
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
start=$(date +%s)
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available',
               torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

timeout -k 10 330 python -m pytest tests/test_gpu.py -q -rs -p no:cacheprovider --durations=10 \
    --junitxml "$OUT/test_gpu.xml" 2>&1 | tee "$OUT/test_gpu.txt"
tests=${PIPESTATUS[0]}

timeout -k 10 120 python -m minskill.bench gpu --config qwen3-0.6b --repeats 3 --micro-batch 2 2>&1 \
    | tee "$OUT/bench_gpu.txt"
bench=${PIPESTATUS[0]}

echo "test_gpu exit $tests, bench gpu exit $bench (124: timed out), $(( $(date +%s) - start )) s" | tee "$OUT/summary.txt"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
