#!/usr/bin/env bash
# The lead's first H100 call of 2026-11-23 evening: every GPU test at merged main (t8s, t13f,
# t12s, t12q), four pytest workers sharing the GPU, then S1 at 128 and 32 in flight through
# `ladle serve` with the aiohttp bench client (fresh server per level).
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=570 bash scripts/lead_round5.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout "${TEST_TIMEOUT:-390}" python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile \
  --durations=25 tests/gpu > "$OUT/gpu_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -25 | tee -a "$LOG"
echo "== tests done at $((SECONDS - start)) s" | tee -a "$LOG"
if [ "$(left)" -gt 90 ]; then
  timeout $(( $(left) - 10 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path --server real --client bench --concurrency ${S1_LEVELS:-128 32} 2>&1 \
    | grep -v Warning | tail -8 | tee -a "$LOG"
  tar czf "$OUT/served_path_logs.tgz" -C /tmp served_path 2>/dev/null
fi
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
