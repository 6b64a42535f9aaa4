#!/usr/bin/env bash
# Issue 35 in one GPU call (under 5 minutes by default): the fused MoE tests
# (tests/gpu/test_fused_moe_gpu.py: real-size kernels in bf16 and fp8, graph replay, the tuner,
# the engine on tiny Qwen3-MoE and Mixtral), then `ladle bench` on the Qwen3-30B-A3B shape
# (dummy weights): W3 (latency, batch 1) and W1 (throughput, 256 requests), bf16 then
# --quantization fp8, one timed run each, most important first while time is left. Each
# start-up's "fused MoE tiles ... tuned/read in X s" line is the tuning time: the ladle cache is
# fresh (LADLE_CACHE_DIR), so the first start-up of each weight format tunes and the second reads
# the cache. W3 runs with --max-num-seqs 16 (batch 1 is all it measures; fewer graphs to capture
# at start-up). Everything lands under $OUT; the summary in $OUT/moe_round.log.
#   DEADLINE_S=290 bash scripts/moe_gpu_round.sh
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-290}
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
export PYTHONPATH=$PWD/src:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-/tmp/ladle_moe_cache}
rm -rf "$LADLE_CACHE_DIR/moe_tiles"
LOG=$OUT/moe_round.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$LOG"
echo "== tests/gpu/test_fused_moe_gpu.py" | tee -a "$LOG"
timeout "${TEST_TIMEOUT:-100}" python3 -m pytest -q -p no:cacheprovider -rfs -s --durations=8 \
  tests/gpu/test_fused_moe_gpu.py > "$OUT/moe_tests.log" 2>&1
grep -E "tuned in" "$OUT/moe_tests.log" | cut -c1-300 | tee -a "$LOG"
tail -14 "$OUT/moe_tests.log" | tee -a "$LOG"
for spec in "latency W3-30b-a3b bf16" "throughput W1-30b-a3b bf16" "throughput W1-30b-a3b fp8" \
            "latency W3-30b-a3b fp8"; do
  set -- $spec
  [ "$(left)" -gt 50 ] || { echo "== skipped $spec (time)" | tee -a "$LOG"; continue; }
  name="$2-$3"
  quant=(); [ "$3" = fp8 ] && quant=(--quantization fp8)
  # W3 is one request: fewer decode graphs to capture (batch 1's is the one that counts).
  [ "$1" = latency ] && quant+=(--max-num-seqs 16)
  echo "== ladle bench $1 --workload $2 $3 ($(left) s left)" | tee -a "$LOG"
  timeout $(( $(left) - 5 )) python3 -m ladle bench "$1" --workload "$2" ${quant[@]+"${quant[@]}"} --runs 1 \
    --no-busy --no-progress --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "exit $?" >> "$OUT/$name.log"
  grep -E "fused MoE tiles|CUDA graphs off|Error|error" "$OUT/$name.log" | cut -c1-400 | tee -a "$LOG"
  grep -E "tok/s|ITL|TTFT|floor|MoE|start-up|exit" "$OUT/$name.log" | tee -a "$LOG"
done
ls "$LADLE_CACHE_DIR/moe_tiles" 2>/dev/null | tee -a "$LOG"
cp -r "$LADLE_CACHE_DIR/moe_tiles" "$OUT/" 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
