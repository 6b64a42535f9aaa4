# Lead round 35 (session 9, the final call): every GPU test file, W3-8b int4, W3 0.6B, one more
# W2 fp8+fp8 KV / bf16 pair (call 2 measured three at the same model code), W1, and the fp8
# batch-256 step's kernels if time is left.
#   DEADLINE_S=585 bash scripts/lead_round35.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 260
latency w3_8b_int4 W3-8b --quantization int4
latency w3_bf16 W3
W2_JSON_DIR=/tmp
w2_run fp8_d --quantization fp8 --kv-cache-dtype fp8
w2_run bf16_d
if [ "$(left)" -gt 80 ]; then
  echo "== W1 ($(left) s left)" | tee -a "$LOG"
  timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) python3 -m ladle bench throughput \
    --workload W1 --runs 2 --no-busy --no-progress --json /tmp/w1.json 2>&1 \
    | grep -E "tok/s \(|ITL" | tee -a "$LOG"
fi
if [ "$(left)" -gt 45 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/decode_kernel_profile.py --batch 256 --prompt-len 600 \
    --steps 10 --top 25 --quantization fp8 --kv-cache-dtype fp8 > "$OUT/prof_fp8_256.json" 2> /tmp/prof.err
fi
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
