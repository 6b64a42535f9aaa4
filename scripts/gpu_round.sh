#!/usr/bin/env bash
# One GPU call on a tree: every GPU test (the step-path ones first, so a cut-off still covers
# them), then W1 and S1 (a fresh `ladle serve` per level, 32/128/256 in flight) in what time is
# left before DEADLINE_S. Run from the repo root of the device copy; .whl/ (the server stack's
# wheels, installed into /tmp/site) and .carry/tok (a tokenizer folder for the tests) are used
# when carried. Everything lands under $OUT; the summary in $OUT/round.log.
#   DEADLINE_S=540 bash scripts/gpu_round.sh
set -uo pipefail
DEADLINE_S=${DEADLINE_S:-540}
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $(( DEADLINE_S - (SECONDS - start) )); }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
[ -d .carry/tok ] && export LADLE_TEST_TOKENIZER=$PWD/.carry/tok
LOG=$OUT/round.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
first=${FIRST_FILES:-"tests/gpu/test_gpu_parity.py tests/gpu/test_overlap_gpu.py tests/gpu/test_cuda_graphs.py
  tests/gpu/test_prefill_graphs.py tests/gpu/test_split_launch_gpu.py tests/gpu/test_fp8_kv_cache.py
  tests/gpu/test_int4_decode.py tests/gpu/test_no_compile_while_serving.py tests/gpu/test_structured_step_gpu.py"}
timeout "${FIRST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -rfs --durations=12 $first 2>&1 \
  | tail -60 > "$OUT/gpu_tests_first.log"; tail -6 "$OUT/gpu_tests_first.log" | tee -a "$LOG"
rest=$(ls tests/gpu/test_*.py | grep -v -F "$(echo $first | tr ' ' '\n')")
[ "${REST_TIMEOUT:-150}" -gt 0 ] && timeout "${REST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -rfs --durations=12 $rest 2>&1 \
  | tail -60 > "$OUT/gpu_tests_rest.log"; tail -6 "$OUT/gpu_tests_rest.log" | tee -a "$LOG"
if [ "${W1_RUNS:-2}" -gt 0 ] && [ "$(left)" -gt 100 ]; then
  echo "== W1" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 -m ladle bench throughput --workload W1 --runs "${W1_RUNS:-2}" \
    --no-progress --json "$OUT/w1.json" > /tmp/w1.log 2>&1
  grep -v Warning /tmp/w1.log | tail -16 | tee -a "$LOG"
fi
# S1 at each concurrency on a fresh server: the levels share S1's seeded prompts, and a server
# that kept its prefix cache would serve the later levels' prompts from it.
get() { python3 -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; }
for n in ${S1_LEVELS:-32 128 256}; do
  [ "$(left)" -gt 60 ] || break
  echo "== S1 $n in flight" | tee -a "$LOG"
  python3 -m ladle serve qwen3-0.6b --load-format dummy --port 8123 > "/tmp/s1_server_$n.log" 2>&1 &
  server=$!
  for _ in $(seq 90); do get http://127.0.0.1:8123/health >/dev/null 2>&1 && break; sleep 1; done
  timeout $(( $(left) - 10 )) python3 -m ladle bench serve --base-url http://127.0.0.1:8123 \
    --workload S1 --token-ids --ignore-eos --temperature 0.6 --max-concurrency $n --no-plots \
    --disable-tqdm --output-dir "/tmp/s1_$n" --label "S1-$n" > "/tmp/s1_$n.log" 2>&1
  grep -E "TTFT|ITL|TPOT|hroughput|server:" "/tmp/s1_$n.log" | tee -a "$LOG"
  get http://127.0.0.1:8123/metrics | grep -E "^ladle:step_time_seconds" | tee -a "$LOG"
  grep -iE "graph|memory" "/tmp/s1_server_$n.log" | head -4 | tee -a "$LOG"
  kill "$server"; wait "$server" 2>/dev/null
done
tar czf "$OUT/s1.tgz" -C /tmp $(cd /tmp && ls -d s1_* 2>/dev/null) 2>/dev/null
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
