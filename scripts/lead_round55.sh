# Lead round 55 (session 13): `ladle quantize --tune-steps` on CUDA
# (tests/gpu/test_scale_tuning_gpu.py) first, then every other GPU test at the session's code.
#   DEADLINE_S=560 bash scripts/lead_round55.sh     (carry .whl and .carry/tok)
set -uo pipefail
source "$(dirname "$0")/lead_round_env.sh"
python -m pytest -q -p no:cacheprovider tests/gpu/test_scale_tuning_gpu.py 2>&1 | tail -n 30 | tee -a "$LOG"
all_gpu_tests 300
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
