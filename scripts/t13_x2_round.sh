#!/bin/bash
# Issue 13's 2-GPU round, one call on nvidia-h200-x2 (carry .whl, .whl_ray and .carry/t13; run
# from the repository root there): one `ladle serve` on GPU 0 against `ladle serve --replicas 2`
# on both GPUs, 8B shape with random weights, token-id chat 64-256 in / 64-128 out, closed loop
# at 128 in flight per replica (scripts/ray_scaleout_round.py). Everything lands under $OUT.
#
#   bash .carry/t13/scripts/t13_x2_round.sh
set -u
# NVLink multicast stays off on the shared host (KINDS.md); nothing here uses NCCL anyway.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/t13_out}
SITE=${SITE:-/tmp/site}
# The CPU rehearsal sets ROUND_MODEL to a tiny model (and ROUND_OPTIONS to a smaller load).
ROUND_MODEL=${ROUND_MODEL:-llama-3.1-8b --load-format dummy}
ROUND_OPTIONS=${ROUND_OPTIONS:---warmup-prompts 32 --start-timeout 90 --bench-timeout 60}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl .whl_ray/*.whl > "$OUT/install.log" 2>&1
cd "${CODE:-.carry/t13}" || exit 1  # CODE=. runs the checkout itself
export PYTHONPATH=$PWD/src:$PWD:$SITE
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
nproc >> "$OUT/gpus.txt"
# shellcheck disable=SC2086  # the options are word lists
timeout "${ROUND_TIMEOUT_S:-125}" python3 scripts/ray_scaleout_round.py --out "$OUT/r" \
    $ROUND_OPTIONS -- $ROUND_MODEL > "$OUT/round.log" 2>&1
echo "round rc=$?"
grep "\[round\]" "$OUT/round.log"
tail -n 20 "$OUT/round.log"
