# Lead round 20 (issue 12, GPU) at main with t12f merged: the kernel and step-path tests of the
# changed paths (fp8 tiles to 64 rows, fp8 KV decode tile and the split rule, fused activation
# quantization), the batch-64 fp8 + fp8 KV step by kernel, W2 on all 256 requests in fp8 + fp8 KV
# and in bf16 (the ratio's denominator, same call).
#   DEADLINE_S=570 bash scripts/lead_round20.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== kernel tests" | tee -a "$LOG"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile \
  tests/gpu/test_fused_activation_quant.py tests/gpu/test_quant_kernels.py tests/gpu/test_fp8_matmul.py \
  tests/gpu/test_fp8_kv_cache.py tests/gpu/test_triton_attention.py --deselect \
  tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -12 | tee -a "$LOG"
echo "== step-path tests ($(left) s left)" | tee -a "$LOG"
step_path_tests 110
echo "== profile batch 64 fp8 + fp8 KV ($(left) s left)" | tee -a "$LOG"
timeout 90 python3 scripts/decode_kernel_profile.py --batch 64 --prompt-len 900 --steps 20 \
  --quantization fp8 --kv-cache-dtype fp8 --top 40 > "$OUT/prof64_fp8.json" 2> "$OUT/prof64_fp8.err"
head -c 400 "$OUT/prof64_fp8.json" | tee -a "$LOG"; echo | tee -a "$LOG"
for mode in fp8 bf16; do
  [ "$(left)" -gt 70 ] || { echo "skipped W2 $mode" | tee -a "$LOG"; continue; }
  echo "== W2 all 256, $mode ($(left) s left)" | tee -a "$LOG"
  opts=""; [ $mode = fp8 ] && opts="--quantization fp8 --kv-cache-dtype fp8"
  timeout $(( $(left) - 5 < 120 ? $(left) - 5 : 120 )) python3 -m ladle bench throughput \
    --workload W2 --runs 1 --no-busy --no-progress $opts --json "$OUT/w2_$mode.json" 2>&1 \
    | grep -E "tok/s|ITL|TTFT|start" | tee -a "$LOG"
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
