#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU device, in one call: the 2-GPU tests, then W3 (batch 1) on
# the 8B shape at each TP size (one GPU first, for the same-call baseline). Results in $OUT.
#   TP_SIZES="1 2" bash scripts/tp_round.sh          # nvidia-h100-x2; carry .whl (pyzmq, msgspec)
#   TP_SIZES="1 2 4" WORKLOADS="W3-8b W1" bash scripts/tp_round.sh   # nvidia-h100-x4
#   TP_SIZES="4" WORKLOADS="W3-70b W2-70b" bash scripts/tp_round.sh  # the 70B targets
set -uo pipefail
OUT=${OUT:-.device_out}
TP_SIZES=${TP_SIZES:-1 2}
WORKLOADS=${WORKLOADS:-W3-8b}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
LOG=$OUT/tp_round.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider -rfs --timeout=300 tests/gpu/test_tensor_parallel_gpu.py \
  > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log" | tee -a "$LOG"
for workload in $WORKLOADS; do
  kind=latency; runs=3
  case $workload in W1*|W2*) kind=throughput; runs=1 ;; esac
  for tp in $TP_SIZES; do
   # With several ranks also NCCL alone (--disable-custom-all-reduce): the one-shot all-reduce's
   # gain in the same call; its start-up choice is the "[ladle] all-reduce:" log line.
   variants="default"; [ "$tp" -gt 1 ] && variants="default nccl"
   for variant in $variants; do
    name="$workload-tp$tp"; extra=()
    [ "$variant" = nccl ] && { name="$name-nccl"; extra=(--disable-custom-all-reduce); }
    python3 -m ladle bench "$kind" --workload "$workload" --runs "$runs" --no-busy --no-progress \
      -tp "$tp" "${extra[@]}" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    grep -h "all-reduce:" "$OUT/$name.log" | head -1 | tee -a "$LOG"
    python3 scripts/bench_json_summary.py "$OUT/$name.json" "$name" | tee -a "$LOG" \
      || tail -3 "$OUT/$name.log" | tee -a "$LOG"
   done
  done
done
