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

# The GPU tests of the step path: graphs (decode and prefill), split launch, overlap, parity, no
# compilation while serving; four pytest workers. Their summary goes to the round log.
step_path_tests() {
  timeout "${1:-200}" python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile \
    tests/gpu/test_prefill_graphs.py tests/gpu/test_cuda_graphs.py tests/gpu/test_split_launch_gpu.py \
    tests/gpu/test_no_compile_while_serving.py tests/gpu/test_gpu_parity.py tests/gpu/test_overlap_gpu.py \
    > "$OUT/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -12 | tee -a "$LOG"
}

# One S1 run through a fresh `ladle serve` (scripts/served_path_bench.py, its arguments after
# these), skipped when the deadline is near; its JSON line to the round log and served_path.jsonl.
s1() {
  [ "$(left)" -gt 60 ] || { echo "skipped (deadline): $*" | tee -a "$LOG"; return; }
  echo "== S1 $*" | tee -a "$LOG"
  timeout $(( $(left) - 10 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path "$@" --server real --client bench 2>&1 \
    | grep -v Warning | tail -1 | tee -a "$LOG"
}

# One S1 level through a fresh `ladle serve`, its arguments passed to served_path_bench (e.g.
# --server real --client bench --concurrency 256): prints the client-against-engine ITL line.
s1_level() {
  [ "$(left)" -gt 40 ] || { echo "skipped (deadline): $*" | tee -a "$LOG"; return; }
  timeout $(( $(left) - 5 )) python3 scripts/served_path_bench.py --json "$OUT/served_path.jsonl" \
    --log-dir /tmp/served_path "$@" 2>&1 | grep -E "^(real|api) x" | tee -a "$LOG"
}

# One W2 run (all 256 requests, one repeat), skipped near the deadline; $1 names the JSON
# ($OUT/w2_NAME.json), the rest go to `ladle bench throughput`. Its tok/s and ITL to the log.
w2_run() {
  [ "$(left)" -gt 60 ] || { echo "skipped W2 $1" | tee -a "$LOG"; return; }
  local name=$1; shift
  echo "== W2 all 256, $name ($(left) s left)" | tee -a "$LOG"
  timeout $(( $(left) - 5 < 110 ? $(left) - 5 : 110 )) python3 -m ladle bench throughput \
    --workload W2 --runs 1 --no-busy --no-progress "$@" --json "${W2_JSON_DIR:-$OUT}/w2_$name.json" 2>&1 \
    | grep -E "tok/s \(|ITL" | tee -a "$LOG"
}

# A gate on the kernel test files given (GATE_TIMEOUT_S, default 120 s): four workers, stop at
# the first failure, and end the round (exit 1) unless every test passed.
gpu_gate() {
  echo "== gate: $*" | tee -a "$LOG"
  timeout "${GATE_TIMEOUT_S:-120}" python3 -m pytest -q -p no:cacheprovider -x -n 4 "$@" \
    > "$OUT/gate.log" 2>&1
  tail -3 "$OUT/gate.log" | tee -a "$LOG"
  grep -q " passed" "$OUT/gate.log" && ! grep -qE "[0-9]+ (failed|error)" "$OUT/gate.log" || exit 1
}

# Every GPU test file, four workers (the fp8 budget test deselected: it sizes from memory other
# workers hold); the summary to the round log.
all_gpu_tests() {
  echo "== all GPU tests" | tee -a "$LOG"
  timeout "${1:-250}" python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile tests/gpu \
    --deselect tests/gpu/test_fp8_kv_cache.py::test_fp8_budget_sizes_blocks_at_half_the_bf16_bytes \
    > "$OUT/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -15 | tee -a "$LOG"
}

# One `ladle bench latency` of three runs, skipped near the deadline: $1 names it, $2 is the
# workload, the rest go to the bench. Its ITL line to the log.
latency() {
  local name=$1 workload=$2; shift 2
  [ "$(left)" -gt 60 ] || { echo "skipped $name" | tee -a "$LOG"; return; }
  echo "== $name ($(left) s left)" | tee -a "$LOG"
  timeout 70 python3 -m ladle bench latency --workload "$workload" --runs 3 --no-busy --no-progress \
    "$@" --json "/tmp/$name.json" 2>&1 | grep -E "ITL" | tee -a "$LOG"
}

# The fp8 GPU test files (block fp8, the fp8 matmul, the quantized layers and checkpoints) and
# the per-layer bench of block fp8 against per-channel fp8 and bf16 (scripts/fp8_block_bench.py):
# the tests' summary and the bench's rows to the round log, the bench's JSON to $OUT.
fp8_tests_and_block_bench() {
  echo "== fp8 GPU tests" | tee -a "$LOG"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 --dist loadfile \
    tests/gpu/test_fp8_blocks_gpu.py tests/gpu/test_fp8_matmul.py tests/gpu/test_quant_kernels.py \
    > "$OUT/fp8_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/fp8_tests.log" | tail -15 | tee -a "$LOG"
  echo "== fp8 block bench ($(left) s left)" | tee -a "$LOG"
  timeout 120 python3 scripts/fp8_block_bench.py --json "$OUT/fp8_block.json" \
    2>&1 | tee "$OUT/fp8_block.log" | tail -40 >> "$LOG"
}

# Every GPU test, the block fp8 bench, and one W2 pair, bf16 then fp8 + fp8 KV (their JSON to
# $OUT): the whole-code round of session 11 (rounds 44 and 48).
all_tests_block_bench_w2_pair() {
  all_gpu_tests 230
  echo "== fp8 block bench ($(left) s left)" | tee -a "$LOG"
  timeout 120 python3 scripts/fp8_block_bench.py --json "$OUT/fp8_block.json" \
    2>&1 | tee "$OUT/fp8_block.log" | tail -40 >> "$LOG"
  W2_JSON_DIR=$OUT
  w2_run bf16
  w2_run fp8 --quantization fp8 --kv-cache-dtype fp8
}
