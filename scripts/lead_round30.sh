# Lead round 30 (session 8, call 7): W2 with and without PDL (LADLE_PDL=0), fp8 + fp8 KV and
# bf16, interleaved twice: does the PDL chain cost anything at large batches?
#   DEADLINE_S=585 bash scripts/lead_round30.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
export W2_JSON_DIR=/tmp
for run in a b; do
  w2_run fp8_pdl_$run --quantization fp8 --kv-cache-dtype fp8
  LADLE_PDL=0 w2_run fp8_nopdl_$run --quantization fp8 --kv-cache-dtype fp8
  w2_run bf16_pdl_$run
  LADLE_PDL=0 w2_run bf16_nopdl_$run
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
