# Lead round 47 (session 11): cuBLASLt only where K/128 is a multiple of 4 (torch 2.11 refuses
# other weight-scale layouts, round 46), Triton tiles at <= 16 rows below 8192 inputs;
# then the fp8 GPU tests and the per-layer bench with both GEMMs forced beside the choice.
#   DEADLINE_S=300 bash scripts/lead_round47.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
fp8_tests_and_block_bench
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
