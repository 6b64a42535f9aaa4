#!/usr/bin/env bash
# The lead's GPU round on merged main: every GPU test, then the standard benches with graphs and
# the fused kernels together (W3 both shapes, W1 with the HF peer on its first 32 requests).
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src:tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q tests/gpu -p no:cacheprovider -rs 2>&1 \
    | tail -40 > "$OUT/gpu_tests.log"
  tail -6 "$OUT/gpu_tests.log"
fi
run() { name=$1; shift; echo "== $name"; timeout "${BENCH_TIMEOUT:-150}" python3 -m ladle bench "$@" \
  --no-progress --json "$OUT/bench_$name.json" > "$OUT/$name.log" 2>&1; tail -14 "$OUT/$name.log"; }
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
run w3_small latency --workload W3 --runs 3
run w1 throughput --workload W1 --runs 2 --peer hf --peer-requests "${PEER_REQUESTS:-32}"
[ "${SKIP_8B:-0}" = 1 ] || run w3_large latency --workload W3-8b --runs 2 --no-busy
exit 0
