#!/usr/bin/env bash
# The lead's last H100 call of 2026-11-23 evening: S1 after the API process stopped stalling in
# full garbage collections (streams keep no cumulative logprobs; full collections 10x rarer).
# Fresh servers at 128 (twice), 256 and 32 in flight, with the engine's run-only step
# histogram and the client's stalls.
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=200 bash scripts/lead_round11.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
for level in 128 128 256 32; do
  [ "$(left)" -gt 35 ] || break
  timeout $(( $(left) - 5 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path --concurrency $level --server real --client bench 2>&1 \
    | grep -v Warning | tail -1 | tee -a "$LOG"
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
