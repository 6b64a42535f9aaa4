"""Step time of a batch with some rows under a JSON schema vs the same batch unconstrained.

    python scripts/structured_overhead_bench.py --model llama-3.1-8b --load-format dummy \
        --tokenizer TOKENIZER_FOLDER --batch 64 --constrained-fraction 0.25

Dummy weights of a real shape; the grammar uses the given tokenizer's vocabulary (masks are sized
to the model's vocabulary). Each run: prefill the batch, then time decode steps (engine.step,
which includes the grammar job overlapped with the forward and the one-launch application).
Unconstrained and constrained runs alternate (the order flips every round); medians are
reported. --kinds json,penalty adds a batch whose constrained rows use the repetition / frequency /
presence penalties instead; --sync-reference also times each kind with overlap off. In the
constrained runs it also times, per step, the engine thread's own grammar
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
from ladle.protocol.messages import EngineCoreRequest  # noqa: E402
from ladle.sampling.params import SamplingParams  # noqa: E402
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
    row_kind: str = "json",
):
    structured = StructuredOutputsParams(json=SCHEMA)
    for index in range(batch):
        constrained = index < num_constrained
        extra = {}
        if constrained and row_kind == "json":
            extra = {"structured_outputs": structured}
        elif constrained and row_kind == "penalty":
            extra = {"repetition_penalty": 1.1, "frequency_penalty": 0.2, "presence_penalty": 0.1}
        params = SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True, **extra)
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
    parser.add_argument("--kinds", default="json", help="comma list of json, penalty")
    parser.add_argument("--sync-reference", action="store_true")
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
    host_times = HostTimes(engine.structured_outputs)
    run_batch(engine, args.batch, num_constrained, 6, "warm")
    run_batch(engine, args.batch, 0, 6, "warm-plain")
    # Runs of a round, in turn (the order flips every round): the plain batch, the batch with
    # a quarter of its rows constrained (json) or penalised (penalty), and with --sync-reference
    # the constrained batch with overlap off (what main did when such rows forced synchronous
    # steps).
    modes = ["plain"] + list(args.kinds.split(","))
    if args.sync_reference:
        modes += [f"{kind}-sync" for kind in args.kinds.split(",")]
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    overlap_enabled = engine.overlap.enabled
    for round_index in range(args.rounds):
        order = modes if round_index % 2 == 0 else modes[::-1]
        for mode in order:
            kind = mode.removesuffix("-sync")
            engine.overlap.enabled = overlap_enabled and not mode.endswith("-sync")
            results[mode].append(
                run_batch(
                    engine,
                    args.batch,
                    0 if mode == "plain" else num_constrained,
                    args.steps,
                    f"{mode}{round_index}",
                    host_times if kind == "json" else None,
                    row_kind=kind,
                )
            )
            engine.overlap.enabled = overlap_enabled
    plain = statistics.median(results["plain"])
    summary = {
        "model": args.model,
        "batch": args.batch,
        "num_constrained": num_constrained,
        "overlap": overlap_enabled,
        "vocab_size": compiler.vocab_size,
        "plain_step_ms": plain * 1e3,
        "engine_thread_grammar_us_median": host_times.medians_us(),
        "step_ms_unit_note": "medians of per-run medians of decode steps 3..N",
        "schema_compile_ms_median": statistics.median(compile_times) * 1e3,
        "rounds": results,
    }
    for mode in modes[1:]:
        median = statistics.median(results[mode])
        # Paired per round (the runs of a round are adjacent in time).
        paired = [c / p - 1 for p, c in zip(results["plain"], results[mode])]
        summary[f"{mode}_step_ms"] = median * 1e3
        summary[f"{mode}_overhead_percent"] = (median / plain - 1) * 100
        summary[f"{mode}_paired_overhead_percent_median"] = statistics.median(paired) * 100
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
