# Lead round 18 (issue 12, GPU): the 64-row fp8 tiles' error with a bound on wgmma's reduced-
# precision accumulation; the fp8 KV decode attention over stages / warps / splits; the int4
# GEMV over launch configurations read from HBM; the int4 8B batch-1 step by kernel.
#   DEADLINE_S=560 bash scripts/lead_round18.sh     (repo root of the device copy, .whl carried)
source scripts/lead_round_env.sh
echo "== fp8 tiles" | tee -a "$LOG"
timeout 170 python3 scripts/fp8_tile_precision_probe.py > "$OUT/fp8_tiles.jsonl" 2> "$OUT/fp8_tiles.err"
tail -2 "$OUT/fp8_tiles.err" | tee -a "$LOG"
echo "== fp8 kv sweep ($(left) s left)" | tee -a "$LOG"
timeout 150 python3 scripts/fp8_kv_decode_sweep.py --wide > "$OUT/fp8_kv.jsonl" 2> "$OUT/fp8_kv.err"
tail -2 "$OUT/fp8_kv.err" | tee -a "$LOG"
echo "== int4 gemv sweep ($(left) s left)" | tee -a "$LOG"
timeout 150 python3 scripts/int4_gemv_sweep.py > "$OUT/int4_gemv.jsonl" 2> "$OUT/int4_gemv.err"
tail -2 "$OUT/int4_gemv.err" | tee -a "$LOG"
if [ "$(left)" -gt 100 ]; then
  echo "== int4 8B batch-1 profile ($(left) s left)" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 scripts/decode_kernel_profile.py --batch 1 --steps 20 \
    --quantization int4 > "$OUT/int4_profile.json" 2> "$OUT/int4_profile.err"
  tail -2 "$OUT/int4_profile.err" | tee -a "$LOG"
fi
echo "done ($(left) s left)" | tee -a "$LOG"
