# Lead round 52 (session 11): vLLM's format names, gptq_v2, act-order written by ladle quantize. Every GPU
# test at the final code.
#   DEADLINE_S=400 bash scripts/lead_round52.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 300
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
