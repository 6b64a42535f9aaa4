# Lead round 26 (session 8, call 1): every GPU test file (the fused rotary + cache write, the
# sampler reading bf16 logits), the int4 batch-1 step profile, W3-8b int4 and W3 0.6B, the fp8
# tile sweep above 64 rows against cuBLASLt (fast accumulation in both), then a W2 fp8 / bf16 pair.
#   DEADLINE_S=570 bash scripts/lead_round26.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests
echo "== profile int4 batch 1 ($(left) s left)" | tee -a "$LOG"
timeout 60 python3 scripts/decode_kernel_profile.py --steps 10 --top 25 --quantization int4 \
  > "$OUT/prof_int4_1.json" 2> "$OUT/prof_int4_1.err"; tail -c 300 "$OUT/prof_int4_1.err" >> "$LOG"
for spec in "W3-8b int4" "W3 bf16"; do
  set -- $spec
  [ "$(left)" -gt 60 ] || { echo "skipped $spec" | tee -a "$LOG"; continue; }
  echo "== $spec ($(left) s left)" | tee -a "$LOG"
  quant=(); [ "$2" = int4 ] && quant=(--quantization int4)
  timeout 70 python3 -m ladle bench latency --workload "$1" --runs 3 --no-busy --no-progress \
    "${quant[@]}" --json "$OUT/${1}_$2.json" 2>&1 | grep -E "ITL|TTFT" | tee -a "$LOG"
done
echo "== fp8 sweep above 64 rows ($(left) s left)" | tee -a "$LOG"
timeout 100 python3 scripts/fp8_gemm_bench.py --tokens 128 256 --shapes o down qkv --wide-tiles \
  --json "$OUT/fp8_sweep.json" 2>&1 | grep -v Warning | tee -a "$LOG"
w2_run fp8_a --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_a
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
