# Lead round 41 (session 10): every GPU test after the CPU runtime layouts of the quant methods
# (int4/int8/fp8 finalize), the compressed-tensors formats (test_quant_kernels' checkpoint round
# trips) and tests/gpu/conftest.py (cached blocks handed back after each test); then a W2
# fp8+fp8 KV / bf16 pair and W3-8b int4, to show the GPU paths did not move.
#   DEADLINE_S=585 bash scripts/lead_round41.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 300
W2_JSON_DIR=/tmp
w2_run fp8_a --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_a
latency w3_8b_int4 W3-8b --quantization int4
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
