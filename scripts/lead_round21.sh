# Lead round 21 (issue 12, GPU): fast against precise fp8 accumulation (cuBLASLt and the 64-row
# tiles), the fp8 tests both ways, W2 fp8 + fp8 KV with fast accumulation (the default) and
# precise, bf16 between them; int4 W3-8b.
#   DEADLINE_S=570 bash scripts/lead_round21.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
echo "== fp8 tests" | tee -a "$LOG"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 tests/gpu/test_fp8_matmul.py \
  tests/gpu/test_quant_kernels.py tests/gpu/test_fused_activation_quant.py > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -12 | tee -a "$LOG"
echo "== fast accum probe ($(left) s left)" | tee -a "$LOG"
timeout 90 python3 scripts/fp8_fast_accum_probe.py > "$OUT/fast_accum.jsonl" 2> "$OUT/fast_accum.err"
tail -2 "$OUT/fast_accum.err" | tee -a "$LOG"
w2() {  # $1 name, $2 LADLE_FP8_FAST_ACCUM, rest: options
  [ "$(left)" -gt 70 ] || { echo "skipped W2 $1" | tee -a "$LOG"; return; }
  local name=$1 fast=$2; shift 2
  echo "== W2 all 256, $name ($(left) s left)" | tee -a "$LOG"
  LADLE_FP8_FAST_ACCUM=$fast timeout $(( $(left) - 5 < 120 ? $(left) - 5 : 120 )) python3 -m ladle bench \
    throughput --workload W2 --runs 1 --no-busy --no-progress "$@" --json "$OUT/w2_$name.json" 2>&1 \
    | grep -E "tok/s|ITL|TTFT|start" | tee -a "$LOG"
}
w2 fp8_fast 1 --quantization fp8 --kv-cache-dtype fp8
w2 bf16 1
w2 fp8_precise 0 --quantization fp8 --kv-cache-dtype fp8
[ "$(left)" -gt 80 ] && { echo "== W3-8b int4 ($(left) s left)" | tee -a "$LOG"; timeout $(( $(left) - 5 )) python3 -m ladle \
  bench latency --workload W3-8b --runs 3 --no-busy --no-progress --quantization int4 \
  --json "$OUT/w3_int4.json" 2>&1 | grep -E "ms|tok/s|start" | tee -a "$LOG"; }
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
