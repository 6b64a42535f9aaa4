# Lead round 43 (session 11): block-scaled fp8. The GPU tests of the fp8 kernels and layers
# (new: test_fp8_blocks_gpu.py; changed kernels: fp8_matmul, per_token_quant), the per-layer
# bench of block vs per-channel fp8 vs bf16 (scripts/fp8_block_bench.py), and one W2 fp8 + fp8
# KV run against session 10's figure (the per-channel kernel gained the grouped branch).
#   DEADLINE_S=580 bash scripts/lead_round43.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== fp8 GPU tests" | tee -a "$LOG"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile \
  tests/gpu/test_fp8_blocks_gpu.py tests/gpu/test_fp8_matmul.py tests/gpu/test_quant_kernels.py \
  tests/gpu/test_fused_activation_quant_gpu.py > "$OUT/fp8_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/fp8_tests.log" | tail -15 | tee -a "$LOG"
echo "== fp8 block bench ($(left) s left)" | tee -a "$LOG"
timeout $(( $(left) - 130 )) python3 scripts/fp8_block_bench.py --json "$OUT/fp8_block.json" \
  2>&1 | tee "$OUT/fp8_block.log" | tail -40 >> "$LOG"
w2_run fp8 --quantization fp8 --kv-cache-dtype fp8
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
