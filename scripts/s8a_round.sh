#!/usr/bin/env bash
# Issue 8 (persistent batch + overlapped scheduling) GPU round: the GPU tests that drive the
# engine (overlap, graphs, bf16 parity) with overlap on, then W3 and W1 with overlap on and off
# and the profiler's idle gap between steps. Everything goes under $OUT.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u +%FT%TZ | tee "$OUT/started.txt"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q tests/gpu/test_overlap_gpu.py \
  tests/gpu/test_cuda_graphs.py tests/gpu/test_gpu_parity.py -p no:cacheprovider -rs -x \
  --durations=5 > "$OUT/gpu_tests.log" 2>&1
tail -12 "$OUT/gpu_tests.log"
run() { name=$1; shift; echo "== $name $(date -u +%T)"; timeout "${BENCH_TIMEOUT:-120}" \
  python3 -m ladle bench "$@" --no-progress --json "$OUT/bench_$name.json" > "$OUT/$name.log" 2>&1
  tail -14 "$OUT/$name.log"; }
run w3_overlap latency --workload W3 --runs 3
run w3_sync latency --workload W3 --runs 3 --no-async-scheduling
for mode in --async-scheduling --no-async-scheduling; do
  echo "== gap $mode $(date -u +%T)"
  timeout 90 python3 scripts/step_gap.py --workload W1 --num-requests 256 $mode \
    2> "$OUT/gap$mode.err" | tee -a "$OUT/gaps.jsonl"
done
run w1_overlap throughput --workload W1 --runs 1
run w1_sync throughput --workload W1 --runs 1 --no-async-scheduling
date -u +%FT%TZ | tee "$OUT/finished.txt"
exit 0
