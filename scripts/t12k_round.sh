#!/usr/bin/env bash
# Issue 12 item 6's GPU round (helper t12k): the fp8 KV cache tests, its logits error on random
# weights of real shapes, then W2 (first 64 requests) bf16 / fp8 weights / fp8 weights + fp8 KV
# and W3-8b bf16 / fp8 KV, each part under its own timeout; results under $OUT.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
date -u +%FT%TZ | tee "$OUT/started.txt"
timeout "${TEST_TIMEOUT:-130}" python3 -m pytest -v -s tests/gpu/test_fp8_kv_cache.py \
  -p no:cacheprovider -rfE 2>&1 | grep -E "PASSED|FAILED|ERROR|relative error|tokens that fit|passed|failed|Error|assert" \
  | tail -120 > "$OUT/fp8_kv_tests.log"
grep -cE "PASSED" "$OUT/fp8_kv_tests.log"; grep -E "FAILED|passed|failed|relative error vs|fit:" "$OUT/fp8_kv_tests.log" | tail -12
timeout "${QUALITY_TIMEOUT:-75}" python3 -m ladle.bench.kv_cache_quality --model qwen3-0.6b \
  llama-3.1-8b --load-format dummy --json "$OUT/kv_quality.json" > "$OUT/kv_quality.log" 2>&1
grep -E "relative error|Error" "$OUT/kv_quality.log" | tail -4
run() { name=$1; shift; echo "== $name"; timeout "${BENCH_TIMEOUT:-70}" python3 -m ladle bench "$@" \
  --no-progress --no-busy --json "$OUT/bench_$name.json" > "$OUT/$name.log" 2>&1
  grep -E "tok/s|ms|memory budget|fp8 KV|Error" "$OUT/$name.log" | tail -8; }
W2="throughput --workload W2 --num-requests ${W2_REQUESTS:-64} --runs 1"
run w2_bf16 $W2
run w2_fp8w $W2 --quantization fp8
run w2_fp8w_fp8kv $W2 --quantization fp8 --kv-cache-dtype fp8
run w3_8b_bf16 latency --workload W3-8b --runs 3
run w3_8b_fp8kv latency --workload W3-8b --runs 3 --kv-cache-dtype fp8
timeout "${REGRESSION_TIMEOUT:-45}" python3 -m pytest -q tests/gpu/test_triton_attention.py \
  -k "mixed_batch_gqa or decode_batch_split_kv" -p no:cacheprovider 2>&1 | tail -3 > "$OUT/bf16_attention.log"
cat "$OUT/bf16_attention.log"
exit 0
