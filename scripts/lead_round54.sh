# Lead round 54 (session 11): round 53 again after the gather index fix (Triton refused an int64 branch). The int4 kernels gather an act-order input as they
# load it. Every GPU test (with the kernels' gather test), the gather's cost per layer again
# (scripts/act_order_cost.py: now in-kernel), and W3-8b with int4 in order (3.494 ms in
# session 10: the kernels' in-order code must not have moved).
#   DEADLINE_S=560 bash scripts/lead_round54.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 300
echo "== act-order gather cost ($(left) s left)" | tee -a "$LOG"
timeout 120 python3 scripts/act_order_cost.py --json "$OUT/act_order_cost.json" 2>&1 \
  | grep -v Warning | tail -20 | tee -a "$LOG"
latency w3_8b_int4 W3-8b --quantization int4
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
