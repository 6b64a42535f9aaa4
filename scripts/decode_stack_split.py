"""Where the one-call decode stack's time goes at batch 1 on the CPU (the default model): the
stack's C call replayed on a real step's operands, beside its 4-bit matmuls alone (the same
weights and kernel, one row), the LM head alone, interleaved,
medians of --repeats.

    OMP_NUM_THREADS=2 PYTHONPATH=src python scripts/decode_stack_split.py

The step's operands are captured from the last decode step of a 128-token generation (context
~190); replaying it rewrites that step's cache slot with the same values.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ladle import LLM, SamplingParams
from ladle.kernels.cpu_native.build import kernel_threads, native_library
from ladle.kernels.cpu_native.decode_stack import PROJECTIONS, DecodeStackWeights
from ladle.kernels.cpu_native.gemv import activation_bits
from ladle.model.default_model import resolve_default_model

captured: dict[str, tuple] = {}


def capture_calls() -> None:
    original = DecodeStackWeights.call

    def call(weights, *args):
        captured["last"] = (weights, args)
        return original(weights, *args)

    DecodeStackWeights.call = call


def median_ms(function, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - started) * 1e3 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    capture_calls()
    llm = LLM(model=str(resolve_default_model()))
    prompt = [list(range(1000, 1064))]
    greedy = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    llm.generate(prompt, greedy, use_tqdm=False)
    weights, step_args = captured["last"]
    model = llm.engine.executor.worker.model
    library, threads, bits = native_library(), kernel_threads(), activation_bits()
    hidden = step_args[0]

    def stack() -> None:
        weights.call(*step_args)

    layers = weights.keep_alive[0]
    operands = []
    for layer in layers:
        for name in PROJECTIONS:
            projection = getattr(layer, name)
            num_rows = projection.codes.shape[0]
            width = projection.codes.shape[1] * 2
            operands.append((projection, torch.randn(1, width), torch.empty(1, num_rows)))

    def matmuls() -> None:
        for projection, x, y in operands:
            library.ladle_q4_int8_gemm(
                x.data_ptr(), 1, x.shape[1], bits, projection.codes.data_ptr(),
                projection.scale.data_ptr(),
                0 if projection.offset is None else projection.offset.data_ptr(),
                int(projection.scale.dtype == torch.float16),
                0 if projection.bias is None else projection.bias.data_ptr(), y.data_ptr(),
                y.shape[1], threads,
            )  # fmt: skip

    def head() -> None:
        model.compute_logits(hidden)

    parts = {"stack (one C call)": stack, "120 4-bit matmuls alone": matmuls, "LM head": head}
    results: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.repeats):
        for name, function in parts.items():
            results[name].append(median_ms(function, args.calls))
    print(f"ms per call, medians of {args.repeats} (each the mean of {args.calls} calls)")
    for name, values in results.items():
        shown = ", ".join(f"{value:.2f}" for value in values)
        print(f"| {name} | {statistics.median(values):.2f} | {shown} |")


if __name__ == "__main__":
    main()
