# Lead round 45 (session 11): round 44 found the cuBLASLt probe refusing (it asked for a 4-column
# product, which cuBLASLt does not run), so no layer took cuBLASLt. The probe fixed: the fp8 GPU
# tests (one now asserts the probe on Hopper) and the per-layer bench again.
#   DEADLINE_S=300 bash scripts/lead_round45.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
fp8_tests_and_block_bench
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
