#!/usr/bin/env bash
# t12k's second GPU round: the two engine tests rewritten after round 1, the fp8 decode kernel
# sweep on the 8B shape, and the per-layer / whole-model fp8 KV error on the 8B shape.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
timeout "${TEST_TIMEOUT:-45}" python3 -m pytest -q -s tests/gpu/test_fp8_kv_cache.py \
  -k "logits or budget" -p no:cacheprovider 2>&1 | grep -E "relative error|fit:|passed|failed|Error|assert" | tail -12
timeout "${SWEEP_TIMEOUT:-50}" python3 scripts/fp8_kv_decode_sweep.py 2>&1 | tail -25
timeout "${QUALITY_TIMEOUT:-60}" python3 -m ladle.bench.kv_cache_quality --model llama-3.1-8b \
  --load-format dummy --lengths 100 1024 --json "$OUT/kv_quality_8b.json" 2>&1 | grep -E "relative error|Error" | tail -3
exit 0
