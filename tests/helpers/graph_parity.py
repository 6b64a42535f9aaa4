"""CUDA graphs against eager on one model: the same greedy requests through two LLMs, one with
enforce_eager, for the GPU tests of the quantized methods."""

from __future__ import annotations

PROMPTS = [[5, 6, 7, 8, 9], list(range(20, 60)), [100, 3], list(range(200, 230))]
MAX_TOKENS = 16


def assert_graphs_track_eager(model: str, **llm_options) -> None:
    """Greedy tokens under CUDA graphs agree with eager: every first token, and at least half of
    all. The decode GEMMs of a padded graph batch may pick other kernels than eager's (other
    summation orders), and a random tiny model amplifies such differences, so sequences may part
    late; a graph that ran broken kernels would agree on ~1/vocab of the tokens."""
    from ladle.entrypoints.llm import LLM
    from ladle.sampling.params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    results = []
    for eager in (True, False):
        llm = LLM(model, device="cuda", enforce_eager=eager, num_kv_blocks=64, **llm_options)
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        results.append([list(o.outputs[0].token_ids) for o in outputs])
        del llm
    eager_ids, graph_ids = results
    assert [ids[0] for ids in eager_ids] == [ids[0] for ids in graph_ids]
    same = sum(a == b for e, g in zip(eager_ids, graph_ids) for a, b in zip(e, g))
    assert same >= 0.5 * MAX_TOKENS * len(PROMPTS)
