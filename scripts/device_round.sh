#!/usr/bin/env bash
# One GPU round on the lent device: GPU tests, then the offline throughput benchmark.
# Run from the repository root; results land in $OUT (or ./.device_out locally).
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)' | tee -a "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q tests/gpu ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-240}" python3 -m ladle.bench.offline_throughput --model qwen3-0.6b \
    --load-format dummy --num-prompts 256 --input-len 100 1024 --output-len 100 1024 \
    --peer none --runs "${RUNS:-3}" --json "$OUT/throughput.json" 2>&1 | tail -25 | tee "$OUT/bench.log"
fi
