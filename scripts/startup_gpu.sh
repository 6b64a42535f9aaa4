#!/usr/bin/env bash
# Start-up from process start to the first token (`ladle bench startup`), on one GPU in one call,
# this tree against the tree under BEFORE (e.g. `git archive <commit> src | tar -x -C .before`,
# carried), runs alternating between the trees so a drift of the machine hits both alike:
#   1. llama-3.1-8b random weights (--load-format dummy), empty caches, then warm caches
#   2. llama-3.1-8b as a safetensors folder written to local disk first (/tmp/ckpt, not timed),
#      empty caches, then warm caches, then warm Triton cache with the files out of the page cache
#   3. qwen3-0.6b random weights, empty caches, then warm caches
#   4. this tree with one change turned off at a time (LADLE_DIRECT_SAFETENSORS=0,
#      LADLE_BUILDS_BESIDE_LOADING=0), then the folder read with the page cache dropped
#   5. llama-3.1-8b through `ladle serve` (warm caches), to the first streamed token
# "Empty caches": a fresh TRITON_CACHE_DIR and LADLE_CACHE_DIR per run; "warm": one pair per
# invocation, filled by a first run that is not reported. Each step is skipped once DEADLINE_S
# seconds have passed (default 500: the call's limit is 600). Results: one line a run in
# $OUT/startup.log, every figure (and each run's engine phases) in $OUT/startup/*.json.
#   BEFORE=.before bash scripts/startup_gpu.sh
set -uo pipefail
BEFORE=${BEFORE:-.before}
OUT=${OUT:-.device_out}
DEADLINE_S=${DEADLINE_S:-500}
CKPT=${CKPT:-/tmp/ckpt}
RESULTS=$OUT/startup
mkdir -p "$RESULTS"
LOG=$OUT/startup.log
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
lscpu | grep -m1 "Model name" | tee -a "$LOG"
SECONDS=0
trees=(after)
if [ -d "$BEFORE/src/ladle" ]; then
  # The measuring child is this tree's; the engine it starts is the before tree's.
  cp -n src/ladle/bench/startup_child.py "$BEFORE/src/ladle/bench/" 2>/dev/null
  trees=(after before)
else
  echo "no BEFORE tree at $BEFORE: this tree only" | tee -a "$LOG"
fi
bench() {  # name tree args...: one `ladle bench startup` invocation, its summary line logged
  local name=$1 tree=$2; shift 2
  if [ "$SECONDS" -ge "$DEADLINE_S" ]; then
    echo "$name-$tree skipped (${SECONDS}s past the ${DEADLINE_S}s deadline)" | tee -a "$LOG"
    return
  fi
  local src=$PWD/src
  [ "$tree" = before ] && src=$(cd "$BEFORE" && pwd)/src
  PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} python3 -m ladle bench startup "$@" --child-pythonpath "$src" \
    --json "$RESULTS/$name-$tree.json" > "$RESULTS/$name-$tree.log" 2>&1
  echo "$name-$tree ($SECONDS s) $(grep -h -m1 'first token:' "$RESULTS/$name-$tree.log" \
    || tail -3 "$RESULTS/$name-$tree.log")" | tee -a "$LOG"
  grep -h "engine phases\|  engine:" "$RESULTS/$name-$tree.log" | tee -a "$LOG"
}
for tree in "${trees[@]}"; do bench 8b-dummy-cold "$tree" llama-3.1-8b --triton-cache cold; done
for tree in "${trees[@]}"; do bench 8b-dummy-warm "$tree" llama-3.1-8b --triton-cache warm; done
# Written once (kept by later calls): not part of any figure.
PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} python3 - "$CKPT" <<'EOF' 2>&1 | tail -1 | tee -a "$LOG"
import sys, time, torch
from ladle.model.loader.random_checkpoint import write_random_checkpoint
started = time.perf_counter()
write_random_checkpoint("llama-3.1-8b", sys.argv[1], torch.bfloat16, "cuda")
print(f"checkpoint {sys.argv[1]} ready in {time.perf_counter() - started:.1f} s")
EOF
df -h "$CKPT" | tail -1 | tee -a "$LOG"
for tree in "${trees[@]}"; do bench 8b-ckpt-cold "$tree" "$CKPT" --triton-cache cold; done
for tree in "${trees[@]}"; do bench 8b-ckpt-warm "$tree" "$CKPT" --triton-cache warm; done
for tree in "${trees[@]}"; do bench 0.6b-dummy-cold "$tree" qwen3-0.6b --triton-cache cold; done
for tree in "${trees[@]}"; do bench 0.6b-dummy-warm "$tree" qwen3-0.6b --triton-cache warm; done
# Each change alone, this tree only: the memory-mapped reader, and the build pass after the load.
LADLE_DIRECT_SAFETENSORS=0 bench 8b-ckpt-warm-mapped-reader after "$CKPT" --triton-cache warm
LADLE_BUILDS_BESIDE_LOADING=0 bench 8b-ckpt-cold-builds-after-load after "$CKPT" \
  --triton-cache cold
for tree in "${trees[@]}"; do
  bench 8b-ckpt-evicted "$tree" "$CKPT" --triton-cache warm --evict-page-cache
done
for tree in "${trees[@]}"; do bench 8b-serve-warm "$tree" llama-3.1-8b --serve --triton-cache warm; done
echo "done in $SECONDS s" | tee -a "$LOG"
