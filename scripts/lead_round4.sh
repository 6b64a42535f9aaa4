#!/usr/bin/env bash
# The lead's third H100 call of 2026-11-23: the two re-fixed GPU tests, the 8B start-up from an
# empty Triton cache, and the prefix-caching TTFT proof on the 8B shape at PREFIX_RATE.
# Run from the repo root of the device copy, carrying .whl and .carry/tok.
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_split_launch_gpu.py \
  "tests/gpu/test_quant_kernels.py::test_per_token_quant_matches_reference" > "$OUT/tests.log" 2>&1
grep -E "^E  |passed|failed" "$OUT/tests.log" | head -20 | tee -a "$LOG"
echo "== 8B start-up with graphs, empty Triton cache" | tee -a "$LOG"
TRITON_CACHE_DIR=/tmp/cold_cache timeout 90 python3 scripts/startup_profile.py llama-3.1-8b \
  --load-format dummy --json "$OUT/startup_8b.json" 2>&1 | grep -v Warn | tail -14 | tee -a "$LOG"
echo "== prefix TTFT, 8B, caching on vs off, ${PREFIX_RATE:-24}/s" | tee -a "$LOG"
timeout 200 python3 scripts/prefix_ttft_proof.py --out /tmp/prefix --pair caching \
  --model llama-3.1-8b --rate "${PREFIX_RATE:-24}" --num 96 --warmup-num 16 --max-num-seqs 64 \
  --deadline-s 190 > /tmp/prefix.log 2>&1
grep -E "TTFT|ttft|ratio|hit_rate" /tmp/prefix.log | tail -14 | tee -a "$LOG"
cp /tmp/prefix/prefix_proof.json "$OUT/" 2>/dev/null
tar czf "$OUT/prefix.tgz" -C /tmp prefix 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
