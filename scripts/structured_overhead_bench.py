"""Step time of a batch with some rows under a JSON schema vs the same batch unconstrained.

    python scripts/structured_overhead_bench.py --model llama-3.1-8b --load-format dummy \
        --tokenizer TOKENIZER_FOLDER --batch 64 --constrained-fraction 0.25

Dummy weights of a real shape; the grammar uses the given tokenizer's vocabulary (masks are sized
to the model's vocabulary). Each run: prefill the batch, then time decode steps (engine.step,
which includes the grammar job overlapped with the forward and the one-launch application).
Unconstrained and constrained runs alternate (the order flips every round); medians are
reported. In the constrained runs it also times, per step, the engine thread's own grammar
work: starting the job, accepting the tokens, and waiting for the job after the logits (time
the masks were not ready yet), and the job's own length on the worker thread. Also the compile
time of the 20-field schema (cold: a new grammar each time, llguidance's tokenizer built).
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
from ladle.structured.manager import PendingGrammarBitmask  # noqa: E402
from ladle.structured.params import StructuredOutputsParams  # noqa: E402


class HostTimes:
    """Wraps the manager's per-step entry points to time the engine thread's grammar work."""

    def __init__(self, manager) -> None:
        self.samples: dict[str, list[float]] = {"start": [], "accept": [], "wait": [], "job": []}
        self.enabled = False
        self._wrap(manager, "start_fill", "start")
        self._wrap(manager, "accept_tokens", "accept")
        self._wrap(manager, "_advance_and_fill", "job")
        original_wait = PendingGrammarBitmask.wait
        times = self

        def timed_wait(pending):
            start = time.perf_counter()
            try:
                return original_wait(pending)
            finally:
                if times.enabled:
                    times.samples["wait"].append(time.perf_counter() - start)

        PendingGrammarBitmask.wait = timed_wait

    def _wrap(self, manager, name: str, key: str) -> None:
        original = getattr(manager, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if self.enabled:
                    self.samples[key].append(time.perf_counter() - start)

        setattr(manager, name, timed)

    def medians_us(self) -> dict[str, float]:
        return {
            key: statistics.median(values) * 1e6 for key, values in self.samples.items() if values
        }


def run_batch(
    engine: EngineCore,
    batch: int,
    num_constrained: int,
    steps: int,
    tag: str,
    host_times: HostTimes | None = None,
):
    structured = StructuredOutputsParams(json=SCHEMA)
    for index in range(batch):
        params = SamplingParams(
            temperature=0,
            max_tokens=steps + 4,
            ignore_eos=True,
            structured_outputs=structured if index < num_constrained else None,
        )
        engine.add_request(
            EngineCoreRequest(
                request_id=f"{tag}-{index}",
                prompt_token_ids=[(index * 37 + j) % 1000 + 10 for j in range(64)],
                sampling_params=params,
            )
        )
    # Prefill (and grammar compile: cached after the first constrained run) until all decode.
    while engine.structured_outputs.num_waiting or any(
        r.num_output_tokens == 0 for r in engine.scheduler.requests.values()
    ):
        engine.step()
    times = []
    for step in range(steps):
        if host_times is not None:
            host_times.enabled = step >= 2 and num_constrained > 0
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    if host_times is not None:
        host_times.enabled = False
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
    results: dict[str, list[float]] = {"plain": [], "constrained": []}
    host_times = HostTimes(engine.structured_outputs)
    run_batch(engine, args.batch, num_constrained, 6, "warm")
    run_batch(engine, args.batch, 0, 6, "warm-plain")
    for round_index in range(args.rounds):
        order = [0, num_constrained] if round_index % 2 == 0 else [num_constrained, 0]
        for constrained_rows in order:
            kind = "constrained" if constrained_rows else "plain"
            results[kind].append(
                run_batch(
                    engine,
                    args.batch,
                    constrained_rows,
                    args.steps,
                    f"{kind}{round_index}",
                    host_times,
                )
            )
    plain = statistics.median(results["plain"])
    constrained = statistics.median(results["constrained"])
    # Paired per round (the two runs of a round are adjacent in time).
    paired = [c / p - 1 for p, c in zip(results["plain"], results["constrained"])]
    summary = {
        "model": args.model,
        "batch": args.batch,
        "num_constrained": num_constrained,
        "vocab_size": compiler.vocab_size,
        "plain_step_ms": plain * 1e3,
        "constrained_step_ms": constrained * 1e3,
        "overhead_percent": (constrained / plain - 1) * 100,
        "paired_overhead_percent_median": statistics.median(paired) * 100,
        "paired_overhead_percent": [x * 100 for x in paired],
        "engine_thread_grammar_us_median": host_times.medians_us(),
        "step_ms_unit_note": "medians of per-run medians of decode steps 3..N",
        "schema_compile_ms_median": statistics.median(compile_times) * 1e3,
        "rounds": results,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
