# Lead round 54 (session 12): `ladle quantize --rotate` calibrated on CUDA
# (tests/gpu/test_rotation_gpu.py) and every other GPU test at the session's code.
#   DEADLINE_S=560 bash scripts/lead_round54.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
all_gpu_tests 300
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
