# Lead round 56 (session 14): time and GPU memory of `ladle quantize --tune-steps` on the 8B
# shape with random weights (scripts/tuning_memory_probe.py), fp8 then int4.
#   DEADLINE_S=560 bash scripts/lead_round56.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
for method in fp8 int4; do
  echo "== $method" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 scripts/tuning_memory_probe.py llama-3.1-8b --method $method \
    --steps 4 --windows 8 --json "$OUT/tuning_$method.json" 2>&1 | grep -v Warning | tail -6 | tee -a "$LOG"
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
