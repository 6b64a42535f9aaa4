#!/usr/bin/env bash
# Issue 8's remaining figures on merged main (one H100 call, ~9 min): W1 and W2 with the HF peer
# on their first 64 requests, S1 through `ladle serve` at 32/128/256 in flight (the server's
# step-time gauge scraped beside it), and the 8B start-up with graphs from an empty Triton cache.
# Run from the repo root of the device copy with .whl carried. Each part is bounded.
set -uo pipefail
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD/src:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
LOG=$OUT/figures.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
bench() { name=$1; limit=$2; shift 2; echo "== $name" | tee -a "$LOG"
  timeout "$limit" python3 -m ladle bench "$@" --no-progress --json "$OUT/$name.json" \
    > "/tmp/$name.log" 2>&1; grep -v Warning "/tmp/$name.log" | tail -16 | tee -a "$LOG"; }
bench w1 150 throughput --workload W1 --runs 2 --peer hf --peer-requests 64
bench w2 170 throughput --workload W2 --runs 1 --no-busy --peer hf --peer-requests 64
echo "== S1" | tee -a "$LOG"
python3 -m ladle serve qwen3-0.6b --load-format dummy --port 8123 > /tmp/s1_server.log 2>&1 &
server=$!
get() { python3 -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; }
for _ in $(seq 90); do get http://127.0.0.1:8123/health >/dev/null 2>&1 && break; sleep 1; done
for n in 32 128 256; do
  timeout 80 python3 -m ladle bench serve --base-url http://127.0.0.1:8123 --workload S1 \
    --token-ids --ignore-eos --temperature 0.6 --max-concurrency $n --no-plots --disable-tqdm \
    --output-dir "/tmp/s1_$n" --label "S1-$n" 2>&1 | grep -E "TTFT|ITL|throughput" | tee -a "$LOG"
  get http://127.0.0.1:8123/metrics | grep -E "^ladle:step_time_seconds" | tee -a "$LOG"
done
kill "$server"; wait "$server" 2>/dev/null
tar czf "$OUT/s1.tgz" -C /tmp s1_32 s1_128 s1_256 s1_server.log 2>/dev/null
echo "== 8B start-up with graphs, empty Triton cache" | tee -a "$LOG"
TRITON_CACHE_DIR=/tmp/cold_cache timeout 80 python3 scripts/startup_profile.py llama-3.1-8b \
  --load-format dummy --json "$OUT/startup_8b.json" 2>&1 | tail -12 | tee -a "$LOG"
