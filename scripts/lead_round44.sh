# Lead round 44 (session 11): block fp8 with cuBLASLt's block-scaled GEMM where the blocks are
# 128x128. Every GPU test (the new fp8 block tests among them), the per-layer bench again
# (scripts/fp8_block_bench.py: whole layer calls, as the model runs them), and one W2 pair,
# bf16 then fp8 + fp8 KV, against session 10's figures.
#   DEADLINE_S=580 bash scripts/lead_round44.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_tests_block_bench_w2_pair
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
