#!/usr/bin/env bash
# Issue 12's GPU round (helper s12b): the quantization GPU tests, the per-layer bench with
# logits errors, then W3 on the 8B shape with int4 / fp8 / bf16 weights (most wanted first).
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-130}" python3 -m pytest -q tests/gpu/test_quant_kernels.py \
  -p no:cacheprovider -rfEs 2>&1 | tail -300 > "$OUT/quant_tests.log"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/quant_tests.log" | tail -25
timeout "${LAYER_TIMEOUT:-80}" python3 -m ladle.bench.quant_layers --json "$OUT/quant_layers.json" \
  --models ${LOGIT_MODELS:-qwen3-0.6b llama-3.1-8b} > "$OUT/quant_layers.log" 2>&1
tail -8 "$OUT/quant_layers.log"
run() { name=$1; shift; echo "== $name"; timeout "${BENCH_TIMEOUT:-100}" python3 -m ladle bench "$@" \
  --no-progress > "$OUT/$name.log" 2>&1; tail -6 "$OUT/$name.log"; }
for method in ${W3_METHODS:-int4}; do
  run "w3_8b_$method" latency --workload W3-8b --runs 1 --no-busy --quantization "$method"
done
exit 0
