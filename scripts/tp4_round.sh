#!/usr/bin/env bash
# Issue 34 on four GPUs of one host (nvidia-h200-x4 / nvidia-h100-x4), in calls of under 10
# minutes each, most important first within DEADLINE_S. Carry .whl (pyzmq, msgspec) and, for
# the Ray step, .whl_ray (scripts/slim_ray_wheel.py).
#   PHASE=70b bash scripts/tp4_round.sh   # 70B: start-up with an empty Triton cache at TP=4,
#        W3-70b TP=4, W2-70b TP=4 and TP=2 x PP=2 (each rank's collective time from
#        --profile-ranks), then W2-70b TP=2 in bf16 (GPUs 0,1) beside fp8 weights (GPUs 2,3)
#   PHASE=w2 bash scripts/tp4_round.sh    # the W2-70b runs of PHASE=70b, TP=4 profiled in
#        decode and in prefill, after the symmetric-memory all-reduce tests
#   PHASE=w2clean bash scripts/tp4_round.sh  # W2-70b TP=4 and TP=2 x PP=2 alternated, twice,
#        without the profiler
#   PHASE=pp bash scripts/tp4_round.sh    # W2-70b at TP=2 x PP=2 with --profile-ranks, then the
#        pipeline parity tests (-pp 2 and -tp 2 -pp 2, graphs on and off)
#   PHASE=8b bash scripts/tp4_round.sh    # the 4-GPU parity tests (-tp 2/4, -pp 2, -tp 2 -pp 2),
#        W3-8b at TP=4 (one-shot all-reduce and NCCL alone), the Ray backend at TP=4, then
#        W3-8b at TP=1 and TP=2 side by side on other GPUs
# $OUT gets summary.log and results.tgz (every log and JSON; refreshed after each step, so a
# call stopped at its limit still brings back what ran).
set -uo pipefail
OUT=${OUT:-.device_out}
PHASE=${PHASE:-70b}
DEADLINE_S=${DEADLINE_S:-560}
R=/tmp/tp4_round
mkdir -p "$OUT" "$R"
SUMMARY=$OUT/summary.log
SECONDS=0
for dir in .whl .whl_ray; do
  if ls $dir/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site $dir/*.whl || exit 1
  fi
done
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >> "$SUMMARY"
nvidia-smi topo -m > "$R/topology.txt" 2>&1

pack() { tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null; }

left() { echo $((DEADLINE_S - SECONDS)); }

# summarize NAME: one line of the bench JSON's figures and one per rank profile.
summarize() {
  python3 scripts/bench_json_summary.py "$R/$1.json" "$1" \
    || { echo "$1: failed, see $1.log"; tail -4 "$R/$1.log"; }
}

# bench NAME TIMEOUT_S GPUS KIND ARGS...: one `ladle bench KIND` on the GPUs named, if the
# deadline leaves TIMEOUT_S for it.
bench() {
  local name=$1 limit=$2 gpus=$3 kind=$4; shift 4
  if [ "$(left)" -lt "$limit" ]; then echo "$name: skipped, $(left) s left" >> "$SUMMARY"; return; fi
  CUDA_VISIBLE_DEVICES=$gpus timeout "$limit" python3 -m ladle bench "$kind" --no-progress \
    --json "$R/$name.json" "$@" > "$R/$name.log" 2>&1
  { summarize "$name"; grep -h "all-reduce:" "$R/$name.log" | head -1; } >> "$SUMMARY"
  echo "  ($name ended at ${SECONDS} s)" >> "$SUMMARY"
  # --profile-ranks' per-rank summaries (kernels by GPU time, idle gaps) and rank 0's trace.
  for dir in $(grep -oh "/tmp/ladle-rank-profiles-[A-Za-z0-9_]*" "$R/$name.log" | sort -u); do
    mkdir -p "$R/$name-profiles" && cp "$dir"/rank*.json "$R/$name-profiles/" 2>/dev/null
    rm -f "$R/$name-profiles"/rank[1-9]*.trace.json
  done
  pack
}

tests() {  # tests NAME TIMEOUT_S GPUS FILES...
  local name=$1 limit=$2 gpus=$3; shift 3
  if [ "$(left)" -lt "$limit" ]; then echo "$name: skipped, $(left) s left" >> "$SUMMARY"; return; fi
  CUDA_VISIBLE_DEVICES=$gpus timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rfs \
    "$@" > "$R/$name.log" 2>&1
  echo "$name: $(tail -1 "$R/$name.log") (ended at ${SECONDS} s)" >> "$SUMMARY"
  pack
}

# The W2-70b runs, each rank profiling its timed steps 100-150: TP=4 (with `prefill`, also a
# TP=4 run profiling steps 18-32), TP=2 x PP=2, then TP=2 in bf16 (GPUs 0,1) beside fp8 weights
# (GPUs 2,3): two runs side by side on disjoint GPU pairs (the host has cores to spare for both).
w2_profiled() {
  bench W2-70b-tp4 150 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 4 --profile-ranks
  if [ "${1:-}" = prefill ]; then
    bench W2-70b-tp4-prefill 150 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 4 \
      --profile-ranks 18:14
  fi
  bench W2-70b-tp2pp2 150 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 2 -pp 2 \
    --profile-ranks
  bench W2-70b-tp2 180 0,1 throughput --workload W2-70b --runs 1 --no-busy -tp 2 --profile-ranks &
  bench W2-70b-tp2-fp8 180 2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 2 \
    --quantization fp8 --profile-ranks &
  wait
}

if [ "$PHASE" = 70b ]; then
  if [ "$(left)" -gt 200 ]; then
    CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 200 python3 -m ladle bench startup llama-3.1-70b \
      --triton-cache cold --runs 1 --engine-args "-tp 4" --json "$R/startup-70b-tp4-cold.json" \
      > "$R/startup-70b-tp4-cold.log" 2>&1
    { summarize startup-70b-tp4-cold; grep -h "process start\|phases" "$R/startup-70b-tp4-cold.log"; } >> "$SUMMARY"
    pack
  fi
  bench W3-70b-tp4 120 0,1,2,3 latency --workload W3-70b --runs 3 --no-busy -tp 4 --profile-ranks 20:40
  w2_profiled
elif [ "$PHASE" = w2 ]; then
  # The start-up and W3-70b targets are met: the symmetric-memory all-reduce tests and W3-8b at
  # TP=4 first, then the W2-70b runs, TP=4 also profiled in its prefill steps (18-32, after the
  # warm-up's ~17).
  tests tests-all-reduce 120 0,1,2,3 tests/gpu/test_fast_all_reduce_gpu.py -s --timeout=110
  bench W3-8b-tp4 90 0,1,2,3 latency --workload W3-8b --runs 3 --no-busy -tp 4
  w2_profiled prefill
elif [ "$PHASE" = w2clean ]; then
  # W2-70b without the profiler (a profiled window of decode steps costs a run ~15%): TP=4 and
  # TP=2 x PP=2 alternated, after the symmetric-memory all-reduce tests.
  tests tests-all-reduce 120 0,1,2,3 tests/gpu/test_fast_all_reduce_gpu.py -s --timeout=110
  bench W2-70b-tp4-a 120 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 4
  bench W2-70b-tp2pp2-a 120 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 2 -pp 2
  bench W2-70b-tp4-b 120 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 4
  bench W2-70b-tp2pp2-b 120 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 2 -pp 2
elif [ "$PHASE" = pp ]; then
  bench W2-70b-tp2pp2 200 0,1,2,3 throughput --workload W2-70b --runs 1 --no-busy -tp 2 -pp 2 \
    --profile-ranks
  tests tests-pp 150 0,1,2,3 tests/gpu/test_pipeline_parallel_gpu.py --timeout=180
else
  tests tests-4gpu 200 0,1,2,3 tests/gpu/test_tensor_parallel_gpu.py \
    tests/gpu/test_pipeline_parallel_gpu.py --timeout=180
  bench W3-8b-tp4 90 0,1,2,3 latency --workload W3-8b --runs 3 --no-busy -tp 4
  bench W3-8b-tp4-nccl 90 0,1,2,3 latency --workload W3-8b --runs 3 --no-busy -tp 4 \
    --disable-custom-all-reduce
  bench W3-8b-tp4-ray 120 0,1,2,3 latency --workload W3-8b --runs 3 --no-busy -tp 4 \
    --distributed-executor-backend ray
  bench W3-8b-tp1 90 0 latency --workload W3-8b --runs 3 --no-busy &
  bench W3-8b-tp2 90 2,3 latency --workload W3-8b --runs 3 --no-busy -tp 2 &
  wait
fi
echo "end at ${SECONDS} s" >> "$SUMMARY"
pack
cat "$SUMMARY"
