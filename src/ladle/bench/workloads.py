"""The standard token-id workloads, defined once and reused by every bench and test.

Each is seeded, so two engines (or two runs) given the same workload do exactly the same work:
every request generates exactly its max_tokens (EOS ignored).

- W1 small offline: Qwen3-0.6B shape, 256 requests, prompts of U[100, 1024] ids drawn from
  [0, 10000], max_tokens U[100, 1024], temperature 0.6 (each request its own seed).
- W2 large offline: the same recipe on the Llama-3.1-8B shape.
- W3 latency: one request, 512 prompt ids, 256 generated tokens, greedy.
- W1-30b-a3b, W3-30b-a3b, W3-mixtral: W1's and W3's recipes on mixture-of-experts shapes.
- S1 served: the 0.6B shape behind `ladle serve`; 256 streaming completions, prompts of
  U[100, 1024] ids, max_tokens U[100, 512], temperature 0.6, at 32, 128 and 256 in flight.

The draw order is part of the definition: for each request in turn, the prompt length, then the
prompt ids, then max_tokens, all from one `random.Random(seed)`.
"""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass, replace

from ladle.protocol.messages import EngineCoreRequest
from ladle.sampling.params import SamplingParams


@dataclass(frozen=True)
class TokenWorkload:
    """A seeded recipe of token-id requests on one model shape."""

    name: str
    model_preset: str
    num_requests: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    temperature: float
    max_token_id: int = 10000
    seed: int = 0
    fixed_input_len: int | None = None  # W3: one exact prompt length instead of a range
    concurrency: tuple[int, ...] = ()  # served workloads: the in-flight levels to run at
    # Logprobs each request asks for (None: none). `--logprobs 0` asks, as `ladle bench serve
    # --token-ids` does, for the sampled token's logprob alone: the served request's step.
    logprobs: int | None = None


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: prompt ids, how many tokens to generate, its sampling seed."""

    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool = True  # token-id workloads run to max_tokens; text ones (edit) stop at EOS
    logprobs: int | None = None

    def core_request(self, request_id: str, max_tokens: int | None = None) -> EngineCoreRequest:
        """The engine-core request that runs it: EOS ignored, its own seed; max_tokens replaces
        the workload's (a profiler run that must not see requests end)."""
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling_params=SamplingParams(
                temperature=self.temperature,
                max_tokens=self.max_tokens if max_tokens is None else max_tokens,
                ignore_eos=self.ignore_eos,
                seed=self.seed,
                logprobs=self.logprobs,
            ),
        )


W1 = TokenWorkload("W1", "qwen3-0.6b", 256, (100, 1024), (100, 1024), temperature=0.6)
W2 = TokenWorkload("W2", "llama-3.1-8b", 256, (100, 1024), (100, 1024), temperature=0.6)
W3_SMALL = TokenWorkload(
    "W3", "qwen3-0.6b", 1, (512, 512), (256, 256), temperature=0.0, fixed_input_len=512
)
W3_LARGE = TokenWorkload(
    "W3", "llama-3.1-8b", 1, (512, 512), (256, 256), temperature=0.0, fixed_input_len=512
)
# The mixture-of-experts targets (issue 35): W1's and W3's recipes on MoE shapes.
W1_QWEN3_MOE = replace(W1, name="W1-30b-a3b", model_preset="qwen3-30b-a3b")
W3_QWEN3_MOE = replace(W3_SMALL, name="W3-30b-a3b", model_preset="qwen3-30b-a3b")
W3_MIXTRAL = replace(W3_SMALL, name="W3-mixtral", model_preset="mixtral-8x7b")
# The tensor-parallel targets (issue 34): W2's and W3's recipes on the Llama-3.1-70B shape.
W2_LLAMA_70B = replace(W2, name="W2-70b", model_preset="llama-3.1-70b")
W3_LLAMA_70B = replace(W3_LARGE, name="W3-70b", model_preset="llama-3.1-70b")
S1 = TokenWorkload(
    "S1", "qwen3-0.6b", 256, (100, 1024), (100, 512), temperature=0.6, concurrency=(32, 128, 256)
)

