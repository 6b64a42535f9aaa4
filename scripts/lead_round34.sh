# Lead round 34 (session 9, call 2): a gate on the quantization kernels (SiLU-and-mul quantizing
# down's input again, per-token codes by reciprocal), W2 fp8+fp8 KV / bf16 pairs interleaved, and
# the KV cache layout probe (scripts/kv_layout_probe.py) between the first and second pair.
#   DEADLINE_S=585 bash scripts/lead_round34.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
gpu_gate tests/gpu/test_fused_activation_quant_gpu.py tests/gpu/test_quant_kernels.py \
  tests/gpu/test_fp8_matmul.py tests/gpu/test_fused_kernels.py
W2_JSON_DIR=/tmp
w2_run fp8_a --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_a
echo "== kv_layout_probe ($(left) s left)" | tee -a "$LOG"
timeout 170 python3 scripts/kv_layout_probe.py > "$OUT/layout.jsonl" 2> "$OUT/layout.err"
tail -2 "$OUT/layout.err" | tee -a "$LOG"
for run in b c; do
  w2_run fp8_$run --quantization fp8 --kv-cache-dtype fp8
  w2_run bf16_$run
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
