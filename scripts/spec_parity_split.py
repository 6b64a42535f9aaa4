"""Greedy tokens of speculation through split engines against the same split without drafts,
run a few times on one engine (prefix-cache hits change the batches between runs), on the CPU
with a tiny random llama. Prints the first differing position with both top-3 distributions,
so a near-tie (close logprobs) is told from a wrong input (different distributions).

    PYTHONPATH=src:tests python scripts/spec_parity_split.py '{"tensor_parallel_size": 2}' \\
        '{"method": "ngram", "num_speculative_tokens": 3, "adaptive": false, \\
          "drafts_on_device": true}'
"""

from __future__ import annotations

import json
import sys
import tempfile

from helpers.tiny_models import save_tiny_model

from ladle import LLM, SamplingParams

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [40, 41, 42, 40, 41, 42], [9, 9, 9, 9]]


def main() -> int:
    split = json.loads(sys.argv[1])
    spec = json.loads(sys.argv[2])
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    model = save_tiny_model(tempfile.mkdtemp(), "llama")
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=3)
    options = dict(cpu_kv_cache_gib=0.05, distributed_executor_backend="mp", **split)
    base = LLM(model, **options)
    reference = base.generate(PROMPTS, params, use_tqdm=False)
    base.engine.executor.shutdown()
    llm = LLM(model, speculative_config=spec, **options)
    num_bad = 0
    for run in range(runs):
        got = llm.generate(PROMPTS, params, use_tqdm=False)
        for index, (want, have) in enumerate(zip(reference, got)):
            a, b = want.outputs[0], have.outputs[0]
            if a.token_ids == b.token_ids:
                continue
            num_bad += 1
            k = next(j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
            top = lambda entry: {t: round(v.logprob, 4) for t, v in entry.items()}  # noqa: E731
            print(f"run {run} prompt {index} position {k}: without drafts {top(a.logprobs[k])}, "
                  f"with {top(b.logprobs[k])}")
    llm.engine.executor.shutdown()
    print(f"{num_bad} differing outputs in {runs} runs of {len(PROMPTS)} prompts")
    return 1 if num_bad else 0


if __name__ == "__main__":
    sys.exit(main())
