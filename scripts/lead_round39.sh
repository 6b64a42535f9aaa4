# Lead round 39 (session 9, call 7): W3 (0.6B, bf16, batch 1) again, four interleaved rounds of
# the session's start (.ab/old/src), this code with float32 logits (.ab/mid/src: the runner's
# one-line change undone) and this code, the order rotated each round.
#   DEADLINE_S=300 bash scripts/lead_round39.sh     (carry .whl, .carry/tok and .ab)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
BASE=$PYTHONPATH
declare -A TREE=([old]=$PWD/.ab/old/src: [mid]=$PWD/.ab/mid/src: [new]=)
for order in "old mid new" "new old mid" "mid new old" "old new mid"; do
  for name in $order; do
    PYTHONPATH=${TREE[$name]}$BASE latency w3_$name W3
  done
done
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
