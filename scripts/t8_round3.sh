#!/usr/bin/env bash
# t8's third GPU call: the fixed prefill-graph test and the fresh-prompt SDPA test, the prefill
# attention bench (one batched SDPA call for prompts of one length), and the prefix proof's
# caching-off server (the caching-on figure came from round 2). Run from .carry/t8.
set -uo pipefail
OUT=${OUT:-.device_out}
ROOT=$(cd ../.. && pwd)
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$ROOT"/.whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
LOG=$OUT/round3.log
echo "tree: $(cat REVISION 2>/dev/null)" | tee "$LOG"
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_prefill_graphs.py \
  tests/gpu/test_triton_attention.py::test_long_fresh_prompts_through_sdpa 2>&1 | tail -25 >> "$LOG"
tail -3 "$LOG"
echo "== fresh prefill attention" | tee -a "$LOG"
timeout 35 python3 scripts/fresh_prefill_bench.py --out "$OUT" 2>&1 | grep "^{" | tee -a "$LOG"
echo "== prefix proof, caching off" | tee -a "$LOG"
timeout 75 python3 scripts/prefix_ttft_proof.py --out /tmp/prefix --servers off --deadline-s 72 \
  2>&1 | tail -14 | tee -a "$LOG"
grep -h "graphs captured" /tmp/prefix/server_*.log | head -1 | tee -a "$LOG"
