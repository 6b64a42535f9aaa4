#!/usr/bin/env bash
# Pipeline parallelism on 2 GPUs in one call (about 5 minutes): the 2-GPU PP parity test, then
# W2 (8B shape, offline throughput) with -pp 2 (a micro-batch per stage in flight), -tp 2 and
# one GPU, each with --profile-ranks: every rank's wall, busy and computing share of a step
# shows whether a stage idles. Results: $OUT/pp_round.txt (summary) and $OUT/pp_round.log.
#   bash scripts/pp_round.sh        # nvidia-h200-x2 or nvidia-h100-x2; carry .whl (pyzmq, msgspec)
set -uo pipefail
OUT=${OUT:-.device_out}
WORKLOAD=${WORKLOAD:-W2}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-95}   # per bench run: three runs and the test stay near 5 min
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
SUMMARY=$OUT/pp_round.txt
LOG=$OUT/pp_round.log
: > "$SUMMARY"; : > "$LOG"
{ date -u; nvidia-smi --query-gpu=name --format=csv,noheader; } | tee -a "$SUMMARY"
timeout 75 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_pipeline_parallel_gpu.py \
  >> "$LOG" 2>&1
echo "parity test: $(tail -1 "$LOG")" | tee -a "$SUMMARY"
for layout in "-pp 2" "-tp 2" "-tp 1"; do
  name="$WORKLOAD ${layout// /}"
  json=/tmp/pp_round_${layout// /}.json
  echo "=== $name" >> "$LOG"
  # shellcheck disable=SC2086  # the layout is two words on purpose
  timeout "$RUN_TIMEOUT_S" python3 -m ladle bench throughput --workload "$WORKLOAD" --runs 1 \
    --no-busy --no-progress --profile-ranks $layout --json "$json" >> "$LOG" 2>&1
  code=$?
  python3 scripts/bench_json_summary.py "$json" "$name" | tee -a "$SUMMARY" \
    || echo "$name: failed (exit $code), see pp_round.log" | tee -a "$SUMMARY"
done
