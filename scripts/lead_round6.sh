#!/usr/bin/env bash
# The lead's second H100 call of 2026-11-23 evening: the fp8 budget test alone (it failed beside
# three other pytest workers holding the GPU's memory), W3 0.6B at main, then where S1's ITL p99
# at 128 in flight comes from: the default server against smaller mixed-step token budgets and
# the ITL SLO option, each a fresh server, ITL p99 also over the requests after the first wave.
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=560 bash scripts/lead_round6.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 90 python3 -m pytest -q -p no:cacheprovider -rfE \
  "tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes" \
  > "$OUT/fp8_budget_test.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/fp8_budget_test.log" | tail -5 | tee -a "$LOG"
echo "== W3 0.6B" | tee -a "$LOG"
timeout 120 python3 -m ladle bench latency --workload W3 --runs 3 --no-progress \
  --json "$OUT/w3_small.json" > "$OUT/w3_small.log" 2>&1
tail -12 "$OUT/w3_small.log" | tee -a "$LOG"
s1() {
  [ "$(left)" -gt 60 ] || { echo "skipped (deadline): $*" | tee -a "$LOG"; return; }
  echo "== S1 $*" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path --server real --client bench "$@" 2>&1 \
    | grep -v Warning | tail -3 | tee -a "$LOG"
}
s1 --concurrency 128
s1 --concurrency 128 --serve-args "qwen3-0.6b --load-format dummy --max-num-batched-tokens 2048"
s1 --concurrency 128 --serve-args "qwen3-0.6b --load-format dummy --itl-slo-ms 30"
s1 --concurrency 128 --serve-args "qwen3-0.6b --load-format dummy --max-num-batched-tokens 4096"
s1 --concurrency 256
tar czf "$OUT/served_path_logs.tgz" -C /tmp served_path 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
