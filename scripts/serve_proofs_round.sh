#!/usr/bin/env bash
# One device call of the serving proofs (issue 9): the scheduler phase (0.6B shape), then the SLO
# phase (8B shape) with the transformers-serve peer, bounded by DEADLINE_S; everything it
# measured comes back as $OUT/proofs.json, $OUT/proofs.log and $OUT/proofs.tgz (every run's
# results.json, logs and plots). Run from this checkout's root; TOKENIZER is a tokenizer folder
# (SmolLM2's), padded on the device to the 8B vocabulary for the text requests.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
python3 scripts/serve_proofs.py --phase "${PHASE:-all}" --out /tmp/proofs --deadline-s "${DEADLINE_S:-480}" \
  --tokenizer "${TOKENIZER:?a tokenizer folder}" ${PROOF_ARGS:-} 2>&1 | tee "$OUT/proofs.log"
cp /tmp/proofs/proofs.json "$OUT/" 2>/dev/null
tar czf "$OUT/proofs.tgz" -C /tmp --exclude tokenizer_padded proofs
ls -la "$OUT"
