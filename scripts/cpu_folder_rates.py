"""Generated tok/s of ladle on the CPU at batch 1 and batch 32, for each MODEL[@quantization]
given (a folder, a .gguf file, or either with a --quantization): one prompt, greedy, ignore_eos;
each run listed, and the median. docs/benchmarks.md, "Quantized folders on the CPU".

    B1_TOKENS=16 B32_TOKENS=8 RUNS=3 python scripts/cpu_folder_rates.py FOLDER GGUF@int4 ...
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from ladle import LLM, SamplingParams

PROMPT = [1, 504, 3458, 314, 4756, 282, 4649, 30, 2]


def tokens_per_second(llm: LLM, num_prompts: int, max_tokens: int) -> float:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    started = time.perf_counter()
    outputs = llm.generate([PROMPT] * num_prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    llm.engine.kv_cache_manager.reset_prefix_cache()
    return sum(len(output.outputs[0].token_ids) for output in outputs) / elapsed


def describe(rates: list[float]) -> str:
    runs = ", ".join(f"{rate:.1f}" for rate in rates)
    return f"{statistics.median(rates):.1f} ({runs}) tok/s"


def main() -> None:
    batch1_tokens = int(os.environ.get("B1_TOKENS", 64))
    batch32_tokens = int(os.environ.get("B32_TOKENS", 32))
    runs = int(os.environ.get("RUNS", 3))
    for spec in sys.argv[1:]:
        model, _, quantization = spec.partition("@")
        llm = LLM(model, **({"quantization": quantization} if quantization else {}))
        tokens_per_second(llm, 1, 4)  # warm-up
        batch1 = [tokens_per_second(llm, 1, batch1_tokens) for _ in range(runs)]
        batch32 = [tokens_per_second(llm, 32, batch32_tokens) for _ in range(runs)]
        print(f"RESULT {spec}: batch 1 {describe(batch1)}, batch 32 {describe(batch32)}")
        del llm


if __name__ == "__main__":
    main()
