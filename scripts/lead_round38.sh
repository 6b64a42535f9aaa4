# Lead round 38 (session 9, call 6): W3 on the 0.6B shape read 1.84 and 1.59 ms in call 5 after
# the W2 runs (1.02-1.52 earlier this session, bimodal for old and new code alike): what else runs
# on the machine, then W3 at this code and at the session's start (.ab/old/src), interleaved.
#   DEADLINE_S=300 bash scripts/lead_round38.sh     (carry .whl, .carry/tok and .ab)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
{ nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  ps -eo pid,pcpu,etime,args --sort=-pcpu | head -12; nproc; uptime; } 2>&1 | cut -c1-160 | tee -a "$LOG"
NEW_PATH=$PYTHONPATH
OLD_PATH=$PWD/.ab/old/src:$PYTHONPATH
for run in a b c; do
  PYTHONPATH=$NEW_PATH latency w3_new_$run W3
  PYTHONPATH=$OLD_PATH latency w3_old_$run W3
done
{ uptime; ps -eo pid,pcpu,etime,args --sort=-pcpu | head -6; } 2>&1 | cut -c1-160 | tee -a "$LOG"
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
