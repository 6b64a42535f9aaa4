#!/usr/bin/env bash
# Before/after on one GPU, two trees side by side in one device call: this checkout and the tree
# under BEFORE (e.g. `git archive <commit> src | tar -x -C .before`, carried). Runs alternate
# between the trees (A B A B ...), so a drift of the machine hits both alike. Every run's JSON
# lands in $OUT/compare.tgz; one line a run in $OUT/compare.log.
#   PHASE=offline ROUNDS=3 BEFORE=.before bash scripts/compare_trees.sh   # W1, W3, W3-8b
#   PHASE=serve ROUNDS=3 BEFORE=.before bash scripts/compare_trees.sh     # S1 at 32/128/256
# The server stack's wheels (.whl/) are installed into /tmp/site when carried.
set -uo pipefail
BEFORE=${BEFORE:-.before}
PHASE=${PHASE:-offline}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-.device_out}
RUNS=$OUT/runs
mkdir -p "$RUNS"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  SITE=/tmp/site
fi
export PYTHONUNBUFFERED=1
LOG=$OUT/compare.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
# ladle from a tree: its own src first on the path.
in_tree() { local tree=$1; shift; PYTHONPATH="$tree/src:${SITE:-}" python3 -m ladle "$@"; }
summary() {  # the figures worth a line, from a bench JSON
  python3 - "$1" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
keys = ("tokens_per_s", "tokens_per_s_runs", "ttft_ms_p50", "itl_ms_p50", "itl_ms_p90",
        "startup_s")
print(" ".join(f"{key}={data[key]}" for key in keys if key in data))
EOF
}
get() { python3 -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; }
for round in $(seq "$ROUNDS"); do
  for label in after before; do
    tree=$PWD; [ "$label" = before ] && tree=$BEFORE
    if [ "$PHASE" = offline ]; then
      for spec in "throughput W1 1" "latency W3 3" "latency W3-8b 3"; do
        set -- $spec
        name="$2-$label-$round"
        in_tree "$tree" bench "$1" --workload "$2" --runs "$3" --no-busy --no-progress \
          --json "$RUNS/$name.json" > "$RUNS/$name.log" 2>&1
        echo "$name $(summary "$RUNS/$name.json" 2>/dev/null || tail -2 "$RUNS/$name.log")" \
          | tee -a "$LOG"
      done
    else
      # One server per tree and round, prefix caching off: S1's seeded prompts repeat at each
      # level, so a shared cache would turn the later levels into prefix hits.
      PYTHONPATH="$tree/src:${SITE:-}" python3 -m ladle serve qwen3-0.6b --load-format dummy \
        --no-enable-prefix-caching --port 8123 > "$RUNS/S1-$label-$round.server.log" 2>&1 &
      server=$!
      for _ in $(seq 180); do get http://127.0.0.1:8123/health >/dev/null 2>&1 && break; sleep 1; done
      for n in ${S1_LEVELS:-32 128 256}; do
        name="S1-$n-$label-$round"
        in_tree "$PWD" bench serve --base-url http://127.0.0.1:8123 --workload S1 --token-ids \
          --ignore-eos --temperature 0.6 --max-concurrency "$n" --no-plots --disable-tqdm \
          --output-dir "$RUNS/$name" --label "$name" > "$RUNS/$name.log" 2>&1
        echo "$name $(grep -hE "^requests:|^throughput:|^ *(TTFT|ITL|TPOT) ms" "$RUNS/$name.log" \
          | tr -s ' ' | tr '\n' ';')" | tee -a "$LOG"
      done
      kill "$server"; wait "$server" 2>/dev/null
    fi
  done
done
tar czf "$OUT/compare.tgz" -C "$OUT" runs && rm -rf "$RUNS"