WORKLOADS = {
    "W1": W1,
    "W2": W2,
    "W3": W3_SMALL,
    "W3-8b": W3_LARGE,
    "W1-30b-a3b": W1_QWEN3_MOE,
    "W3-30b-a3b": W3_QWEN3_MOE,
    "W3-mixtral": W3_MIXTRAL,
    "W2-70b": W2_LLAMA_70B,
    "W3-70b": W3_LLAMA_70B,
    "S1": S1,
}


def build_requests(
    workload: TokenWorkload, num_requests: int | None = None
) -> list[WorkloadRequest]:
    """The workload's requests in order; `num_requests` takes a prefix (the same first requests
    as the full workload, so a short run is comparable request by request)."""
    rng = random.Random(workload.seed)
    count = workload.num_requests if num_requests is None else num_requests
    requests = []
    for index in range(count):
        if workload.fixed_input_len is not None:
            length = workload.fixed_input_len
        else:
            length = rng.randint(*workload.input_len)
        prompt = [rng.randint(0, workload.max_token_id) for _ in range(length)]
        max_tokens = rng.randint(*workload.output_len)
        requests.append(
            WorkloadRequest(
                prompt, max_tokens, workload.temperature, seed=index, logprobs=workload.logprobs
            )
        )
    return requests


# One line each for `ladle bench --help`: what runs, on which shape, and which command runs it.
WORKLOAD_SUMMARIES = {
    "W1": "offline throughput, Qwen3-0.6B shape (dummy weights): 256 requests, prompts and "
          "outputs of 100-1024 tokens, temperature 0.6 (ladle bench throughput)",
    "W2": "offline throughput, the same recipe on the Llama-3.1-8B shape (ladle bench "
          "throughput --workload W2)",
    "W3": "latency of one request, Qwen3-0.6B shape: 512 prompt tokens, 256 generated, greedy; "
          "TTFT and inter-token times (ladle bench latency)",
    "W3-8b": "W3 on the Llama-3.1-8B shape (ladle bench latency --workload W3-8b)",
    "W1-30b-a3b": "W1 on the Qwen3-30B-A3B mixture-of-experts shape (128 experts, 8 per token; "
                  "ladle bench throughput --workload W1-30b-a3b)",
    "W3-30b-a3b": "W3 on the Qwen3-30B-A3B shape (ladle bench latency --workload W3-30b-a3b)",
    "W3-mixtral": "W3 on the Mixtral-8x7B shape, 93 GB in bf16: two GPUs (ladle bench latency "
                  "--workload W3-mixtral -tp 2)",
    "W2-70b": "W2 on the Llama-3.1-70B shape, 141 GB in bf16: several GPUs (ladle bench "
              "throughput --workload W2-70b -tp 4)",
    "W3-70b": "W3 on the Llama-3.1-70B shape (ladle bench latency --workload W3-70b -tp 4)",
    "S1": "served: Qwen3-0.6B shape behind `ladle serve`, 256 streamed completions (prompts "
          "100-1024, outputs 100-512 tokens) at 32, 128 and 256 in flight (ladle bench serve "
          "--workload S1)",
}


def describe_workloads() -> str:
    """The standard workloads, one per line, for help texts."""
    width = max(len(name) for name in WORKLOADS)
    lines = [
        textwrap.fill(WORKLOAD_SUMMARIES[name], 79, initial_indent=f"  {name:<{width}}  ",
                      subsequent_indent=" " * (width + 4))
        for name in WORKLOADS
    ]
    edit = textwrap.fill(
        "rewrite / edit / summarise a ShareGPT reply given in the prompt, through the model's "
        "chat template, greedy, EOS on; the default model (real weights) unless --model: "
        "where speculative decoding pays (ladle bench latency --workload edit "
        "--max-num-seqs 1 --speculative-config ...)",
        79, initial_indent=f"  {'edit':<{width}}  ", subsequent_indent=" " * (width + 4),
    )
    return (
        "standard workloads (seeded token ids; EOS ignored):\n" + "\n".join(lines)
        + "\ntext workloads:\n" + edit
    )


def get_workload(name: str) -> TokenWorkload:
    """A standard workload by name (WORKLOADS); a ValueError lists the names."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
