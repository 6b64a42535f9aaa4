#!/usr/bin/env bash
# The lead's second H100 call of 2026-11-23 (afternoon): the two re-fixed GPU tests, W3 on both
# shapes, W1, the full W2 with the HF peer on its first 64 requests, the 8B start-up from an
# empty Triton cache, and the prefix-caching TTFT proof on the 8B shape under load.
# Run from the repo root of the device copy, carrying .whl and .carry/tok.
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 90 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_split_launch_gpu.py \
  "tests/gpu/test_quant_kernels.py::test_per_token_quant_matches_reference" 2>&1 | tail -30 \
  > "$OUT/tests.log"; tail -4 "$OUT/tests.log" | tee -a "$LOG"
bench() { name=$1; limit=$2; shift 2; [ "$(left)" -gt "$limit" ] || { echo "skip $name" | tee -a "$LOG"; return; }
  echo "== $name" | tee -a "$LOG"
  timeout "$limit" python3 -m ladle bench "$@" --no-progress --json "$OUT/$name.json" \
    > "/tmp/$name.log" 2>&1; grep -v Warning "/tmp/$name.log" | tail -17 | tee -a "$LOG"; }
echo "== 8B start-up with graphs, empty Triton cache" | tee -a "$LOG"
TRITON_CACHE_DIR=/tmp/cold_cache timeout 90 python3 scripts/startup_profile.py llama-3.1-8b \
  --load-format dummy --json "$OUT/startup_8b.json" 2>&1 | tail -12 | tee -a "$LOG"
bench w3_06b 60 latency --workload W3 --runs 3
bench w3_8b 70 latency --workload W3-8b --runs 3
bench w2 130 throughput --workload W2 --runs 1 --no-busy
bench w1 90 throughput --workload W1 --runs 2
if [ "$(left)" -gt 110 ]; then
  echo "== prefix TTFT, 8B, caching on vs off" | tee -a "$LOG"
  timeout $(( $(left) - 5 )) python3 scripts/prefix_ttft_proof.py --out "$OUT/prefix" \
    --pair caching --model llama-3.1-8b --rate "${PREFIX_RATE:-16}" --num 64 --warmup-num 16 \
    --max-num-seqs 64 --deadline-s $(( $(left) - 10 )) > /tmp/prefix.log 2>&1
  tail -20 /tmp/prefix.log | tee -a "$LOG"
fi
bench w2_64_peer $(( $(left) - 5 )) throughput --workload W2 --num-requests 64 --runs 1 --no-busy \
  --peer hf
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
