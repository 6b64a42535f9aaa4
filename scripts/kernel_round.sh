#!/usr/bin/env bash
# One GPU round for the fused kernels: their tests, the micro-benchmarks against torch (and the
# prefill attention against cuDNN / flash SDPA), then the bf16 parity suite with the kernels on.
# Run from the repository root; results land in $OUT (or ./.device_out locally).
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
export PYTHONPATH=src:tests PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${KERNEL_TEST_TIMEOUT:-120}" python3 -m pytest -q -x tests/gpu/test_fused_kernels.py \
  2>&1 | tee "$OUT/kernel_tests.log" | tail -15
timeout "${BENCH_TIMEOUT:-150}" python3 -m ladle.bench.kernel_bench --out "$OUT" ${BENCH_ARGS:-} \
  2>&1 | tee "$OUT/kernel_bench.log" | tail -45
timeout "${PARITY_TIMEOUT:-150}" python3 -m pytest -q tests/gpu/test_gpu_parity.py ${PARITY_EXTRA:-} \
  2>&1 | tee "$OUT/parity.log" | tail -8
if [ "${PREFILL_REPORT:-0}" = 1 ]; then
  timeout 60 python3 scripts/prefill_kernel_report.py 2>&1 | tee "$OUT/prefill_report.log" | tail -8
fi
