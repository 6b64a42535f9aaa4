# Lead round 27 (session 8, call 2): every GPU test file (split-KV merged in the last split,
# PDL for the decode GEMVs, fp8 64-row tiles to 128 rows for narrow projections), then W3-8b int4
# and W3 0.6B with and without PDL, then W2 fp8 / bf16 interleaved, then the int4 step profile.
#   DEADLINE_S=575 bash scripts/lead_round27.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests
latency w3_8b_int4_pdl W3-8b --quantization int4
LADLE_PDL=0 latency w3_8b_int4_nopdl W3-8b --quantization int4
latency w3_bf16_pdl W3
LADLE_PDL=0 latency w3_bf16_nopdl W3
w2_run fp8_a --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_a
w2_run fp8_b --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_b
echo "== profile int4 batch 1 ($(left) s left)" | tee -a "$LOG"
[ "$(left)" -gt 40 ] && timeout $(( $(left) - 5 )) python3 scripts/decode_kernel_profile.py --steps 10 --top 25 \
  --quantization int4 > "$OUT/prof_int4_1.json" 2> /tmp/prof_int4_1.err
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
