#!/usr/bin/env bash
# Prefill/decode disaggregation on 2 GPUs in one call (issue 37), most important first, within
# DEADLINE_S; everything under $OUT:
#   1. tests/gpu/test_disagg_gpu.py: 2-GPU parity (float32 and fp8 KV) and served 1P1D;
#   2. the KV pull of an 8k-token prompt of the 8B shape vs NCCL send/recv of 1 GiB, same run
#      (bf16, then fp8);
#   3. `ladle bench serve --compare-disaggregation` (1P1D vs two aggregated replicas, same
#      front) on the 8B shape with random weights: the long-prompt class (prompts 4-8k tokens,
#      outputs 256, Poisson) and short chat (sharegpt-like, the S1 mix), goodput under
#      TTFT p99 <= 2 s and ITL p99 <= 30 ms;
#   4. `ladle bench serve --compare-replicas` (2 replicas vs 1, issue 13's check): short chat
#      (64-256 in, 64-128 out) swept past one replica's saturation, output throughput at
#      TTFT p99 <= 2 s (target 1.8x). REPLICAS_ONLY=1 runs only this step; CHAT_ONLY=1 runs
#      only the short-chat steps (1P1D and the front's own choice vs two replicas, then 4).
#   DEADLINE_S=580 bash scripts/disagg_round.sh     # nvidia-h200-x2; carry .whl (server stack)
set -uo pipefail
OUT=${OUT:-.device_out}
DEADLINE_S=${DEADLINE_S:-580}
LONG_RATE=${LONG_RATE:-1.5}
CHAT_RATE=${CHAT_RATE:-16}
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD PYTHONUNBUFFERED=1
LOG=$OUT/disagg_round.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
ONLY=${REPLICAS_ONLY:-0}
[ "$ONLY" = 1 ] || [ "${CHAT_ONLY:-0}" = 1 ] || timeout $(( $(left) < 240 ? $(left) : 240 )) python3 -m pytest -q -p no:cacheprovider -rfs \
  tests/gpu/test_disagg_gpu.py > "$OUT/tests.log" 2>&1
[ "$ONLY" = 1 ] || [ "${CHAT_ONLY:-0}" = 1 ] || tail -3 "$OUT/tests.log" | tee -a "$LOG"
for run in "bf16 kernel" "bf16 memcpy" "fp8 kernel"; do
  [ "$ONLY" = 1 ] || [ "${CHAT_ONLY:-0}" = 1 ] && break
  set -- $run; dtype=$1; strategy=$2
  [ "$(left)" -gt 60 ] || break
  timeout 120 python3 scripts/disagg_kv_bandwidth.py --tokens 8192 --kv-dtype $dtype \
    --strategy $strategy --json "$OUT/kv_pull_${dtype}_$strategy.json" \
    > "$OUT/kv_pull_${dtype}_$strategy.log" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); p=d['pull']; print('$dtype $strategy pull', \
round(p['contiguous_GBps'],1), 'GB/s', round(p['contiguous_ms'],2), 'ms; scattered', \
round(p['scattered_GBps'],1), 'GB/s; nccl', round(d['nccl']['GBps'],1), 'GB/s; ratio', \
round(d['contiguous_vs_nccl'],3), 'bytes ok', p['bytes_match'])" \
    "$OUT/kv_pull_${dtype}_$strategy.json" 2>/dev/null | tee -a "$LOG" \
    || tail -5 "$OUT/kv_pull_${dtype}_$strategy.log" | tee -a "$LOG"
done
SERVE_ARGS="llama-3.1-8b --load-format dummy --max-model-len 10240"
compare() {  # name, then bench flags (MODE=--compare-replicas for two replicas vs one)
  local name=$1; shift
  [ "$(left)" -gt 150 ] || { echo "$name: skipped (time)" | tee -a "$LOG"; return; }
  timeout $(( $(left) - 20 )) python3 -m ladle bench serve "${MODE:---compare-disaggregation}" \
    --serve-args "$SERVE_ARGS" --slo ttft=2000ms,itl=30ms --no-plots --disable-tqdm \
    --output-dir "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  grep -A12 "goodput under SLO" "$OUT/$name.log" | tee -a "$LOG" || tail -5 "$OUT/$name.log" | tee -a "$LOG"
}
if [ "${CHAT_ONLY:-0}" = 1 ]; then
  compare short_chat --workload token-ids --input-len 100:1024 --output-len 100:512 \
    --ignore-eos --num-prompts 200 --rate "$CHAT_RATE"
  compare short_chat_auto --workload token-ids --input-len 100:1024 --output-len 100:512 \
    --ignore-eos --num-prompts 200 --rate "$CHAT_RATE" \
    --disaggregate-args "--disaggregate-min-prompt auto"
  ONLY=1
fi
if [ "$ONLY" = 1 ]; then
  MODE=--compare-replicas compare replicas_short_chat --workload token-ids --input-len 64:256 \
    --output-len 64:128 --ignore-eos --sweep "${REPLICA_RATES:-120,160,200,240}" --duration ${REPLICA_DURATION:-12}
  echo "done in $((SECONDS - start)) s" | tee -a "$LOG"
  exit 0
fi
compare long_prompt --workload token-ids --input-len 4096:8192 --output-len 256:256 \
  --ignore-eos --num-prompts 60 --rate "$LONG_RATE"
compare short_chat --workload token-ids --input-len 100:1024 --output-len 100:512 \
  --ignore-eos --num-prompts 200 --rate "$CHAT_RATE"
# The routed 1P1D: prompts under 2048 tokens run whole on either engine (the front's choice).
compare short_chat_routed --workload token-ids --input-len 100:1024 --output-len 100:512 \
  --ignore-eos --num-prompts 200 --rate "$CHAT_RATE" \
  --disaggregate-args "--disaggregate-min-prompt 2048"
# The front's own line (measured prompt rate x the default 50 ms budget): does it pick the winner?
compare short_chat_auto --workload token-ids --input-len 100:1024 --output-len 100:512 \
  --ignore-eos --num-prompts 200 --rate "$CHAT_RATE" \
  --disaggregate-args "--disaggregate-min-prompt auto"
MODE=--compare-replicas compare replicas_short_chat --workload token-ids --input-len 64:256 \
  --output-len 64:128 --ignore-eos --sweep "${REPLICA_RATES:-120,160,200,240}" --duration ${REPLICA_DURATION:-12}
echo "done in $((SECONDS - start)) s" | tee -a "$LOG"
