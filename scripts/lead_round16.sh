#!/usr/bin/env bash
# Lead, 2026-11-23 night, call 6: fp8 projections at decode sizes through ladle's Triton kernel
# (kernels/fp8_matmul.py): its tests and the fp8 layer tests, W2 (all 256 requests) bf16 vs fp8
# weights + fp8 KV, W3-8b with fp8 weights, the batch-64 fp8 step kernel by kernel.
#   DEADLINE_S=300 bash scripts/lead_round16.sh   (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE -n 3 tests/gpu/test_fp8_matmul.py \
  tests/gpu/test_quant_kernels.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -6 | tee -a "$LOG"
for quant in "" "--quantization fp8 --kv-cache-dtype fp8"; do
  [ "$(left)" -gt 60 ] || break
  echo "== W2 all 256 $quant" | tee -a "$LOG"
  timeout 100 python3 -m ladle bench throughput --workload W2 --runs 1 --no-busy --no-progress $quant \
    --json $OUT/w2_$( [ -z "$quant" ] && echo bf16 || echo fp8 ).json 2>&1 | grep -E "tok/s|floor|ITL|TTFT|start" | tee -a "$LOG"
done
[ "$(left)" -gt 60 ] && { echo "== W3-8b fp8" | tee -a "$LOG"; timeout 70 python3 -m ladle bench latency --workload W3-8b --runs 3 --no-busy \
  --quantization fp8 --json $OUT/w3_8b_fp8.json 2>&1 | grep -E "tok/s|ITL|TTFT|start" | tee -a "$LOG"; }
[ "$(left)" -gt 45 ] && { echo "== profile batch 64 fp8" | tee -a "$LOG"
  timeout $(( $(left) - 5 )) python3 scripts/decode_kernel_profile.py --batch 64 --prompt-len 900 --steps 20 --quantization fp8 \
    --kv-cache-dtype fp8 --top 8 2>/dev/null > $OUT/prof64_fp8.json
  python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
print({k: v for k, v in d.items() if k != 'kernels'})
[print(r) for r in d['kernels'][:6]]" $OUT/prof64_fp8.json | tee -a "$LOG"; }
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
