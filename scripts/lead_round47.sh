# Lead round 47 (session 11): cuBLASLt only where K/128 is a multiple of 4 (torch 2.11 refuses
# other weight-scale layouts, round 46), Triton tiles at <= 16 rows below 8192 inputs;
# then the fp8 GPU tests and the per-layer bench with both GEMMs forced beside the choice.
#   DEADLINE_S=300 bash scripts/lead_round47.sh     (carry .whl and .carry/tok)
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
