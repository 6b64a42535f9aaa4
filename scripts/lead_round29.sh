# Lead round 29 (session 8, call 6): PDL through the whole decode chain. A gate on the kernel
# tests, every GPU test file, W3-8b int4 and W3 0.6B with and without PDL, three W2 fp8 / bf16
# pairs interleaved, then W1 as the bf16 regression check.
#   DEADLINE_S=585 bash scripts/lead_round29.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
gpu_gate tests/gpu/test_triton_attention.py tests/gpu/test_int4_decode.py \
  tests/gpu/test_fp8_matmul.py tests/gpu/test_gemv.py tests/gpu/test_fused_kernels.py
all_gpu_tests
latency w3_8b_int4_pdl W3-8b --quantization int4
LADLE_PDL=0 latency w3_8b_int4_nopdl W3-8b --quantization int4
latency w3_bf16_pdl W3
LADLE_PDL=0 latency w3_bf16_nopdl W3
for run in a b c; do
  w2_run fp8_$run --quantization fp8 --kv-cache-dtype fp8
  w2_run bf16_$run
done
if [ "$(left)" -gt 80 ]; then
  echo "== W1 ($(left) s left)" | tee -a "$LOG"
  timeout $(( $(left) - 5 )) python3 -m ladle bench throughput --workload W1 --runs 2 --no-busy \
    --no-progress --json /tmp/w1.json 2>&1 | grep -E "tok/s \(|ITL" | tee -a "$LOG"
fi
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
