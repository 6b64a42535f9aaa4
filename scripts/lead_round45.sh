# Lead round 45 (session 11): round 44 found the cuBLASLt probe refusing (it asked for a 4-column
# product, which cuBLASLt does not run), so no layer took cuBLASLt. The probe fixed: the fp8 GPU
# tests (one now asserts the probe on Hopper) and the per-layer bench again.
#   DEADLINE_S=300 bash scripts/lead_round45.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== fp8 GPU tests" | tee -a "$LOG"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile \
  tests/gpu/test_fp8_blocks_gpu.py tests/gpu/test_fp8_matmul.py tests/gpu/test_quant_kernels.py \
  > "$OUT/fp8_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/fp8_tests.log" | tail -15 | tee -a "$LOG"
echo "== fp8 block bench ($(left) s left)" | tee -a "$LOG"
timeout 120 python3 scripts/fp8_block_bench.py --json "$OUT/fp8_block.json" \
  2>&1 | tee "$OUT/fp8_block.log" | tail -40 >> "$LOG"
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
