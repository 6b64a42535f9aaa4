# Lead round 40 (session 9, after the review): every GPU test file at the final commit (the
# per-token rule moved to kernels/per_token_rule.py, store_quantized_row absorbed quantize_row,
# make_kv_caches takes the arch config).
#   DEADLINE_S=300 bash scripts/lead_round40.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 280
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
