"""`distributed_executor_backend="ray"`: the ranks run as Ray actors placed by a placement group
(here a local Ray cluster, two CPU actors over gloo) and give the one-process engine's tokens, for
tensor and for pipeline parallelism; shutting the engine down ends the actors and removes the
placement group."""

from __future__ import annotations

import pytest

from ladle import LLM, SamplingParams

ray = pytest.importorskip("ray")

OPTIONS = dict(cpu_kv_cache_gib=0.02, block_size=16)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    yield
    ray.shutdown()


def _greedy(llm: LLM) -> list[list[int]]:
    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9]}, {"prompt_token_ids": list(range(3, 60))}]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.slow  # a Ray cluster and two actors, ~20 s
@pytest.mark.parametrize(
    "layout", [dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)], ids=["tp2", "pp2"]
)
def test_ray_actors_give_the_one_process_tokens(local_ray, tiny_model_path, layout):
    from ray.util import placement_group_table

    path = tiny_model_path("qwen3")
    expected = _greedy(LLM(path, **OPTIONS))
    llm = LLM(path, distributed_executor_backend="ray", **OPTIONS, **layout)
    executor = llm.engine.executor
    assert type(executor).__name__ == "RayExecutor"
    group_id = executor._placement_group.id.hex()
    handles = list(executor._processes)
    try:
        assert _greedy(llm) == expected
    finally:
        executor.shutdown()
    assert all(handle.poll() is not None for handle in handles)
    assert placement_group_table()[group_id]["state"] == "REMOVED"
