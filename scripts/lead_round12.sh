#!/usr/bin/env bash
# Lead, 2026-11-23 night, call 1: start-up with parallel Triton builds and captures without an
# eager run each (cold and warm cache, old behaviour beside it), the W3-8b decode step kernel by
# kernel, cuBLAS vs Triton one-row GEMVs, one ragged cuDNN call for several fresh prompts.
#   DEADLINE_S=540 bash scripts/lead_round12.sh   (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== tests" | tee -a "$LOG"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_parallel_builds.py 2>&1 | tail -5 | tee -a "$LOG"
step_path_tests 220
for mode in new old; do
  [ "$(left)" -gt 100 ] || break
  cache=/tmp/cold_cache_$mode
  rm -rf $cache
  if [ $mode = old ]; then flags="LADLE_PARALLEL_TRITON_BUILDS=0 LADLE_EAGER_RUN_BEFORE_CAPTURE=1"; else flags=""; fi
  echo "== start-up 8B cold, $mode" | tee -a "$LOG"
  env $flags TRITON_CACHE_DIR=$cache timeout 90 python3 scripts/startup_profile.py llama-3.1-8b \
    --load-format dummy --json $OUT/startup_8b_cold_$mode.json 2>&1 | grep -v Warning | tail -14 | tee -a "$LOG"
done
echo "== start-up 8B warm cache, new" | tee -a "$LOG"
TRITON_CACHE_DIR=/tmp/cold_cache_new timeout 60 python3 scripts/startup_profile.py llama-3.1-8b \
  --load-format dummy --json $OUT/startup_8b_warm_new.json 2>&1 | grep -v Warning | tail -14 | tee -a "$LOG"
echo "== decode kernel profile 8B batch 1" | tee -a "$LOG"
TRITON_CACHE_DIR=/tmp/cold_cache_new timeout 90 python3 scripts/decode_kernel_profile.py --model llama-3.1-8b \
  --batch 1 --steps 40 > $OUT/decode_profile_8b.json 2>$OUT/decode_profile.err; tail -c 3000 $OUT/decode_profile_8b.json | tee -a "$LOG"
echo "== gemv" | tee -a "$LOG"
timeout 120 python3 scripts/gemv_bench.py --json $OUT/gemv.json 2>&1 | grep -v Warning | tee -a "$LOG"
echo "== cudnn ragged" | tee -a "$LOG"
timeout 60 python3 scripts/cudnn_ragged_probe.py --json $OUT/cudnn_ragged.json 2>&1 | grep -v Warning | tail -5 | tee -a "$LOG"
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
