#!/usr/bin/env bash
# Helper t12f, 2026-11-23 (issue 12, W2 with fp8 weights + fp8 KV): the per-token activation
# quantization fused into RMSNorm and SiLU-and-mul (quant/input_fusion.py). Its GPU tests beside
# the fp8 kernel and layer tests; the fused kernels against the unfused pairs alone; the batch-64
# fp8 decode step kernel by kernel with the fusion and without (LADLE_FUSED_ACTIVATION_QUANT=0);
# W2 (all 256 requests) with fp8 weights + fp8 KV with the fusion, bf16 in the same run, then
# fp8 without the fusion while time is left.
#   bash scripts/t12f_round.sh     (from a repo root with .whl/ and .carry/tok; ~8 minutes)
set -uo pipefail
export DEADLINE_S=${DEADLINE_S:-470}
source "$(dirname "$0")/lead_round_env.sh"

echo "== GPU tests: fused activation quantization, quant kernels and layers, fp8 GEMM" | tee -a "$LOG"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE -n 3 tests/gpu/test_fused_activation_quant_gpu.py \
  tests/gpu/test_quant_kernels.py tests/gpu/test_fp8_matmul.py > "$OUT/t12f_tests.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/t12f_tests.log" | tail -12 | tee -a "$LOG"

echo "== kernels alone: producer + per_token_quant vs the fused launch (us per call, graph)" | tee -a "$LOG"
timeout 60 python3 scripts/fused_quant_bench.py --rows 1 16 64 256 2>"$OUT/fused_quant_bench.err" \
  | tee "$OUT/fused_quant_bench.jsonl" | tee -a "$LOG"

# The batch-64 fp8 step kernel by kernel: step totals, then the norm / activation / quantization
# kernels and the five largest.
profile() {  # $1: name, $2: LADLE_FUSED_ACTIVATION_QUANT
  [ "$(left)" -gt 50 ] || { echo "skipped (deadline): profile $1" | tee -a "$LOG"; return; }
  echo "== profile batch 64, fp8 + fp8 KV, $1" | tee -a "$LOG"
  LADLE_FUSED_ACTIVATION_QUANT=$2 timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) \
    python3 scripts/decode_kernel_profile.py --batch 64 --prompt-len 900 --steps 20 \
    --quantization fp8 --kv-cache-dtype fp8 --top 40 2>"$OUT/prof64_$1.err" > "$OUT/prof64_$1.json"
  python3 - "$OUT/prof64_$1.json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
profile = json.load(open(sys.argv[1]))
print({key: value for key, value in profile.items() if key != "kernels"})
for row in profile["kernels"]:
    if any(part in row["kernel"] for part in ("quant", "norm", "silu")):
        print("  ", row)
for row in profile["kernels"][:5]:
    print("   top:", row)
EOF
}

# One W2 run (all 256 requests); $1: name, $2: LADLE_FUSED_ACTIVATION_QUANT, the rest: options.
w2() {
  [ "$(left)" -gt 60 ] || { echo "skipped (deadline): W2 $1" | tee -a "$LOG"; return; }
  local name=$1 switch=$2
  shift 2
  echo "== W2 all 256, $name" | tee -a "$LOG"
  LADLE_FUSED_ACTIVATION_QUANT=$switch timeout $(( $(left) - 5 < 110 ? $(left) - 5 : 110 )) \
    python3 -m ladle bench throughput --workload W2 --runs 1 --no-busy --no-progress "$@" \
    --json "$OUT/w2_$name.json" 2>&1 | grep -E "tok/s|floor|ITL|TTFT|start" | tee -a "$LOG"
}

profile fused 1
w2 fp8_fused 1 --quantization fp8 --kv-cache-dtype fp8
w2 bf16 1
profile unfused 0
w2 fp8_unfused 0 --quantization fp8 --kv-cache-dtype fp8
echo "elapsed $((SECONDS - start)) s" | tee -a "$LOG"
