#!/usr/bin/env bash
# t8's first GPU call: W3's time-to-first-token probe (this branch), then the GPU tests at the
# tree root (main), as scripts/final_round.sh runs them. Run from .carry/t8 on the device.
set -uo pipefail
OUT=${OUT:-.device_out}
HERE=$PWD
ROOT=$(cd ../.. && pwd)
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$ROOT"/.whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONPATH=$HERE/src:$HERE:$PYTHONPATH timeout 170 python3 scripts/ttft_probe.py --out "$OUT" \
  > "$OUT/probe.log" 2>&1; echo "probe rc=$?"; tail -c 3000 "$OUT/probe.log"
cd "$ROOT"
export PYTHONPATH=$ROOT/src:$ROOT/tests:$ROOT:$PYTHONPATH PIP_NO_INDEX=1
export LADLE_TEST_TOKENIZER=$ROOT/.carry/tok
first="tests/gpu/test_gpu_parity.py tests/gpu/test_overlap_gpu.py tests/gpu/test_cuda_graphs.py
  tests/gpu/test_no_compile_while_serving.py tests/gpu/test_structured_step_gpu.py"
timeout 130 python3 -m pytest -q -p no:cacheprovider -rfs $first 2>&1 \
  | tail -30 > "$OUT/gpu_tests_first.log"; tail -4 "$OUT/gpu_tests_first.log"
rest=$(ls tests/gpu/test_*.py | grep -v -F "$(echo $first | tr ' ' '\n')")
timeout 115 python3 -m pytest -q -p no:cacheprovider -rfs $rest 2>&1 \
  | tail -30 > "$OUT/gpu_tests_rest.log"; tail -4 "$OUT/gpu_tests_rest.log"
