#!/usr/bin/env bash
# Lead, 2026-11-23 night, call 2: the one-row GEMV (kernels/gemv.py) at batch 1: all GPU tests,
# W3 on both shapes, the 8B decode step kernel by kernel again, a wider GEMV config sweep, and
# the cold start-up with and without the thread-pool builds.
#   DEADLINE_S=560 bash scripts/lead_round13.sh   (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== all GPU tests" | tee -a "$LOG"
timeout 260 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile tests/gpu \
  --deselect "tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes" \
  > $OUT/gpu_tests_all.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests_all.log | tail -15 | tee -a "$LOG"
for workload in W3-8b W3; do
  [ "$(left)" -gt 120 ] || break
  echo "== $workload" | tee -a "$LOG"
  timeout 150 python3 -m ladle bench latency --workload $workload --runs 3 --json $OUT/bench_$workload.json \
    2>&1 | grep -v Warning | tail -6 | tee -a "$LOG"
done
echo "== decode kernel profile 8B batch 1" | tee -a "$LOG"
timeout 80 python3 scripts/decode_kernel_profile.py --model llama-3.1-8b --batch 1 --steps 40 \
  > $OUT/decode_profile_8b.json 2>$OUT/decode_profile.err
python3 -c "
import json; d=json.load(open('$OUT/decode_profile_8b.json'))
print({k: v for k, v in d.items() if k != 'kernels'})
[print(r) for r in d['kernels'][:14]]" | tee -a "$LOG"
for mode in pool nopool; do
  [ "$(left)" -gt 90 ] || break
  rm -rf /tmp/cc_$mode
  if [ $mode = nopool ]; then flags="LADLE_PARALLEL_TRITON_BUILDS=0"; else flags=""; fi
  echo "== start-up 8B cold, $mode" | tee -a "$LOG"
  env $flags TRITON_CACHE_DIR=/tmp/cc_$mode timeout 80 python3 scripts/startup_profile.py llama-3.1-8b \
    --load-format dummy --json $OUT/startup_cold_$mode.json 2>&1 | grep -v Warning | grep -v "KV cache alloc" | tail -12 | tee -a "$LOG"
done
[ "$(left)" -gt 70 ] && { echo "== gemv sweep" | tee -a "$LOG"; timeout $(( $(left) - 10 )) python3 scripts/gemv_bench.py --json $OUT/gemv.json 2>&1 | grep -v Warning | tee -a "$LOG"; }
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
