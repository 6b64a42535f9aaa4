# Lead round 42 (session 10, the machine of round 41 still warm): two more W2 fp8+fp8 KV / bf16
# pairs interleaved (three with round 41's), W1, and W3 (0.6B) at the session's final model code.
#   DEADLINE_S=400 bash scripts/lead_round42.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
W2_JSON_DIR=/tmp
for run in b c; do
  w2_run bf16_$run
  w2_run fp8_$run --quantization fp8 --kv-cache-dtype fp8
done
if [ "$(left)" -gt 80 ]; then
  echo "== W1 ($(left) s left)" | tee -a "$LOG"
  timeout $(( $(left) - 5 )) python3 -m ladle bench throughput --workload W1 --runs 2 --no-busy \
    --no-progress 2>&1 | grep -E "tok/s \(|ITL" | tee -a "$LOG"
fi
latency w3_a W3
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
