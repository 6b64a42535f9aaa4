# Lead round 48 (session 11, final code): per-token quantization now runs the per-group kernel
# (one group as wide as the row), so every fp8/int8 GPU path changed. Every GPU test, the block
# bench once more, and a W2 pair (bf16, then fp8 + fp8 KV) against round 44's 1.412x.
#   DEADLINE_S=580 bash scripts/lead_round48.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_tests_block_bench_w2_pair
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
