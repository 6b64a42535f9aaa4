#!/usr/bin/env bash
# Speculation never loses (issue 33): S1 through `ladle serve` with adaptive n-gram drafts and
# synthetic acceptance 0.6 against the same server without speculation, at 1, 8, 32, 128 and 256
# in flight, on the Qwen3-0.6B and Llama-3.1-8B shapes, in one device call. One server per model
# and mode, prefix caching off (S1's seeded prompts repeat at each level). Fewer prompts at 1 and
# 8 in flight (NUM_AT_1, NUM_AT_8) keep the call short; the others send S1's 256.
# The summary (tok/s per level, on/off ratio) lands in $OUT/never_loses.log; each "on" server's
# governor epochs in $OUT/never_loses/MODEL-on-rR.governor.jsonl (LADLE_SPEC_GOVERNOR_TRACE).
# REPEATS=N starts each model's off and on servers N times, alternating, and compares the
# medians: servers started within one call differed by up to 30% at 1 in flight (session 49).
#   DEADLINE_S=540 MODELS="qwen3-0.6b llama-3.1-8b" bash scripts/spec_never_loses.sh
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-540}
OUT=${OUT:-.device_out}
MODELS=${MODELS:-qwen3-0.6b llama-3.1-8b}
LEVELS=${LEVELS:-1 8 32 128 256}
SPEC=${SPEC:-'{"method": "ngram", "num_speculative_tokens": 4, "synthetic_acceptance": 0.6}'}
mkdir -p "$OUT/never_loses"
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
LOG=$OUT/never_loses.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$LOG"
echo "speculative config: $SPEC" | tee -a "$LOG"
prompts_at() { case $1 in 1) echo "${NUM_AT_1:-24}";; 8) echo "${NUM_AT_8:-64}";; *) echo 256;; esac; }

REPEATS=${REPEATS:-1}
for model in $MODELS; do
  for repeat in $(seq "$REPEATS"); do
  for mode in off on; do
    [ "$(left)" -gt 90 ] || { echo "skipped $model $mode: out of time" | tee -a "$LOG"; continue; }
    args=(serve "$model" --load-format dummy --no-enable-prefix-caching --port 8123)
    [ "$mode" = on ] && args+=(--speculative-config "$SPEC")
    # The governor's epochs (spec_decode/governor_trace.py), for the "on" servers.
    LADLE_SPEC_GOVERNOR_TRACE=$OUT/never_loses/$model-$mode-r$repeat.governor.jsonl \
      python3 -m ladle "${args[@]}" > "$OUT/never_loses/$model-$mode-r$repeat.server.log" 2>&1 &
    server=$!
    for _ in $(seq 240); do
      python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8123/health')" \
        >/dev/null 2>&1 && break
      sleep 1
    done
    for n in $LEVELS; do
      [ "$(left)" -gt 30 ] || { echo "skipped $model $mode $n: out of time" | tee -a "$LOG"; break; }
      name="$model-$mode-$n-r$repeat"
      timeout $(( $(left) - 15 )) python3 -m ladle bench serve --base-url http://127.0.0.1:8123 \
        --workload S1 --token-ids --ignore-eos --temperature 0.6 --max-concurrency "$n" \
        --num-prompts "$(prompts_at "$n")" --no-plots --disable-tqdm \
        --output-dir "$OUT/never_loses/$name" --label "$name" > "$OUT/never_loses/$name.log" 2>&1
    done
    kill "$server"; wait "$server" 2>/dev/null
  done
  done
done

python3 - "$OUT/never_loses" <<'PY' | tee -a "$LOG"
import json, re, statistics, sys
from collections import defaultdict
from pathlib import Path
root = Path(sys.argv[1])
NAME = re.compile(r"^(?P<model>.+)-(?P<mode>on|off)-(?P<n>\d+)-r\d+$")
rates = defaultdict(list)  # (model, mode, n) -> output tok/s of each repeat
for path in sorted(root.glob("*/results.json")):
    match = NAME.match(path.parent.name)
    if match:
        summary = json.loads(path.read_text())["runs"][0]["summary"]
        rates[match["model"], match["mode"], int(match["n"])].append(summary["output_throughput"])
for model in sorted({key[0] for key in rates}):
    for n in (1, 8, 32, 128, 256):
        off, on = rates.get((model, "off", n), []), rates.get((model, "on", n), [])
        if not off or not on:
            print(f"{model} {n:>3} in flight: n/a")
            continue
        off_rate, on_rate = statistics.median(off), statistics.median(on)
        each = f" (off {', '.join(f'{r:,.0f}' for r in off)}; on {', '.join(f'{r:,.0f}' for r in on)})"
        print(f"{model} {n:>3} in flight: off {off_rate:,.0f} tok/s, on {on_rate:,.0f} tok/s, "
              f"on/off {on_rate / off_rate:.3f}x" + (each if len(off) > 1 else ""))
PY
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
