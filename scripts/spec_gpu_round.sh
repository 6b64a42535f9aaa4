#!/usr/bin/env bash
# Model drafts on one GPU (issue 33), in one device call: the speculative GPU tests (n-gram and
# model drafts, graphs on), then W3-8b at batch 1 with k = 4 and synthetic acceptance 0.8:
# a random EAGLE-3 head of the 8B's shape ("model": "random", dummy weights only) and a
# llama-3.2-1b-shaped draft model (same vocabulary), each against the same engine without
# speculation in the same process (ladle bench interleaves the runs; the drafter is set aside
# for the baseline runs). Run from the repo root of the device copy; everything lands under
# $OUT, the summary in $OUT/spec_gpu.log.
#   DEADLINE_S=560 bash scripts/spec_gpu_round.sh      # about 8 minutes
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-560}
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
LOG=$OUT/spec_gpu.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"

bench() {  # name, then the bench's arguments; the table to the log, the JSON under $OUT
  local name=$1; shift
  [ "$(left)" -gt 90 ] || { echo "skipped $name: out of time" | tee -a "$LOG"; return; }
  echo "== $name" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 -m ladle bench latency "$@" --json "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  grep -v -i warning "$OUT/$name.log" | grep -E "speculat|acceptance|ms/token|speed-up|drafting|drafter|Error|error" \
    | tail -14 | tee -a "$LOG"
}

bench w3_8b_eagle3_random --workload W3-8b --runs 3 --synthetic-acceptance 0.8 \
  --speculative-config '{"method": "eagle3", "model": "random", "num_speculative_tokens": 4, "adaptive": false}'
bench w3_8b_draft_1b --workload W3-8b --runs 3 --synthetic-acceptance 0.8 \
  --speculative-config '{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 4, "adaptive": false}'
bench w3_8b_ngram --workload W3-8b --runs 3 --synthetic-acceptance 0.8 \
  --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "adaptive": false}'

echo "== tests/gpu/test_model_drafts_gpu.py tests/gpu/test_spec_decode_gpu.py" | tee -a "$LOG"
if [ "$(left)" -gt 40 ]; then
  timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -rfs -s --durations=8 \
    tests/gpu/test_model_drafts_gpu.py tests/gpu/test_spec_decode_gpu.py \
    > "$OUT/spec_gpu_tests.log" 2>&1
  grep -E "^\[|passed|failed|FAILED|Error" "$OUT/spec_gpu_tests.log" | tail -30 | tee -a "$LOG"
else
  echo "skipped the tests: out of time" | tee -a "$LOG"
fi
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
