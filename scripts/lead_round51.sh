# Lead round 51 (session 11): int4 checkpoints in groups of 32, 64, 256 and per channel. Every GPU
# test at the final code.
#   DEADLINE_S=400 bash scripts/lead_round51.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 300
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
