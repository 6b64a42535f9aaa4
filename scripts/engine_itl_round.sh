#!/usr/bin/env bash
# Issue 8 item 6 on the GPU: S1's inter-token times at the client against the engine's own
# (ladle:engine_inter_token_latency_seconds: each running stream's wait since the engine sent
# its previous token, over the same tokens). Fresh `ladle serve` per level, 32, 128 and 256 in
# flight (256 twice), then the API process in front of a paced 8 ms stand-in engine at 256
# streams (an exact engine: what the API process adds on this host's cores).
# Run from the repo root of the device copy, carrying .whl and .carry/tok:
#   DEADLINE_S=300 bash scripts/engine_itl_round.sh
# Each level prints one line "real xN: ITL mean client A ms / engine B ms = A/B; p50 ...":
# item 6 holds where the mean ratio is within 0.9-1.1. The JSON lines (every figure) are in
# $OUT/served_path.jsonl, the server logs and /metrics texts in $OUT/served_path_logs.tgz.
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
for concurrency in 32 128 256 256; do
  s1_level --server real --client bench --concurrency $concurrency
done
s1_level --server api --client bench --concurrency 256 --step-ms 8 --paced-tokenizer none
tar czf "$OUT/served_path_logs.tgz" -C /tmp served_path 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
