# Lead round 32 (session 8, call 10): the fp8 batch-256 decode step's kernels at the final code,
# and per_token_quant's warps at the 8B's o / down input widths.
#   DEADLINE_S=200 bash scripts/lead_round32.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
timeout 60 python3 scripts/per_token_quant_warps.py 2>&1 | grep -v Warning | tee -a "$LOG"
timeout 80 python3 scripts/decode_kernel_profile.py --batch 256 --prompt-len 600 --steps 10 --top 25 \
  --quantization fp8 --kv-cache-dtype fp8 > "$OUT/prof_fp8_256.json" 2> /tmp/prof.err
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
