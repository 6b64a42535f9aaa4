#!/usr/bin/env bash
# Lead, 2026-11-23 night, call 4: the fp8 KV cache read in float16 tiles (paged_attention.py):
# its kernel and engine tests, the decode attention timings against bf16, W2 (all 256 requests)
# bf16 vs fp8 weights + fp8 KV in one call, the batch-64 fp8 decode step kernel by kernel.
#   DEADLINE_S=360 bash scripts/lead_round15.sh   (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE -n 3 tests/gpu/test_fp8_kv_cache.py \
  --deselect "tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes" \
  2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -6 | tee -a "$LOG"
echo "== fp8 decode attention sweep" | tee -a "$LOG"
timeout 60 python3 scripts/fp8_kv_decode_sweep.py 2>&1 | grep -v Warning | tee -a "$LOG"
for quant in "" "--quantization fp8 --kv-cache-dtype fp8"; do
  [ "$(left)" -gt 60 ] || break
  echo "== W2 all 256 $quant" | tee -a "$LOG"
  timeout 120 python3 -m ladle bench throughput --workload W2 --runs 1 --no-busy --no-progress $quant \
    --json $OUT/w2_$( [ -z "$quant" ] && echo bf16 || echo fp8 ).json 2>&1 | grep -E "tok/s|floor|ITL|TTFT|start" | tee -a "$LOG"
done
[ "$(left)" -gt 50 ] && { echo "== profile batch 64 fp8" | tee -a "$LOG"
  timeout 80 python3 scripts/decode_kernel_profile.py --batch 64 --prompt-len 900 --steps 20 --quantization fp8 \
    --kv-cache-dtype fp8 --top 8 2>/dev/null > $OUT/prof64_fp8.json
  python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
print({k: v for k, v in d.items() if k != 'kernels'})
[print(r) for r in d['kernels'][:6]]" $OUT/prof64_fp8.json | tee -a "$LOG"; }
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
