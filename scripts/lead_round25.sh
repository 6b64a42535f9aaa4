# Lead round 25 (session 7's final call, at merged main with t12f, t12q3 and t12b1): every GPU
# test file (four workers; the fp8 budget test deselected: it sizes from memory other workers
# hold), then W1 and W3 on the 0.6B shape as the bf16 regression check of the shared changes
# (attention split rule, greedy argmax).
#   DEADLINE_S=560 bash scripts/lead_round25.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== all GPU tests" | tee -a "$LOG"
timeout 330 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile tests/gpu --deselect \
  tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -15 | tee -a "$LOG"
for workload in W1 W3; do
  [ "$(left)" -gt 70 ] || { echo "skipped $workload" | tee -a "$LOG"; continue; }
  echo "== $workload ($(left) s left)" | tee -a "$LOG"
  cmd=throughput; [ $workload = W3 ] && cmd=latency
  timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) python3 -m ladle bench $cmd --workload $workload \
    --runs 3 --no-busy --no-progress --json "$OUT/$workload.json" 2>&1 | grep -E "tok/s|ITL|TTFT" | tee -a "$LOG"
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
