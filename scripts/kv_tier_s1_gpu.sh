#!/usr/bin/env bash
# S1 served with the KV cache's host tier off vs on, in one device call (issue 36: "free when
# nothing hits", target within 2% of tier off in throughput and ITL p99). About 3-4 minutes on
# one H200; writes $OUT/kv_tier_s1.log (the figures) and $OUT/kv_tier_s1.json (every run's
# figures, the host tier's counters from /metrics, and a 40-step GPU profile of each server).
#
#   bash scripts/kv_tier_s1_gpu.sh      # carry .whl (the server's wheels), as SERVE=1 needs
#
# Four servers (Qwen3-0.6B shape, dummy weights), each with two passes at 128 in flight:
# pass 1 is S1 itself on a fresh server; pass 2 is S1's shape with other prompts (token-ids,
# seed 1), so nothing hits either. Servers:
#   off / on        the default device pool (~70k blocks): S1 never fills it, so with the
#                   write-back at eviction (core/kv_transfers.py) the tier copies nothing;
#   off_small / on_small  a pool of 12,400 blocks: pass 1 fills it with cached blocks and every
#                   allocation of pass 2 evicts one (a long-running server's steady state), so
#                   the tier writes back at the eviction rate: the cost that remains.
# The profile (LADLE_TORCH_PROFILER_DIR, worker/step_profiler.py) covers steps 1000-1039, in
# pass 2: compare kernel-busy with wall ms per step (idle = the host or a wait).
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-330}
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
LOG=$OUT/kv_tier_s1.log
WORK=/tmp/kv_tier_s1
rm -rf "$WORK" && mkdir -p "$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
git log -1 --format='tree %h %s' 2>/dev/null | tee -a "$LOG"
# The copier's CUDA tests first (no engine, seconds): the copies this branch changed (int64
# words, a store the same step's forward waits for) must move every byte.
if [ "${COPY_TESTS:-1}" = 1 ]; then
  echo "== tests/gpu/test_kv_host_tier_gpu.py (copies only)" | tee -a "$LOG"
  timeout 90 python3 -m pytest -q -p no:cacheprovider -rfs tests/gpu/test_kv_host_tier_gpu.py \
    -k "side_stream or before_the_forward or bandwidth" 2>&1 | tail -4 | tee -a "$LOG"
fi
PORT=${PORT:-8124}
MODEL=${MODEL:-qwen3-0.6b}
# A CPU smoke test of this script: NUM_PROMPTS=8 CONCURRENCY=4 SMALL_BLOCKS=600 TIER_GIB=0.05
#   HF_OVERRIDES='{"num_hidden_layers": 1, "hidden_size": 64, ...}' (tests/helpers TINY_LAYER)
HF_OVERRIDES=${HF_OVERRIDES:-}
NUM_PROMPTS=${NUM_PROMPTS:-256}
SMALL_BLOCKS=${SMALL_BLOCKS:-12400}
TIER_GIB=${TIER_GIB:-4}
CLIENT=(--base-url "http://127.0.0.1:$PORT" --max-concurrency "${CONCURRENCY:-128}"
        --temperature 0.6 --token-ids --ignore-eos --no-plots --disable-tqdm
        --num-prompts "$NUM_PROMPTS")

