"""Where one batched decode step of the default model goes on the CPU: wall-clock timers
around the parts of the step (the 4-bit matmuls, the LM head, attention, norms, rotary and
cache write, the activation, the sampler), the rest of the step being Python/host work.

    OMP_NUM_THREADS=2 PYTHONPATH=src python scripts/profile_cpu_decode_step.py --batch 32

Only decode-only steps are counted (prefill steps are skipped). Timers add ~1 us per wrapped
call (~250 calls a step).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from ladle import LLM, SamplingParams
from ladle.engine.engine_core import EngineCore
from ladle.model.default_model import resolve_default_model
from ladle.model.layers import quantized_linear
from ladle.model.layers.activation import SiluAndMul
from ladle.model.layers.attention import Attention
from ladle.model.layers.embedding import VocabEmbedding
from ladle.model.layers.norm import RMSNorm
from ladle.model.models import llama
from ladle.worker.model_runner import ModelRunner

totals: dict[str, float] = collections.defaultdict(float)
state = {"decode": False, "steps": 0}


def timed(key, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            if state["decode"]:
                name = key(*args) if callable(key) else key
                totals[name] += time.perf_counter() - started

    return wrapper


def matmul_key(x, weight, bias=None):
    return "LM head" if weight.num_rows > 10_000 else "4-bit matmuls"


def install_timers() -> None:
    quantized_linear.group_quantized_matmul = timed(
        matmul_key, quantized_linear.group_quantized_matmul
    )
    llama.rotate_and_cache = timed("rotary + cache write", llama.rotate_and_cache)
    llama.cpu_decode_stack = timed("decoder stack (one C call)", llama.cpu_decode_stack)
    Attention.attend_cached = timed("attention", Attention.attend_cached)
    RMSNorm.forward = timed("norms", RMSNorm.forward)
    SiluAndMul.forward = timed("SiLU and mul", SiluAndMul.forward)
    VocabEmbedding.forward = timed("embedding", VocabEmbedding.forward)
    ModelRunner.sample = timed("sampler + host copy", ModelRunner.sample)
    original_launch = ModelRunner.launch_forward

    def launch(self, scheduler_output, *args, **kwargs):
        state["decode"] = scheduler_output.num_prefill_tokens == 0
        return timed("forward + logits (launch_forward)", original_launch)(
            self, scheduler_output, *args, **kwargs
        )

    ModelRunner.launch_forward = launch
    original_step = EngineCore.step

    def step(self, *args, **kwargs):
        started = time.perf_counter()
        result = original_step(self, *args, **kwargs)
        if state["decode"]:
            totals["whole step"] += time.perf_counter() - started
            state["steps"] += 1
        state["decode"] = False
        return result

    EngineCore.step = step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quantization", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_timers()
    llm = LLM(model=str(resolve_default_model()), quantization=args.quantization)
    prompts = [list(range(1000 + 64 * i, 1064 + 64 * i)) for i in range(args.batch)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    per_repeat: list[dict[str, float]] = []
    for _ in range(args.repeats):
        totals.clear()
        state["steps"] = 0
        llm.generate(prompts, params, use_tqdm=False)
        llm.engine.kv_cache_manager.reset_prefix_cache()
        steps = state["steps"]
        per_repeat.append({name: seconds * 1e3 / steps for name, seconds in totals.items()})
    names = [name for name in per_repeat[0] if name != "whole step"]
    medians = {n: statistics.median(r.get(n, 0.0) for r in per_repeat) for n in per_repeat[0]}
    inner = ("forward + logits (launch_forward)", "sampler + host copy")
    parts = [n for n in names if n not in inner]
    medians["Python/host (rest of the step)"] = medians["whole step"] - sum(
        medians[n] for n in parts + ["sampler + host copy"]
    )
    step_ms = medians["whole step"]
    print(f"batch {args.batch}, {args.quantization}, {args.threads} threads, ms per decode step")
    print("| part | ms/step | share |")
    print("|---|---|---|")
    for name in parts + ["sampler + host copy", "Python/host (rest of the step)", "whole step"]:
        print(f"| {name} | {medians[name]:.1f} | {100 * medians[name] / step_ms:.0f}% |")
    print(f"({args.batch * 1e3 / step_ms:.1f} tok/s in these steps)")


if __name__ == "__main__":
    main()
