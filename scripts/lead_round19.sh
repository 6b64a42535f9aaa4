# Lead round 19 (issue 12, GPU): the one-row int4 kernel (whole K per program) against the
# split-K GEMV, read from HBM; decode attention over tiles / warps / stages / splits for both
# caches on W2's, W3's and the 0.6B's shapes; the fp8 matmul tests with 64-row precise tiles and
# the int4 kernel tests.
#   DEADLINE_S=560 bash scripts/lead_round19.sh     (repo root of the device copy, .whl carried)
source scripts/lead_round_env.sh
echo "== kernel tests" | tee -a "$LOG"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 tests/gpu/test_fp8_matmul.py \
  tests/gpu/test_int4_decode.py > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -12 | tee -a "$LOG"
echo "== int4 row sweep ($(left) s left)" | tee -a "$LOG"
timeout 150 python3 scripts/int4_gemv_sweep.py > "$OUT/int4_row.jsonl" 2> "$OUT/int4_row.err"
tail -2 "$OUT/int4_row.err" | tee -a "$LOG"
echo "== attention sweep ($(left) s left)" | tee -a "$LOG"
timeout $(( $(left) - 10 )) python3 scripts/fp8_kv_decode_sweep.py --wide > "$OUT/attn.jsonl" 2> "$OUT/attn.err"
tail -2 "$OUT/attn.err" | tee -a "$LOG"
echo "done ($(left) s left)" | tee -a "$LOG"
