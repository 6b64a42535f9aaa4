#!/usr/bin/env bash
# Drafted requests in overlapped steps (issue 33): W3 at batch 1 on the Llama-3.1-8B and
# Qwen3-0.6B shapes, n-gram drafts k = 4 at synthetic acceptance 0.8, with the drafts made on
# the device (drafted steps overlapped) and on the host (drafted steps synchronous: the tree
# before this change), alternated in one device call. Each `ladle bench latency` also runs the
# same requests without speculation on the same engine (the no-spec figure of each line).
# Summary lines (decode ms/token with and without speculation) land in $OUT/spec_overlap.log.
# ORDER: the drafts_on_device values in the order they run (alternate them on a busy machine).
#   RUNS=3 WORKLOADS="W3-8b W3" ORDER="true false" bash scripts/spec_overlap_compare.sh
set -uo pipefail
OUT=${OUT:-.device_out}
RUNS=${RUNS:-3}
WORKLOADS=${WORKLOADS:-W3-8b W3}
ACCEPTANCE=${ACCEPTANCE:-0.8}
ORDER=${ORDER:-true false}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
LOG=$OUT/spec_overlap.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$LOG"
for workload in $WORKLOADS; do
  for on_device in $ORDER; do
    spec="{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"adaptive\": false,"
    spec+=" \"drafts_on_device\": $on_device}"
    json=$OUT/$workload-$on_device-$RANDOM.json
    python3 -m ladle bench latency --workload "$workload" --runs "$RUNS" --no-busy \
      --speculative-config "$spec" --synthetic-acceptance "$ACCEPTANCE" --json "$json" \
      > "$OUT/$workload-$on_device.log" 2>&1 || {
      echo "$workload $on_device: failed" | tee -a "$LOG"
      tail -20 "$OUT/$workload-$on_device.log"
      continue
    }
    python3 - "$json" "$workload" "$on_device" <<'PY' | tee -a "$LOG"
import json, sys
data = json.load(open(sys.argv[1]))
spec = data.get("speculation") or {}
base, speedup = spec.get("no_spec_decode_ms_per_token"), spec.get("speedup_decode_ms_per_token")
with_spec = base / speedup if base and speedup else None
print(f"{sys.argv[2]} drafts_on_device={sys.argv[3]}: decode {with_spec} ms/token with "
      f"n-gram drafts, {base} without (x{speedup}; pairs "
      f"{spec.get('speedup_decode_ms_per_token_pairs')}), acceptance length "
      f"{spec.get('acceptance_length')}")
PY
  done
done
