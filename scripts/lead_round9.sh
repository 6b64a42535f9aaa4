#!/usr/bin/env bash
# The lead's fifth H100 call of 2026-11-23 evening: where S1's ITL tail at 128 in flight comes
# from. Three fresh servers; each run reports the engine's step-time histogram for the run alone
# (start-up's warm-up steps subtracted) and the client's gaps over 30 ms grouped by the instant
# they ended (a stall every stream sees at once is the server's).
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=300 bash scripts/lead_round9.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
for run in 1 2 3; do
  [ "$(left)" -gt 45 ] || break
  timeout $(( $(left) - 5 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path --concurrency 128 --server real --client bench 2>&1 \
    | grep -v Warning | tail -1 | tee -a "$LOG"
done
tar czf "$OUT/served_path_logs.tgz" -C /tmp served_path 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
