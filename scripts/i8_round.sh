#!/usr/bin/env bash
# Issue 8 GPU round: GPU tests (graphs on), then ladle bench latency/throughput with graphs on
# and off. Everything lands under $OUT (bench_*.json, logs).
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
B="python3 -m ladle bench"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -x tests/gpu/test_cuda_graphs.py tests/gpu/test_gpu_parity.py 2>&1 | tail -15 > "$OUT/gpu_tests.log"
  tail -5 "$OUT/gpu_tests.log"
fi
run() { name=$1; shift; echo "== $name"; timeout "${BENCH_TIMEOUT:-150}" $B "$@" --no-progress --json "$OUT/bench_$name.json" > "$OUT/$name.log" 2>&1; tail -14 "$OUT/$name.log"; }
if [ "${ONLY_W1_W2:-0}" != 1 ]; then
run w3_small latency --workload W3 --runs 3
run w3_small_eager latency --workload W3 --runs 1 --enforce-eager --no-busy
fi
run w1 throughput --workload W1 --runs 2 ${W1_PEER:-}
if [ "${ONLY_W1_W2:-0}" != 1 ]; then
run w1_eager throughput --workload W1 --runs 1 --enforce-eager
run w3_large latency --workload W3-8b --runs 2 --no-busy
fi
[ "${W2:-0}" = 1 ] && run w2 throughput --workload W2 --runs 1 --no-busy
exit 0
