#!/usr/bin/env bash
# t8's second GPU call: prefill graphs. GPU tests of the step path (graphs, overlap, parity, the
# new prefill-graph test), then W3 (0.6B), the prefix-caching TTFT proof, W3-8b. Run from
# .carry/t8 on the device; the server stack's wheels come from the tree root's .whl.
set -uo pipefail
OUT=${OUT:-.device_out}
ROOT=$(cd ../.. && pwd)
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$ROOT"/.whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
LOG=$OUT/round2.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
git_rev=$(cat REVISION 2>/dev/null); echo "tree: ${git_rev:-?}" | tee -a "$LOG"
timeout "${TEST_S:-95}" python3 -m pytest -q -p no:cacheprovider -rfs \
  tests/gpu/test_prefill_graphs.py \
  tests/gpu/test_triton_attention.py::test_long_fresh_prompts_through_sdpa \
  tests/gpu/test_cuda_graphs.py tests/gpu/test_overlap_gpu.py \
  tests/gpu/test_no_compile_while_serving.py tests/gpu/test_gpu_parity.py 2>&1 | tail -25 >> "$LOG"; tail -3 "$LOG"
bench() { name=$1; limit=$2; shift 2; echo "== $name" | tee -a "$LOG"
  timeout "$limit" python3 -m ladle bench "$@" --no-progress --json "$OUT/$name.json" \
    > "/tmp/$name.log" 2>&1; grep -E "graphs captured" "/tmp/$name.log" >> "$LOG"
  grep -v Warning "/tmp/$name.log" | tail -16 >> "$LOG"; tail -16 "$LOG" | grep -E "TTFT|ITL|start|tok/s"; }
bench w3 55 latency --workload W3 --runs 3
echo "== prefix proof" | tee -a "$LOG"
timeout 95 python3 scripts/prefix_ttft_proof.py --out /tmp/prefix --deadline-s 90 2>&1 \
  | tail -12 | tee -a "$LOG"
cp /tmp/prefix/prefix_proof.json "$OUT/" 2>/dev/null
grep -h "prefill graphs\|graphs captured" /tmp/prefix/server_*.log | head -2 | tee -a "$LOG"
echo "== fresh prefill attention" | tee -a "$LOG"
timeout 35 python3 scripts/fresh_prefill_bench.py --out "$OUT" 2>&1 | grep -v Warn | tee -a "$LOG"
bench w3_8b 70 latency --workload W3-8b --runs 2 --no-busy
