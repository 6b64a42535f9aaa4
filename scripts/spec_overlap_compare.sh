#!/usr/bin/env bash
# Drafted requests in overlapped steps (issue 33): W3 at batch 1 on the Llama-3.1-8B and
# Qwen3-0.6B shapes, n-gram drafts k = 4 at synthetic acceptance 0.8, in three modes in one
# device call:
#   host    - "drafts_on_device": false: drafts on the host, drafted steps synchronous (the
#             behaviour before this change);
#   device  - drafts on the device, drafted steps overlapped, the torch path (~75 launches,
#             LADLE_DRAFT_KERNELS=0);
#   kernels - the same with the fused kernels (kernels/draft_steps.py, three launches; the
#             default on CUDA since 2026-11-28).
# Each `ladle bench latency` also runs the same requests without speculation on the same engine.
# Summary lines (decode ms/token with and without speculation) land in $OUT/spec_overlap.log.
# ORDER: the modes in the order they run (repeat them to alternate on a busy machine).
#   RUNS=3 WORKLOADS="W3-8b W3" ORDER="device host kernels" bash scripts/spec_overlap_compare.sh
set -uo pipefail
OUT=${OUT:-.device_out}
RUNS=${RUNS:-3}
WORKLOADS=${WORKLOADS:-W3-8b W3}
ACCEPTANCE=${ACCEPTANCE:-0.8}
ORDER=${ORDER:-device host kernels}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
LOG=$OUT/spec_overlap.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$LOG"
for workload in $WORKLOADS; do
  for mode in $ORDER; do
    on_device=true
    kernels=0
    [ "$mode" = host ] && on_device=false
    [ "$mode" = kernels ] && kernels=1
    spec="{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"adaptive\": false,"
    spec+=" \"drafts_on_device\": $on_device}"
    json=$OUT/$workload-$mode-$RANDOM.json
    LADLE_DRAFT_KERNELS=$kernels python3 -m ladle bench latency --workload "$workload" \
      --runs "$RUNS" --no-busy --speculative-config "$spec" \
      --synthetic-acceptance "$ACCEPTANCE" --json "$json" > "$OUT/$workload-$mode.log" 2>&1 || {
      echo "$workload $mode: failed" | tee -a "$LOG"
      tail -20 "$OUT/$workload-$mode.log"
      continue
    }
    python3 - "$json" "$workload" "$mode" <<'PY' | tee -a "$LOG"
import json, sys
data = json.load(open(sys.argv[1]))
spec = data.get("speculation") or {}
base, speedup = spec.get("no_spec_decode_ms_per_token"), spec.get("speedup_decode_ms_per_token")
with_spec = base / speedup if base and speedup else None
print(f"{sys.argv[2]} {sys.argv[3]}: decode {with_spec} ms/token with n-gram drafts, {base} "
      f"without (x{speedup}; pairs {spec.get('speedup_decode_ms_per_token_pairs')}), "
      f"acceptance length {spec.get('acceptance_length')}")
PY
  done
done
