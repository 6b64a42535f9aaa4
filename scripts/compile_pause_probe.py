"""Which engine steps compile Triton kernels after the start-up warm-up, and how long they take.

    python scripts/compile_pause_probe.py --model qwen3-0.6b --max-num-batched-tokens 512

The GPU serving proofs (docs/benchmarks.md, issue 9) saw ~1 s server-wide pauses on the first
mixed steps of each new shape. This drives the engine as a server at a steady arrival rate does
(one new request every few steps, random prompt lengths, the running count climbing to
--max-num-seqs), and after every step counts the compiled variants of every Triton kernel under
ladle.kernels: it prints each step that compiled something (which kernels, how long the step
took) and the totals. A warm-up that covers every launch shape prints no such step.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import random
import sys
import time


def _jit_functions() -> dict[str, object]:
    import triton

    import ladle.kernels

    found = {}
    for info in pkgutil.iter_modules(ladle.kernels.__path__):
        module = importlib.import_module(f"ladle.kernels.{info.name}")
        for name, value in vars(module).items():
            value = getattr(value, "fn", value)  # an autotuned kernel wraps its JITFunction
            if isinstance(value, triton.runtime.jit.JITFunction):
                found[f"{info.name}.{name}"] = value
    return found


def _num_variants(function) -> int:
    """Compiled variants held by a JITFunction (Triton 3.x keeps one cache per device)."""
    total = 0
    for entry in getattr(function, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        total += len(cache) if hasattr(cache, "__len__") else 0
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--num-requests", type=int, default=96)
    parser.add_argument("--steps-between-arrivals", type=int, default=3)
    parser.add_argument("--slow-step-ms", type=float, default=100.0)
    args = parser.parse_args()

    from ladle.protocol.messages import EngineCoreRequest
    from ladle.entrypoints.llm import LLM
    from ladle.sampling_params import SamplingParams

    llm = LLM(
        args.model,
        load_format="dummy",
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
    )
    engine = llm.engine
    functions = _jit_functions()
    before = {name: _num_variants(f) for name, f in functions.items()}
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    added = steps = compiling_steps = 0
    paused_s = 0.0
    while added < args.num_requests or engine.has_unfinished_requests():
        if added < args.num_requests and steps % args.steps_between_arrivals == 0:
            prompt = [rng.randrange(1000, 20000) for _ in range(rng.randint(100, 300))]
            engine.add_request(
                EngineCoreRequest(
                    request_id=f"probe-{added}",
                    prompt_token_ids=prompt,
                    sampling_params=params,
                    eos_token_ids=(0,),
                )
            )
            added += 1
        started = time.perf_counter()
        engine.step()
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        steps += 1
        now = {name: _num_variants(f) for name, f in functions.items()}
        new = {name: now[name] - before[name] for name in now if now[name] > before[name]}
        before = now
        if new or elapsed_ms > args.slow_step_ms:
            compiling_steps += bool(new)
            paused_s += elapsed_ms / 1000.0
            running = engine.get_stats().num_running_reqs
            print(f"step {steps}: {elapsed_ms:.0f} ms, running {running}, new variants {new}")
    print(
        f"{steps} steps, {compiling_steps} compiled new Triton variants, "
        f"{paused_s:.1f} s in steps that compiled or took > {args.slow_step_ms:g} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
