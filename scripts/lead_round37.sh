# Lead round 37 (session 9, the closing call): a gate on the kernels whose split-K / split-KV
# ticket moved into split_counters.arrives_last (int4 decode, attention, fp8 KV), then three W2
# fp8+fp8 KV / bf16 pairs interleaved and W3 (0.6B) twice at the final code.
#   DEADLINE_S=585 bash scripts/lead_round37.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
GATE_TIMEOUT_S=200 gpu_gate tests/gpu/test_int4_decode.py tests/gpu/test_triton_attention.py \
  tests/gpu/test_fp8_kv_cache.py
W2_JSON_DIR=/tmp
for run in a b c; do
  w2_run fp8_$run --quantization fp8 --kv-cache-dtype fp8
  w2_run bf16_$run
done
latency w3_a W3
latency w3_b W3
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
