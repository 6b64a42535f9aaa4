#!/usr/bin/env bash
# Issue 10/8 GPU round (t10): split-launch GPU tests, then the 8B step-time bench: batch 64, a
# quarter of the rows under the 20-field JSON schema, or with penalties, against the plain batch
# (6 alternating rounds), plus each with overlap off. Run from the tree root on the device with
# .whl (llguidance wheel) at ../../.whl and the SmolLM2 tokenizer at ../tok (the .carry layout).
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
WHL=${WHL:-../../.whl}
TOK=${TOK:-../tok}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/t10site \
  "$WHL"/llguidance-*.whl && export PYTHONPATH=/tmp/t10site
export PYTHONPATH=src:tests:scripts:${PYTHONPATH:-} PYTHONUNBUFFERED=1 LADLE_TEST_TOKENIZER=$TOK
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
git log -1 --format=%H 2>/dev/null | tee -a "$OUT/gpu.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_split_launch_gpu.py \
  tests/gpu/test_structured_step_gpu.py > "$OUT/gpu_tests.log" 2>&1
tail -5 "$OUT/gpu_tests.log"
timeout 260 python3 scripts/structured_overhead_bench.py --model llama-3.1-8b --load-format dummy \
  --tokenizer "$TOK" --batch 64 --constrained-fraction 0.25 --steps 24 --rounds "${ROUNDS:-6}" \
  --kinds json,penalty --sync-reference --json "$OUT/overhead.json" > "$OUT/overhead.log" 2>&1
tail -22 "$OUT/overhead.log"
if [ "${OVERLAP_TESTS:-1}" = 1 ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_overlap_gpu.py \
    > "$OUT/overlap_tests.log" 2>&1
  tail -3 "$OUT/overlap_tests.log"
fi
exit 0
