# Lead round 28 (session 8, call 3): every GPU test file (split-KV merged in the last split,
# every partial loaded at once; PDL for the decode GEMVs, fp8 64-row tiles to 128 rows for narrow projections), then W3-8b int4
# with and without PDL, W3 0.6B, then three W2 fp8 / bf16 pairs interleaved, then the int4 step profile.
#   DEADLINE_S=575 bash scripts/lead_round28.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
gpu_gate tests/gpu/test_triton_attention.py tests/gpu/test_int4_decode.py \
  tests/gpu/test_fp8_matmul.py tests/gpu/test_gemv.py
all_gpu_tests
latency w3_8b_int4_pdl W3-8b --quantization int4
LADLE_PDL=0 latency w3_8b_int4_nopdl W3-8b --quantization int4
latency w3_bf16_pdl W3
for run in a b c; do
  w2_run fp8_$run --quantization fp8 --kv-cache-dtype fp8
  w2_run bf16_$run
done
echo "== profile int4 batch 1 ($(left) s left)" | tee -a "$LOG"
[ "$(left)" -gt 40 ] && timeout $(( $(left) - 5 )) python3 scripts/decode_kernel_profile.py --steps 10 --top 25 \
  --quantization int4 > /tmp/prof_int4_1.json 2> /tmp/prof_int4_1.err
python3 -c "
import json; d = json.load(open('/tmp/prof_int4_1.json'))
print({k: v for k, v in d.items() if k != 'kernels'})
for k in d['kernels'][:10]: print(round(k['us_per_step'], 1), k['per_step'], k['us_median'], k['kernel'][:50])
" 2>&1 | tee -a "$LOG"
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
