#!/usr/bin/env bash
# Lead, 2026-11-23 night, call 3: issue 12's W2 target on all 256 requests (bf16 vs fp8 weights +
# fp8 KV), the 8B decode step kernel by kernel at batch 64 (bf16 and fp8 + fp8 KV), int4 W3-8b
# with the GEMV LM head, the GEMV tests at the new default tile.
#   DEADLINE_S=400 bash scripts/lead_round14.sh   (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 90 python3 -m pytest -q -p no:cacheprovider -rfE tests/gpu/test_gemv.py 2>&1 | tail -3 | tee -a "$LOG"
for quant in "" "--quantization fp8 --kv-cache-dtype fp8"; do
  [ "$(left)" -gt 100 ] || break
  echo "== W2 all 256 $quant" | tee -a "$LOG"
  timeout 150 python3 -m ladle bench throughput --workload W2 --runs 1 --no-busy $quant \
    --json $OUT/w2_$( [ -z "$quant" ] && echo bf16 || echo fp8 ).json 2>&1 | grep -v Warning | grep -E "tok/s|floor|ITL|TTFT|start" | tee -a "$LOG"
done
for quant in "" "--quantization fp8 --kv-cache-dtype fp8"; do
  [ "$(left)" -gt 60 ] || break
  echo "== profile batch 64 $quant" | tee -a "$LOG"
  timeout 90 python3 scripts/decode_kernel_profile.py --batch 64 --prompt-len 900 --steps 20 $quant --top 16 \
    2>/dev/null > $OUT/prof64_$( [ -z "$quant" ] && echo bf16 || echo fp8 ).json
  python3 -c "
import json,sys; d=json.load(open(sys.argv[1]))
print({k: v for k, v in d.items() if k != 'kernels'})
[print(r) for r in d['kernels'][:14]]" $OUT/prof64_$( [ -z "$quant" ] && echo bf16 || echo fp8 ).json | tee -a "$LOG"
done
[ "$(left)" -gt 70 ] && { echo "== W3-8b int4" | tee -a "$LOG"; timeout $(( $(left) - 5 )) python3 -m ladle bench latency --workload W3-8b --runs 3 --no-busy --quantization int4 \
  --json $OUT/w3_8b_int4.json 2>&1 | grep -v Warning | tail -12 | tee -a "$LOG"; }
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
