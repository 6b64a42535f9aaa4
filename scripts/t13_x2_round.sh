#!/bin/bash
# Issue 13's 2-GPU round, one call on nvidia-h200-x2 (carry .whl, .whl_ray and .carry/t13; run
# from the repository root there): one `ladle serve` on GPU 0 against `ladle serve --replicas 2
# --api-server-count 2` on both GPUs, 8B shape with random weights, token-id chat 64-256 in /
# 64-128 out, closed loop at 128 in flight per replica (scripts/ray_scaleout_round.py), the CPU
# of every process role recorded (the front: the ladle serve process plus its front_worker
# processes). First, unless FRONT_BENCH=0, the front's own capacity on this host's CPUs against
# stub replicas (python -m ladle.bench.front_capacity, no GPU; 1 and 2 front processes, ~70 s).
# Everything lands under $OUT.
#
#   bash .carry/t13/scripts/t13_x2_round.sh
#
# uvloop is not carried and not needed: on the CPU it made no measurable difference to the
# front's CPU per token (docs/benchmarks.md, "Issue 13: the front on more than one core"); a
# cp312 wheel (4.5 MB) dropped into .whl_ray would be installed by the line below, but it does
# not fit the 64 MiB carry beside the current wheels. httptools (in .whl_ray) is what the
# front's uvicorn uses. About 8.5 minutes in all: FRONT_BENCH=0 skips the first ~70 s.
set -u
# NVLink multicast stays off on the shared host (KINDS.md); nothing here uses NCCL anyway.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/t13_out}
SITE=${SITE:-/tmp/site}
# The CPU rehearsal sets ROUND_MODEL to a tiny model (and ROUND_OPTIONS to a smaller load).
ROUND_MODEL=${ROUND_MODEL:-llama-3.1-8b --load-format dummy}
ROUND_OPTIONS=${ROUND_OPTIONS:---warmup-prompts 32 --start-timeout 90 --bench-timeout 60}
API_SERVER_COUNT=${API_SERVER_COUNT:-2}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl .whl_ray/*.whl > "$OUT/install.log" 2>&1
cd "${CODE:-.carry/t13}" || exit 1  # CODE=. runs the checkout itself
export PYTHONPATH=$PWD/src:$PWD:$SITE
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
nproc >> "$OUT/gpus.txt"
python3 -c "import uvloop, httptools; print('uvloop', uvloop.__version__)" >> "$OUT/gpus.txt" 2>&1
if [ "${FRONT_BENCH:-1}" != 0 ]; then
    # 2 stub replicas stepping every 12 ms (an 8B decode step at a full batch): 256 and 512
    # streams offer 21k and 43k tok/s, past one front process's capacity.
    for count in 1 2; do
        timeout 150 python3 -m ladle.bench.front_capacity --replicas 2 --step-ms 12 \
            --streams 256,512 --output-tokens 96 --warmup 2 --duration 8 \
            --api-server-count "$count" --out "$OUT/front_capacity_$count.json" \
            > "$OUT/front_capacity_$count.log" 2>&1
        echo "front capacity, $count front processes: rc=$?"
        grep "\[front\]" "$OUT/front_capacity_$count.log"
    done
fi
# shellcheck disable=SC2086  # the options are word lists
timeout "${ROUND_TIMEOUT_S:-420}" python3 scripts/ray_scaleout_round.py --out "$OUT/r" \
    --api-server-count "$API_SERVER_COUNT" $ROUND_OPTIONS -- $ROUND_MODEL \
    > "$OUT/round.log" 2>&1
echo "round rc=$?"
grep "\[round\]" "$OUT/round.log"
tail -n 20 "$OUT/round.log"
