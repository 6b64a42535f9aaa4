# Lead round 33 (session 8, call 11): the runner hands the sampler bf16 logits, per_token_quant
# on 16 warps from 4096 columns. Every GPU test file, then one W2 fp8 / bf16 pair and W1.
#   DEADLINE_S=240 bash scripts/lead_round33.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
export W2_JSON_DIR=/tmp
all_gpu_tests 130
w2_run fp8 --quantization fp8 --kv-cache-dtype fp8
w2_run bf16
if [ "$(left)" -gt 50 ]; then
  echo "== W1 ($(left) s left)" | tee -a "$LOG"
  timeout $(( $(left) - 3 )) python3 -m ladle bench throughput --workload W1 --runs 1 --no-busy \
    --no-progress --json /tmp/w1.json 2>&1 | grep -E "tok/s \(|ITL" | tee -a "$LOG"
fi
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
