#!/usr/bin/env bash
# Lead, 2026-11-23 night, final call at merged main (t12c2, t8s2, t12q2 merged): S1 through a
# fresh `ladle serve` at 32, 128 and 256 in flight with the client's ITL against the engine's
# (ladle:engine_inter_token_latency_seconds, t8s2), the graph/step-path GPU tests and the new
# kernels' tests, W3 0.6B with the HF transformers peer in the same process.
#   DEADLINE_S=390 bash scripts/lead_round17.sh   (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
for concurrency in 256 128 32 256; do
  s1_level --server real --client bench --concurrency $concurrency
done
echo "== GPU tests" | tee -a "$LOG"
step_path_tests 130
timeout 90 python3 -m pytest -q -p no:cacheprovider -rfE -n 3 tests/gpu/test_fp8_matmul.py \
  tests/gpu/test_gemv.py tests/gpu/test_parallel_builds.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -5 | tee -a "$LOG"
[ "$(left)" -gt 60 ] && { echo "== W3 with the HF peer" | tee -a "$LOG"; timeout $(( $(left) - 5 )) python3 -m ladle bench latency \
  --workload W3 --runs 3 --no-busy --no-progress --peer hf --json $OUT/w3_hf.json 2>&1 | grep -E "tok/s|ITL|TTFT|HF|peer" | tee -a "$LOG"; }
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
