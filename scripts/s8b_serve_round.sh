#!/usr/bin/env bash
# s8b's second GPU-machine round: the served-path harness (a paced stand-in engine, so the API
# process alone is measured) on main's tree and on s8b's, then the 8B start-up to the first
# token with an empty Triton cache and no pip look-up. Run from the repo root of the device copy.
set -uo pipefail
OUT=${OUT:-.device_out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PIP_NO_INDEX=1
S8B=.carry/s8b
bench() { PYTHONPATH=/tmp/site:$1 timeout 60 python3 $S8B/scripts/served_path_bench.py \
  --tokenizer $S8B/tok --concurrency 32 128 256 --step-ms 10 --max-tokens 96 \
  --requests-per-slot 1 --json "$OUT/$2.json" 2>&1 | grep -v Warning | tail -3; }
echo "== main"; bench src served_main_1
echo "== s8b"; bench $S8B/src served_s8b_1
[ "${WITH_STARTUP:-0}" = 1 ] || exit 0
echo "== 8B start-up to first token, empty Triton cache"
cd $S8B && PYTHONPATH=src:/tmp/site TRITON_CACHE_DIR=/tmp/s8b_cold timeout 70 python3 \
  scripts/startup_profile.py llama-3.1-8b --load-format dummy --json "$OUT/startup_8b.json" \
  > "$OUT/startup_8b.log" 2>&1; tail -16 "$OUT/startup_8b.log"
exit 0
