#!/usr/bin/env bash
# The lead's sixth H100 call of 2026-11-23 evening: padding requests that share a prefill
# graph's padding tokens evenly (one holding them all attended over them quadratically). The
# graph and step-path GPU tests, then S1 at 128 in flight twice with every step over 30 ms
# logged by the engine (LADLE_SLOW_STEP_MS): its shape, graph or eager, launch vs read-back.
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=240 bash scripts/lead_round10.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
step_path_tests 100
export LADLE_SLOW_STEP_MS=30
for run in 1 2; do
  [ "$(left)" -gt 40 ] || break
  timeout $(( $(left) - 5 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path --concurrency 128 --server real --client bench 2>&1 \
    | grep -v Warning | tail -1 | tee -a "$LOG"
  grep "slow step" /tmp/served_path/server_real_128.log > "$OUT/slow_steps_$run.log"
  wc -l < "$OUT/slow_steps_$run.log" | tee -a "$LOG"
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
