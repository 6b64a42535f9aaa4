# Lead round 49 (session 11): act-order int4 checkpoints (an input gather per layer) and fp8
# block's lazy import. Every GPU test (the new act-order file among them), and what the gather
# costs per int4 layer of the 8B shape (scripts/act_order_cost.py).
#   DEADLINE_S=450 bash scripts/lead_round49.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 300
echo "== act-order gather cost ($(left) s left)" | tee -a "$LOG"
timeout 150 python3 scripts/act_order_cost.py --json "$OUT/act_order_cost.json" 2>&1 \
  | grep -v Warning | tail -20 | tee -a "$LOG"
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