serve_and_measure() {  # name, then the server's extra arguments
  local name=$1; shift
  [ "$(left)" -gt 75 ] || { echo "skipped $name: out of time" | tee -a "$LOG"; return; }
  LADLE_TORCH_PROFILER_DIR="$WORK/profile_$name" LADLE_PROFILE_STEPS=1000:40 \
    python3 -m ladle serve "$MODEL" --load-format dummy --port "$PORT" \
    ${HF_OVERRIDES:+--hf-overrides "$HF_OVERRIDES"} "$@" \
    > "$WORK/$name.server.log" 2>&1 &
  local server=$!
  for _ in $(seq 150); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health')" \
      >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || { echo "[$name] server exited:" | tee -a "$LOG"
      tail -5 "$WORK/$name.server.log" | tee -a "$LOG"; return; }
    sleep 1
  done
  grep -h "memory budget" "$WORK/$name.server.log" | sed "s/^/[$name] /" | tee -a "$LOG"
  echo "== $name pass 1: S1" | tee -a "$LOG"
  timeout $(( $(left) - 20 )) python3 -m ladle bench serve "${CLIENT[@]}" --workload S1 \
    --output-dir "$WORK/${name}_pass1" > "$WORK/${name}_pass1.log" 2>&1
  grep -hE "^throughput:|^ *(ITL|TTFT) ms" "$WORK/${name}_pass1.log" | tee -a "$LOG"
  echo "== $name pass 2: S1's shape, other prompts" | tee -a "$LOG"
  timeout $(( $(left) - 15 )) python3 -m ladle bench serve "${CLIENT[@]}" --workload token-ids \
    --input-len 100:1024 --output-len 100:512 --seed 1 \
    --output-dir "$WORK/${name}_pass2" > "$WORK/${name}_pass2.log" 2>&1
  grep -hE "^throughput:|^ *(ITL|TTFT) ms" "$WORK/${name}_pass2.log" | tee -a "$LOG"
  python3 -c "import urllib.request; print(urllib.request.urlopen(
    'http://127.0.0.1:$PORT/metrics').read().decode())" 2>/dev/null \
    | grep -E "^(ladle:kv_offload_(bytes|copy|stores)|vllm:external_prefix_cache_hits|ladle:num_pre)" \
    > "$WORK/$name.metrics"
  sed "s/^/[$name] /" "$WORK/$name.metrics" | tee -a "$LOG"
  kill "$server"; wait "$server" 2>/dev/null
  grep -h "profiled" "$WORK/$name.server.log" | tail -2 | sed "s/^/[$name] /" | tee -a "$LOG"
}

serve_and_measure off --kv-offloading-size 0
serve_and_measure on --kv-offloading-size "$TIER_GIB"
if [ "${SMALL:-1}" = 1 ]; then  # SMALL=0: the default pool's pair only
  serve_and_measure off_small --kv-offloading-size 0 --num-gpu-blocks-override "$SMALL_BLOCKS"
  serve_and_measure on_small --kv-offloading-size "$TIER_GIB" --num-gpu-blocks-override "$SMALL_BLOCKS"
fi

python3 - "$WORK" "$OUT/kv_tier_s1.json" <<'EOF' | tee -a "$LOG"
"""Every run's figures in one JSON, and the on/off ratios of each pass."""
import json
import re
import sys
from pathlib import Path

work, target = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for name in ("off", "on", "off_small", "on_small"):
    run = {}
    for number in (1, 2):
        log = work / f"{name}_pass{number}.log"
        if not log.exists():
            continue
        text = log.read_text()
        figures = {"log_tail": text.splitlines()[-30:]}
        match = re.search(r"^throughput:.*?([\d.]+) output tok/s", text, re.MULTILINE)
        if match:
            figures["tok_per_s"] = float(match.group(1))
        for kind in ("ITL", "TTFT"):
            line = re.search(rf"^ *{kind} ms.*$", text, re.MULTILINE)
            if line:
                figures[kind] = line.group(0).strip()
        run[f"pass{number}"] = figures
    metrics = work / f"{name}.metrics"
    if metrics.exists():
        run["metrics"] = metrics.read_text().splitlines()
    profile = work / f"profile_{name}" / "rank0.json"
    if profile.exists():
        summary = json.loads(profile.read_text())
        run["profile"] = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
    runs[name] = run
ratios = {}
for off, on in (("off", "on"), ("off_small", "on_small")):
    for number in (1, 2):
        a = runs.get(off, {}).get(f"pass{number}", {}).get("tok_per_s")
        b = runs.get(on, {}).get(f"pass{number}", {}).get("tok_per_s")
        if a and b:
            ratios[f"{on}/{off} pass{number}"] = round(b / a, 4)
            print(f"throughput {on}/{off}, pass {number}: {b:,.0f} / {a:,.0f} = {b / a:.3f}x")
target.write_text(json.dumps({"runs": runs, "ratios": ratios}, indent=1))
EOF
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
