# Sourced by the lead's device-round scripts (lead_round*.sh), from the repo root of the device
# copy carrying .whl and .carry/tok: the output folder, the time left before DEADLINE_S, the
# server wheels on the path, the test tokenizer, and the round log headed by the GPU's name.
OUT=${OUT:-.device_out}
mkdir -p "$OUT"
start=$SECONDS
left() { echo $(( ${DEADLINE_S:-585} - (SECONDS - start) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
export LADLE_TEST_TOKENIZER=$PWD/.carry/tok
LOG=$OUT/round.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG"
