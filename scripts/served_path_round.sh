#!/usr/bin/env bash
# Issue 8 item 6 on the GPU machine: who makes S1's streams bursty at 128-256 in flight? The
# client alone (a trivial SSE server on a 7 ms clock), the API process against a paced engine
# (no GPU), then S1 itself on the GPU: output tok/s, ITL, tokens per chunk and CPU seconds per
# output token of each process (client, API, engine), one fresh server per level.
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=540 bash scripts/served_path_round.sh
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
python3 -c "import aiohttp, uvloop, psutil" || { echo "aiohttp, uvloop and psutil are needed" | tee -a "$LOG"; exit 1; }
bench() {
  [ "$(left)" -gt 60 ] || { echo "skipped (deadline): $*" | tee -a "$LOG"; return; }
  echo "== $*" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path "$@" 2>&1 | grep -v Warning | tail -4 | tee -a "$LOG"
}
# 1. S1 on the GPU (random weights run without a tokenizer on this offline machine, as S1 did).
# S1_LEVELS= (empty) skips it, e.g. to try the rest of the script on a CPU machine.
levels=${S1_LEVELS-128 256 32}
[ -n "$levels" ] && bench --server real --client bench --concurrency $levels
# 2. The client alone, at 128 and 256 streams of a 7 ms step (18,300 and 36,600 events/s).
bench --server stub --client bench --concurrency 128 256 --step-ms 7
bench --server stub --client raw --concurrency 128 256 --step-ms 7
# 3. The API process against a paced engine of a 7 ms step: no tokenizer (as S1), then with one.
bench --server api --client bench --concurrency 128 256 --step-ms 7 --paced-tokenizer none
bench --server api --client raw --concurrency 128 --step-ms 7 --paced-tokenizer none
bench --server api --client bench --concurrency 128 --step-ms 7 --paced-tokenizer "$PWD/.carry/tok"
tar czf "$OUT/served_path_logs.tgz" -C /tmp served_path 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
