#!/usr/bin/env bash
# Issue 12, int4 decode speed and fp8 weights' figures (helper t12i): one GPU round. STAGES picks
# what runs, in order (default: all): tests, kernels, w3 (W3-8b int4/fp8/bf16), w2 (W2 bf16/fp8/
# int4 on W2_REQUESTS requests), w1 (W1 0.6B fp8 and bf16), layers (per-layer and logits error).
# Each part runs under its own timeout and writes its log and JSON under $OUT.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
STAGES=${STAGES:-tests kernels w3 w2 w1 layers}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
bench() { name=$1; limit=$2; shift 2; echo "== $name $(date +%T)"; timeout "$limit" python3 -m ladle \
  bench "$@" --no-progress --json "$OUT/bench_$name.json" > "$OUT/$name.log" 2>&1;
  echo "rc=$?"; grep -E "ttft|itl|tok/s|tokens_per|output_throughput|error|Error" "$OUT/$name.log" | tail -12; }
for stage in $STAGES; do
  case $stage in
    tests)
      echo "== tests $(date +%T)"
      timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q tests/gpu/test_int4_decode.py \
        tests/gpu/test_quant_kernels.py -k "${TEST_FILTER:-int4 or fp8}" -p no:cacheprovider \
        -rfEs --maxfail=10 2>&1 \
        | tail -120 > "$OUT/tests.log"
      grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/tests.log" | tail -20 ;;
    kernels)
      echo "== kernels $(date +%T)"
      timeout "${KERNEL_TIMEOUT:-150}" python3 -m ladle.bench.int4_kernels \
        --json "$OUT/int4_kernels.json" > "$OUT/int4_kernels.log" 2>&1
      tail -40 "$OUT/int4_kernels.log" ;;
    w3)
      for method in ${W3_METHODS:-int4 fp8 none}; do
        bench "w3_8b_$method" "${W3_TIMEOUT:-120}" latency --workload W3-8b --runs "${W3_RUNS:-2}" \
          --no-busy --quantization "$method"
      done ;;
    w2)
      for method in ${W2_METHODS:-none fp8 int4}; do
        bench "w2_$method" "${W2_TIMEOUT:-150}" throughput --workload W2 --runs 1 --no-busy \
          --num-requests "${W2_REQUESTS:-256}" --quantization "$method"
      done ;;
    w1)
      for method in ${W1_METHODS:-fp8 none}; do
        bench "w1_$method" "${W1_TIMEOUT:-100}" throughput --workload W1 --runs 1 --no-busy \
          --quantization "$method"
      done ;;
    layers)
      echo "== layers $(date +%T)"
      timeout "${LAYER_TIMEOUT:-150}" python3 -m ladle.bench.quant_layers --tokens 1 64 \
        --json "$OUT/quant_layers.json" --models ${LOGIT_MODELS:-qwen3-0.6b llama-3.1-8b} \
        > "$OUT/quant_layers.log" 2>&1
      tail -12 "$OUT/quant_layers.log" ;;
  esac
done
echo "== done $(date +%T)"
exit 0
