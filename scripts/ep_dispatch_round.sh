#!/usr/bin/env bash
# Expert parallelism's token dispatch on 2 GPUs in one call (issue 35 item 4): the 2-GPU parity
# tests (tests/gpu/test_expert_dispatch_gpu.py), the layer-level
# timing of each form at 1..8192 tokens (scripts/ep_dispatch_bench.py, Qwen3-30B-A3B shape),
# then `ladle bench` W3-30b-a3b and W1-30b-a3b under `-tp 2 --enable-expert-parallel` with each
# dispatch forced and with auto (whose start-up table is grepped from its log), most important
# first while DEADLINE_S lasts. Results in $OUT; the summary in $OUT/ep_dispatch_round.log.
#   DEADLINE_S=570 bash scripts/ep_dispatch_round.sh      # nvidia-h200-x2; carry .whl
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-570}
DISPATCHES=${DISPATCHES:-auto allreduce alltoall}
WORKLOADS=${WORKLOADS:-W3-30b-a3b W1-30b-a3b}
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-/tmp/ladle_ep_cache}  # tiles tuned once, then read
LOG=$OUT/ep_dispatch_round.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
echo "== tests/gpu/test_expert_dispatch_gpu.py" | tee -a "$LOG"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_expert_dispatch_gpu.py \
  > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log" | tee -a "$LOG"
echo "== layer: scripts/ep_dispatch_bench.py" | tee -a "$LOG"
OUT=$OUT timeout 120 python3 scripts/ep_dispatch_bench.py 2>&1 | grep -v Warning | tee -a "$LOG"
for workload in $WORKLOADS; do
  kind=latency; extra=(--max-num-seqs 16 --runs 3)
  case $workload in W1*) kind=throughput; extra=(--runs 1) ;; esac
  for dispatch in $DISPATCHES; do
    [ "$(left)" -gt 60 ] || { echo "== skipped $workload $dispatch (time)" | tee -a "$LOG"; continue; }
    name="$workload-ep2-$dispatch"
    echo "== $name ($(left) s left)" | tee -a "$LOG"
    timeout $(( $(left) - 5 )) python3 -m ladle bench "$kind" --workload "$workload" \
      "${extra[@]}" -tp 2 --enable-expert-parallel --expert-parallel-dispatch "$dispatch" \
      --no-busy --no-progress --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    echo "exit $?" >> "$OUT/$name.log"
    grep -E "expert-parallel dispatch|CUDA graphs off|Error" "$OUT/$name.log" | cut -c1-600 \
      | tee -a "$LOG"
    grep -E "tok/s|ITL|TTFT|floor|exit" "$OUT/$name.log" | tee -a "$LOG"
  done
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
