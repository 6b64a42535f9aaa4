#!/usr/bin/env bash
# The lead's third H100 call of 2026-11-23 evening: prefill graphs up to the step budget where
# they pay (graph_worthy_tokens). The graph and step-path GPU tests; S1 at 128 in flight twice
# (fresh servers), with the engine's graph/eager step counts; W1 (throughput beside the longer
# capture); the 8B start-up from an empty Triton cache (fewer prefill graphs there).
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=560 bash scripts/lead_round7.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
step_path_tests 200
s1 --concurrency 128
grep -E "warm-up|memory budget" /tmp/served_path/server_real_128.log | tee -a "$LOG"
s1 --concurrency 128
s1 --concurrency 32
echo "== W1" | tee -a "$LOG"
timeout 150 python3 -m ladle bench throughput --workload W1 --runs 2 --no-progress \
  --json "$OUT/w1.json" > "$OUT/w1.log" 2>&1; tail -14 "$OUT/w1.log" | tee -a "$LOG"
if [ "$(left)" -gt 70 ]; then
  echo "== 8B start-up, empty Triton cache" | tee -a "$LOG"
  TRITON_CACHE_DIR=/tmp/cold_cache timeout $(( $(left) - 5 )) python3 scripts/startup_profile.py \
    llama-3.1-8b --load-format dummy --json "$OUT/startup_8b.json" 2>&1 | grep -v Warn | tail -14 \
    | tee -a "$LOG"
fi
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
