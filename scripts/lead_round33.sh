# Lead round 33 (session 9, call 1): a gate on the kernel tests and the model parity (the runner's
# logits now stay bf16), then two probes: decode attention with the next tile prefetched into
# registers (fp8_kv_decode_sweep.py --prefetch) and per-token quantization by reciprocal
# (act_quant_probe.py).
#   DEADLINE_S=585 bash scripts/lead_round33.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
gpu_gate tests/gpu/test_triton_attention.py tests/gpu/test_fp8_matmul.py \
  tests/gpu/test_fused_kernels.py tests/gpu/test_gpu_parity.py tests/gpu/test_fp8_kv_cache.py
echo "== act_quant_probe ($(left) s left)" | tee -a "$LOG"
timeout 120 python3 scripts/act_quant_probe.py > "$OUT/act_quant.jsonl" 2> "$OUT/act_quant.err"
tail -2 "$OUT/act_quant.err" | tee -a "$LOG"
echo "== fp8_kv_decode_sweep --prefetch ($(left) s left)" | tee -a "$LOG"
timeout $(( $(left) - 10 )) python3 scripts/fp8_kv_decode_sweep.py --prefetch > "$OUT/attn.jsonl" 2> "$OUT/attn.err"
tail -2 "$OUT/attn.err" | tee -a "$LOG"
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
