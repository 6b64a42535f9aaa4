#!/usr/bin/env bash
# The KV cache's host tier on one GPU (issue 36), in one device call: its GPU tests (copies for
# bf16 and fp8, graphs on and off, tokens with the tier on = off), the multi-turn bench on the
# Qwen3-0.6B shape with the tier on and off in the same process (working set 3.5x a device pool
# shrunk to 2048 blocks, the host tier big enough to hold it), and W1 with the tier off and on
# (the cost when nothing hits). FULL=1 adds the 8B shape's multi-turn run and the preemption
# modes (W1's recipe, the pool at a quarter of what it needs: auto, swap, recompute).
# Run from the repo root of the device copy; everything lands under $OUT, the summary in
# $OUT/kv_tier.log.
#   DEADLINE_S=420 bash scripts/kv_tier_gpu.sh          # about 4 minutes
#   FULL=1 DEADLINE_S=580 bash scripts/kv_tier_gpu.sh   # about 9 minutes
# SERVE=1 adds S1 at 128 in flight through `ladle serve` with the tier off and on (carry .whl;
# scripts/kv_tier_s1_gpu.sh measures that case in full). WIDE=1 adds the 8B multi-turn run at
# 24 users (a 6,144-block pool), to test whether the 6-user recipe's 2x throughput target is
# bounded by its batch-6 decode (docs/benchmarks.md, issue 36, helper kvtier2).
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-420}
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
LOG=$OUT/kv_tier.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
grep MemAvailable /proc/meminfo | tee -a "$LOG"

echo "== tests/gpu/test_kv_host_tier_gpu.py" | tee -a "$LOG"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfs --durations=8 \
  tests/gpu/test_kv_host_tier_gpu.py > "$OUT/kv_tier_tests.log" 2>&1
tail -12 "$OUT/kv_tier_tests.log" | tee -a "$LOG"

bench() {  # name, then the bench's arguments; the table to the log, the JSON under $OUT
  local name=$1; shift
  [ "$(left)" -gt 60 ] || { echo "skipped $name: out of time" | tee -a "$LOG"; return; }
  echo "== $name" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 -m ladle bench "$@" --json "$OUT/$name.json" \
    > "/tmp/$name.log" 2>&1
  grep -v -i warning "/tmp/$name.log" | grep -E "^\[|tok/s|TTFT|ITL|ratio|off/on|budget" \
    | tail -14 | tee -a "$LOG"
}

# 0.6B: 28 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 112 KiB a token, 1.75 MiB a block.
# 2048 blocks = 32,768 tokens (3.5 GiB); 3.5x = ~115k tokens = ~12.3 GiB: a 14 GiB host tier.
bench multiturn_0.6b multiturn --working-set 3.5 --num-gpu-blocks-override 2049 \
  --kv-offloading-size 14 --compare-tier-off
# Nothing hits (every prompt distinct): the tier's write-back must cost nothing measurable.
# NOTHING_HITS=0 skips this pair (when the time is wanted for FULL's runs).
[ "${NOTHING_HITS:-1}" = 1 ] && bench w1_tier_off throughput --workload W1 --num-requests 128 --runs 2 --no-busy --no-progress \
  --kv-offloading-size 0
[ "${NOTHING_HITS:-1}" = 1 ] && bench w1_tier_on throughput --workload W1 --num-requests 128 --runs 2 --no-busy --no-progress \
  --kv-offloading-size 4

if [ "${FULL:-0}" = 1 ]; then
  # 8B: 32 layers x 8 x 128 x 2 x 2 bytes = 128 KiB a token; 2048 blocks = 4 GiB, 3.5x = 14 GiB.
  bench multiturn_8b multiturn --model llama-3.1-8b --load-format dummy --working-set 3.5 \
    --num-gpu-blocks-override 2049 --kv-offloading-size 16 --compare-tier-off
  # W1 keeps ~256 x 1,100 tokens in flight (~17,600 blocks): a quarter is 4,400 blocks.
  for mode in ${PREEMPTION_MODES-auto swap recompute}; do
    bench "w1_preempt_$mode" throughput --workload W1 --runs 1 --no-busy --no-progress \
      --num-gpu-blocks-override 4400 --kv-offloading-size 16 --preemption-mode "$mode"
  done
fi
if [ "${WIDE:-0}" = 1 ]; then
  # 24 users x ~3,800 tokens of history (~240 blocks) fit a 6,144-block pool (12 GiB at the
  # 8B's 2 MiB a block); a working set of 3x the pool is ~36 GiB: a 38 GiB host tier.
  bench multiturn_8b_wide multiturn --model llama-3.1-8b --load-format dummy --working-set 3 \
    --concurrency 24 --num-gpu-blocks-override 6145 --kv-offloading-size 38 --compare-tier-off
fi
if [ "${SERVE:-0}" = 1 ]; then
  # Nothing hits, served: S1 at 128 in flight (distinct prompts) through `ladle serve` with the
  # tier off and on, one server each; needs the server wheels (.whl/ carried, installed below).
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
  fi
  for size in 0 4; do
    [ "$(left)" -gt 80 ] || { echo "skipped S1 tier $size: out of time" | tee -a "$LOG"; continue; }
    python3 -m ladle serve qwen3-0.6b --load-format dummy --kv-offloading-size "$size" \
      --port 8124 > "$OUT/s1_tier_$size.server.log" 2>&1 &
    server=$!
    for _ in $(seq 120); do
      python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8124/health')" \
        >/dev/null 2>&1 && break
      sleep 1
    done
    echo "== S1 at 128 in flight, --kv-offloading-size $size" | tee -a "$LOG"
    timeout $(( $(left) - 10 )) python3 -m ladle bench serve --base-url http://127.0.0.1:8124 \
      --workload S1 --token-ids --ignore-eos --temperature 0.6 --max-concurrency 128 \
      --no-plots --disable-tqdm --output-dir "$OUT/s1_tier_$size" > "$OUT/s1_tier_$size.log" 2>&1
    grep -hE "^throughput:|^ *(ITL|TTFT) ms|prefix_cache" "$OUT/s1_tier_$size.log" | tee -a "$LOG"
    kill "$server"; wait "$server" 2>/dev/null
  done
fi
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
