# Lead round 36 (session 9, call 4): the no-compile-while-serving test after the warm-up fix, then
# an A/B of the 0.6B bf16 workloads (W3, W1) between this code and the session's start (beed8fb,
# carried as .ab/old/src), interleaved: call 3 read W3 1.224 ms and W1 18,232 tok/s on a machine
# that gave W3-8b int4 the same 3.53 ms as last session's 1.021 ms and 19,026 machine.
#   DEADLINE_S=585 bash scripts/lead_round36.sh     (carry .whl, .carry/tok and .ab)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE -n 2 tests/gpu/test_no_compile_while_serving.py \
  > "$OUT/gate.log" 2>&1
tail -3 "$OUT/gate.log" | tee -a "$LOG"
NEW_PATH=$PYTHONPATH
OLD_PATH=$PWD/.ab/old/src:$PYTHONPATH
for run in a b; do
  PYTHONPATH=$NEW_PATH latency w3_new_$run W3
  PYTHONPATH=$OLD_PATH latency w3_old_$run W3
done
w1() {
  [ "$(left)" -gt 70 ] || { echo "skipped W1 $1" | tee -a "$LOG"; return; }
  echo "== W1 $1 ($(left) s left)" | tee -a "$LOG"
  timeout 65 python3 -m ladle bench throughput --workload W1 --runs 1 --no-busy --no-progress \
    --json /tmp/w1_$1.json 2>&1 | grep -E "tok/s \(|ITL" | tee -a "$LOG"
}
for run in a b; do
  PYTHONPATH=$NEW_PATH w1 new_$run
  PYTHONPATH=$OLD_PATH w1 old_$run
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
