"""Step time of a batch with some rows under a JSON schema vs the same batch unconstrained.

    python scripts/structured_overhead_bench.py --model llama-3.1-8b --load-format dummy \
        --tokenizer TOKENIZER_FOLDER --batch 64 --constrained-fraction 0.25

Dummy weights of a real shape; the grammar uses the given tokenizer's vocabulary (masks are sized
to the model's vocabulary). Each run: prefill the batch, then time decode steps (engine.step,
which includes the bitmask fill overlapped with the forward and the one-launch application).
Unconstrained and constrained runs alternate; medians are reported. Also the compile time of
the 20-field schema (cold: a fresh compiler).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grammar_library_bench import SCHEMA  # noqa: E402

from ladle.config import EngineConfig  # noqa: E402
from ladle.engine.engine_core import EngineCore  # noqa: E402
from ladle.engine.messages import EngineCoreRequest  # noqa: E402
from ladle.sampling_params import SamplingParams  # noqa: E402
from ladle.structured.params import StructuredOutputsParams  # noqa: E402


def run_batch(engine: EngineCore, batch: int, num_constrained: int, steps: int, tag: str):
    structured = StructuredOutputsParams(json=SCHEMA)
    for index in range(batch):
        params = SamplingParams(
            temperature=0, max_tokens=steps + 4, ignore_eos=True,
            structured_outputs=structured if index < num_constrained else None,
        )
        engine.add_request(EngineCoreRequest(
            request_id=f"{tag}-{index}", prompt_token_ids=[(index * 37 + j) % 1000 + 10
                                                          for j in range(64)],
            sampling_params=params,
        ))
    # Prefill (and grammar compile: cached after the first constrained run) until all decode.
    while engine.structured_outputs.num_waiting or any(
        r.num_output_tokens == 0 for r in engine.scheduler.requests.values()
    ):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    engine.abort_requests([f"{tag}-{index}" for index in range(batch)])
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--constrained-fraction", type=float, default=0.25)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    config = EngineConfig.from_kwargs(
        model=args.model, load_format=args.load_format, tokenizer=args.tokenizer
    )
    engine = EngineCore(config)
    assert engine.structured_outputs is not None
    compiler = engine.structured_outputs.compiler
    compiler.ll_tokenizer()
    compile_times = []
    for round_index in range(5):
        schema = dict(SCHEMA, title=f"round {round_index}")  # a new grammar each time
        start = time.perf_counter()
        compiler.submit(StructuredOutputsParams(json=schema).to_grammar()).result()
        compile_times.append(time.perf_counter() - start)
    num_constrained = int(args.batch * args.constrained_fraction)
    results = {"plain": [], "constrained": []}
    run_batch(engine, args.batch, num_constrained, 6, "warm")
    for round_index in range(args.rounds):
        results["plain"].append(run_batch(engine, args.batch, 0, args.steps, f"p{round_index}"))
        results["constrained"].append(
            run_batch(engine, args.batch, num_constrained, args.steps, f"c{round_index}")
        )
    plain = statistics.median(results["plain"])
    constrained = statistics.median(results["constrained"])
    summary = {
        "model": args.model, "batch": args.batch, "num_constrained": num_constrained,
        "vocab_size": compiler.vocab_size,
        "plain_step_ms": plain * 1e3, "constrained_step_ms": constrained * 1e3,
        "overhead_percent": (constrained / plain - 1) * 100,
        "schema_compile_ms_median": statistics.median(compile_times) * 1e3,
        "rounds": results,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
