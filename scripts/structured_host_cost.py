"""Per-step host cost of N constrained rows: advancing the matchers and filling their masks.

    OMP_NUM_THREADS=1 python scripts/structured_host_cost.py --rows 16 --vocab 128256 --rounds 5

Each of the N rows follows the 20-field schema of grammar_library_bench.py and is forced through
a valid document (row i starts i tokens later, so the rows sit at different places in it). Per
step it times, interleaved and on the same matchers:
  serial advance   one consume_token per row (what ladle did before)
  batched advance  llguidance's consume_token_par over all rows (its thread pool)
  mask fill        fill_next_token_bitmask_par over all rows (its thread pool)
and whether the fill lets the GIL go: the Python work a second thread gets done while the fill
runs, against the same work alone. Medians of per-step medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grammar_library_bench import DOCUMENT, SCHEMA  # noqa: E402

from ladle.model.default_model import resolve_default_model  # noqa: E402
from ladle.model.tokenizer import load_tokenizer  # noqa: E402
from ladle.structured.manager import MAX_GRAMMAR_THREADS  # noqa: E402
from ladle.structured.params import StructuredOutputsParams  # noqa: E402


def python_work(deadline: float) -> int:
    """Count loop turns until the deadline: how much Python this thread got to run."""
    turns = 0
    while time.perf_counter() < deadline:
        turns += 1
    return turns


def one_round(lltok, grammar: str, tokens: list[int], rows: int, width: int, threads: int) -> dict:
    import llguidance
    import llguidance.torch
    import torch

    executor = llguidance.LLExecutor(num_threads=threads)
    compiled = llguidance.LLMatcher(lltok, grammar, log_level=0)
    serial = [compiled.deep_copy() for _ in range(rows)]
    batched = [compiled.deep_copy() for _ in range(rows)]
    masks = torch.empty(rows, width, dtype=torch.int32)
    times: dict[str, list[float]] = {"serial_advance": [], "batched_advance": [], "fill": []}
    for step in range(len(tokens) + rows):
        live = [r for r in range(rows) if 0 <= step - r < len(tokens)]
        if not live:
            continue
        pairs = [(batched[r], index) for index, r in enumerate(live)]
        start = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask_par(executor, pairs, masks)
        times["fill"].append(time.perf_counter() - start)
        start = time.perf_counter()
        for r in live:
            assert serial[r].consume_token(tokens[step - r]), serial[r].get_error()
        times["serial_advance"].append(time.perf_counter() - start)
        start = time.perf_counter()
        ok = executor.consume_token_par([(batched[r], tokens[step - r]) for r in live])
        times["batched_advance"].append(time.perf_counter() - start)
        assert all(ok)
    # GIL: Python turns another thread gets while the fill runs, vs alone for the same time.
    fresh = [compiled.deep_copy() for _ in range(rows)]
    pairs = [(matcher, index) for index, matcher in enumerate(fresh)]
    start = time.perf_counter()
    for _ in range(50):
        llguidance.torch.fill_next_token_bitmask_par(executor, pairs, masks)
    fill_s = (time.perf_counter() - start) / 50
    alone = python_work(time.perf_counter() + 50 * fill_s)
    counted: list[int] = []
    worker = threading.Thread(
        target=lambda: counted.append(python_work(time.perf_counter() + 50 * fill_s))
    )
    worker.start()
    for _ in range(50):
        llguidance.torch.fill_next_token_bitmask_par(executor, pairs, masks)
    worker.join()
    result = {name: statistics.median(values) * 1e6 for name, values in times.items()}
    result["python_turns_during_fill_vs_alone"] = counted[0] / max(alone, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=128256, help="mask width in tokens")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default model's)")
    args = parser.parse_args()
    import llguidance
    import llguidance.hf

    source = args.tokenizer or str(resolve_default_model())
    hf = load_tokenizer(source).hf_tokenizer
    lltok = llguidance.hf.from_tokenizer(hf, n_vocab=args.vocab)
    grammar = StructuredOutputsParams(json=SCHEMA).to_grammar()
    text = json.dumps(DOCUMENT, separators=(", ", ": "))
    tokens = hf.encode(text, add_special_tokens=False)
    width = (args.vocab + 31) // 32
    threads = min(MAX_GRAMMAR_THREADS, max(1, (os.cpu_count() or 1) - 1))  # as the manager
    rounds = [
        one_round(lltok, grammar, tokens, args.rows, width, threads) for _ in range(args.rounds)
    ]
    summary = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(
        f"llguidance {llguidance.get_version() if hasattr(llguidance, 'get_version') else '?'}, "
        f"{args.rows} rows, mask width {args.vocab} tokens, {len(tokens)}-token document, "
        f"{args.rounds} rounds, {threads} llguidance threads; per step (us, median):"
    )
    for key, value in summary.items():
        print(f"  {key:36s} {value:9.2f}")


if __name__ == "__main__":
    main()
