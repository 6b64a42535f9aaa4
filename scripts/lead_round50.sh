# Lead round 50 (session 11): down's act-order gather folded into gate_up's rows. Every GPU
# test at the final code.
#   DEADLINE_S=400 bash scripts/lead_round50.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 300
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
