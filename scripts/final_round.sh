#!/usr/bin/env bash
# The lead's one GPU call on merged main: the GPU tests (the step-path ones first, so a cut-off
# still covers them), then the serving proofs (scripts/serve_proofs_round.sh) in what time is left.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
export LADLE_TEST_TOKENIZER=$PWD/.carry/tok
first="tests/gpu/test_gpu_parity.py tests/gpu/test_overlap_gpu.py tests/gpu/test_cuda_graphs.py
  tests/gpu/test_no_compile_while_serving.py tests/gpu/test_structured_step_gpu.py"
timeout "${FIRST_TIMEOUT:-130}" python3 -m pytest -q -p no:cacheprovider -rfs $first 2>&1 \
  | tail -25 > "$OUT/gpu_tests_first.log"; tail -4 "$OUT/gpu_tests_first.log"
rest=$(ls tests/gpu/test_*.py | grep -v -F "$(echo $first | tr ' ' '\n')")
timeout "${REST_TIMEOUT:-110}" python3 -m pytest -q -p no:cacheprovider -rfs $rest 2>&1 \
  | tail -25 > "$OUT/gpu_tests_rest.log"; tail -4 "$OUT/gpu_tests_rest.log"
WHEELS= TOKENIZER=$PWD/.carry/tok DEADLINE_S=${DEADLINE_S:-290} bash scripts/serve_proofs_round.sh
