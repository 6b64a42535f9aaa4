# Lead round 23 (issue 12, GPU): the two-pass fused SiLU quantization (tests and bench), W2 on
# all 256 requests twice in each mode, interleaved (fp8 + fp8 KV, bf16), and int4 W3-8b.
#   DEADLINE_S=570 bash scripts/lead_round23.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== tests" | tee -a "$LOG"
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 \
  tests/gpu/test_fused_activation_quant_gpu.py tests/gpu/test_fused_kernels.py > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -12 | tee -a "$LOG"
timeout 60 python3 scripts/fused_quant_bench.py > "$OUT/fused_quant.txt" 2>&1; grep silu "$OUT/fused_quant.txt" | tee -a "$LOG"
w2_run fp8_a --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_a
w2_run fp8_b --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_b
[ "$(left)" -gt 70 ] && { echo "== W3-8b int4 ($(left) s left)" | tee -a "$LOG"; timeout $(( $(left) - 5 )) python3 -m ladle \
  bench latency --workload W3-8b --runs 3 --no-busy --no-progress --quantization int4 \
  --json "$OUT/w3_int4.json" 2>&1 | grep -E "ITL|start" | tee -a "$LOG"; }
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
