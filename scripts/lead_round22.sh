# Lead round 22 (issue 12, GPU) at main with t12f merged again: the changed kernels' tests, t12f's
# fused-quantization bench, the decode step by kernel at batch 256 (fp8 + fp8 KV, and bf16) and
# the int4 8B batch-1 step.
#   DEADLINE_S=570 bash scripts/lead_round22.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== tests" | tee -a "$LOG"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 tests/gpu/test_fp8_matmul.py \
  tests/gpu/test_fused_activation_quant_gpu.py tests/gpu/test_int4_decode.py \
  tests/gpu/test_fused_kernels.py > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -12 | tee -a "$LOG"
echo "== fused quant bench ($(left) s left)" | tee -a "$LOG"
timeout 60 python3 scripts/fused_quant_bench.py > "$OUT/fused_quant.txt" 2>&1; tail -12 "$OUT/fused_quant.txt" | tee -a "$LOG"
prof() {  # $1 name, rest: options
  [ "$(left)" -gt 60 ] || { echo "skipped profile $1" | tee -a "$LOG"; return; }
  local name=$1; shift
  echo "== profile $name ($(left) s left)" | tee -a "$LOG"
  timeout 100 python3 scripts/decode_kernel_profile.py --steps 10 --top 40 "$@" > "$OUT/prof_$name.json" 2> "$OUT/prof_$name.err"
  head -c 330 "$OUT/prof_$name.json" | tee -a "$LOG"; echo | tee -a "$LOG"
}
prof fp8_256 --batch 256 --prompt-len 600 --quantization fp8 --kv-cache-dtype fp8
prof bf16_256 --batch 256 --prompt-len 600
prof int4_1 --batch 1 --quantization int4
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
