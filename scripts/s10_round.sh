#!/usr/bin/env bash
# Issue 10's GPU round: the structured-output GPU tests, the host cost of 16 constrained rows on
# the device's CPU, and the 8B step-time overhead (batch 64, a quarter of the rows under the
# 20-field schema) with the 20-field compile time. Needs, beside the tree: wheels/ (llguidance)
# and tok/ (the SmolLM2 tokenizer folder; the device has no copy of the default model).
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/s10site \
  wheels/*.whl && export PYTHONPATH=/tmp/s10site
export PYTHONPATH=src:tests:scripts:${PYTHONPATH:-} PYTHONUNBUFFERED=1 LADLE_TEST_TOKENIZER=tok
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import llguidance, torch; print(llguidance.__file__, torch.__version__)' | tee -a "$OUT/gpu.txt"
timeout 200 python3 scripts/structured_overhead_bench.py --model llama-3.1-8b --load-format dummy \
  --tokenizer tok --batch 64 --constrained-fraction 0.25 --steps 24 --rounds "${ROUNDS:-6}" \
  --json "$OUT/overhead.json" > "$OUT/overhead.log" 2>&1
tail -45 "$OUT/overhead.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_structured_bitmask_gpu.py \
  tests/gpu/test_structured_step_gpu.py > "$OUT/gpu_tests.log" 2>&1
tail -5 "$OUT/gpu_tests.log"
timeout 60 python3 scripts/structured_host_cost.py --tokenizer tok --rows 16 --rounds 3 \
  > "$OUT/host_cost.log" 2>&1
cat "$OUT/host_cost.log"
exit 0
