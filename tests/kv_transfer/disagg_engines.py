"""Helpers: a producer and a consumer EngineCore in one process (the CPU pool is exported
through /dev/shm, so a pull reads it exactly as another process would), driven step by step
the way the API process drives two engine processes (frontend/disagg_client.py)."""

from __future__ import annotations

from ladle.config import EngineConfig
from ladle.engine.engine_core import EngineCore
from ladle.protocol.messages import EngineCoreOutput, EngineCoreRequest
from ladle.sampling.params import SamplingParams

BLOCK_SIZE = 4


def make_engine(role: str | None = None, **options) -> EngineCore:
    base = dict(
        load_format="dummy",
        dtype="float32",
        block_size=BLOCK_SIZE,
        num_kv_blocks=64,
        max_num_seqs=8,
        max_model_len=256,
        seed=0,
    )
    if role is not None:
        base["kv_transfer_config"] = {"kv_role": role, "kv_connector": "LadleConnector"}
    return EngineCore(EngineConfig.from_kwargs("tiny-llama", **{**base, **options}),
                      print_budget=False)


def run_until_done(engine: EngineCore, ids: set[str]) -> dict[str, list[EngineCoreOutput]]:
    outputs: dict[str, list[EngineCoreOutput]] = {request_id: [] for request_id in ids}
    for _ in range(1000):
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
        if all(o and o[-1].finished for o in outputs.values()):
            return outputs
    raise AssertionError("the engine did not finish its requests")


def tokens_of(outputs: list[EngineCoreOutput]) -> list[int]:
    return [token for output in outputs for token in output.new_token_ids]


def aggregated_tokens(engine: EngineCore, prompts: list[list[int]], params: SamplingParams):
    for index, prompt in enumerate(prompts):
        engine.add_request(EngineCoreRequest(f"r{index}", prompt, params))
    outputs = run_until_done(engine, {f"r{index}" for index in range(len(prompts))})
    return [tokens_of(outputs[f"r{index}"]) for index in range(len(prompts))]


def prefill(producer: EngineCore, prompts: list[list[int]], params: SamplingParams,
            prefix: str = "r") -> dict[str, EngineCoreOutput]:
    """Run the prompts on the producer; each request's last output (its handoff)."""
    for index, prompt in enumerate(prompts):
        producer.add_request(EngineCoreRequest(
            f"{prefix}{index}", prompt, params, kv_transfer_params={"do_remote_decode": True}
        ))
    outputs = run_until_done(producer, {f"{prefix}{index}" for index in range(len(prompts))})
    return {request_id: o[-1] for request_id, o in outputs.items()}


def decode_request(request_id: str, prompt: list[int], params: SamplingParams,
                   handoff: EngineCoreOutput) -> EngineCoreRequest:
    assert handoff.finish_reason == "remote_decode", handoff
    transfer = dict(handoff.kv_transfer_params, first_token_ids=list(handoff.new_token_ids))
    return EngineCoreRequest(request_id, prompt, params, kv_transfer_params=transfer)


def disaggregated_tokens(producer: EngineCore, consumer: EngineCore, prompts: list[list[int]],
                         params: SamplingParams, prefix: str = "r") -> list[list[int]]:
    handoffs = prefill(producer, prompts, params, prefix)
    ids = [f"{prefix}{index}" for index in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts):
        consumer.add_request(decode_request(request_id, prompt, params, handoffs[request_id]))
    outputs = run_until_done(consumer, set(ids))
    producer.abort_requests(ids)  # the consumer has pulled: release the held blocks
    return [list(handoffs[rid].new_token_ids) + tokens_of(outputs[rid]) for rid in ids]


def free_blocks(engine: EngineCore) -> int:
    return engine.kv_cache_manager.num_free_blocks
