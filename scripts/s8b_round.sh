#!/usr/bin/env bash
# s8b's GPU round (issue 8, deliverable 5 and start-up): the no-compile test and the attention
# kernel tests touched by the split-KV change, W1 twice in one process (first timed run against
# the second, with the Triton builds counted per run), then the 8B start-up profile on a cold
# and then a warm Triton disk cache.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-70}" python3 -m pytest -q -p no:cacheprovider -x \
  tests/gpu/test_no_compile_while_serving.py \
  "tests/gpu/test_triton_attention.py" -k "not interpreted and not cpu_interpreter" 2>&1 \
  | tail -25 > "$OUT/tests.log"; tail -8 "$OUT/tests.log"
echo "== W1"
timeout "${W1_TIMEOUT:-120}" python3 -m ladle bench throughput --workload W1 --runs 2 --no-busy \
  --no-progress --json "$OUT/w1.json" > "$OUT/w1.log" 2>&1; tail -16 "$OUT/w1.log"
grep -o '"tokens_per_s_runs[^]]*]\|"kernel_builds_runs[^]]*]' "$OUT/w1.json"
export TRITON_CACHE_DIR=/tmp/triton_cache_8b
echo "== 8B start-up, cold Triton cache"
timeout "${START_TIMEOUT:-60}" python3 scripts/startup_profile.py llama-3.1-8b --load-format dummy \
  --json "$OUT/startup_8b_cold.json" > "$OUT/startup_8b_cold.log" 2>&1; tail -14 "$OUT/startup_8b_cold.log"
echo "== 8B start-up, warm Triton cache"
timeout "${START_TIMEOUT:-60}" python3 scripts/startup_profile.py llama-3.1-8b --load-format dummy \
  --json "$OUT/startup_8b_warm.json" > "$OUT/startup_8b_warm.log" 2>&1; tail -12 "$OUT/startup_8b_warm.log"
exit 0
