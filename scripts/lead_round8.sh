#!/usr/bin/env bash
# The lead's fourth H100 call of 2026-11-23 evening, at merged main (t8h, t8u, the 8192-token
# prefill graphs, the step-time histogram): every GPU test (four workers; the fp8 budget test
# again alone, since it sizes against the GPU's free memory), W3 on both shapes, and S1 at 128
# in flight twice with the engine's step-time histogram (where the ITL tail comes from).
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=570 bash scripts/lead_round8.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile tests/gpu \
  --deselect "tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes" \
  > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -12 | tee -a "$LOG"
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE \
  "tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes" 2>&1 \
  | grep -E "passed|failed" | tee -a "$LOG"
echo "== tests done at $((SECONDS - start)) s" | tee -a "$LOG"
for w in W3 W3-8b; do
  echo "== $w" | tee -a "$LOG"
  timeout 150 python3 -m ladle bench latency --workload $w --runs 3 --no-progress \
    --json "$OUT/bench_$w.json" > "/tmp/$w.log" 2>&1; grep -E "TTFT|ITL|busy|start-up|floor ms" "/tmp/$w.log" | tee -a "$LOG"
done
for run in 1 2; do
  s1 --concurrency 128
  cp /tmp/served_path/metrics_128.txt "$OUT/metrics_128_$run.txt" 2>/dev/null
done
tar czf "$OUT/served_path_logs.tgz" -C /tmp served_path 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
