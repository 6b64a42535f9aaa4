# Lead round 46 (session 11): the cuBLASLt weight scales as torch 2.11 checks them ([K/128, N/128]
# column-major, columns padded to 16 bytes; round 45 padded the shape itself and was refused),
# then the fp8 GPU tests and the per-layer bench with both GEMMs forced beside the choice.
#   DEADLINE_S=300 bash scripts/lead_round46.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
fp8_tests_and_block_bench
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
