"""Offline results in vLLM's shape: completion logprobs as one {token_id: Logprob} dict per
generated token, cumulative_logprob, and no text when detokenize=False.

The engine and the server keep ladle's compact TokenLogprobs; only LLM's returned outputs are
converted, once, when a request has finished.
"""

from __future__ import annotations

from ladle.outputs import CompletionOutput, Logprob, RequestOutput
from ladle.protocol.messages import TokenLogprobs
from ladle.sampling.params import SamplingParams


def to_vllm_logprobs(entries: list[TokenLogprobs], decode) -> list[dict[int, Logprob]]:
    """The sampled token first, then the top candidates by rank (vLLM's order)."""
    converted = []
    for entry in entries:
        position = {entry.token_id: Logprob(entry.logprob, entry.rank, decode(entry.token_id))}
        for rank, (token_id, logprob) in enumerate(
            zip(entry.top_token_ids, entry.top_logprobs), start=1
        ):
            if token_id not in position:
                position[token_id] = Logprob(logprob, rank, decode(token_id))
        converted.append(position)
    return converted


def finish_offline_output(output: RequestOutput, params: SamplingParams, decode) -> None:
    """Convert a finished RequestOutput in place (decode: token id -> its text, or None)."""
    for completion in output.outputs:
        _finish_completion(completion, params, decode)
    entries = output.prompt_logprobs
    if entries and any(isinstance(entry, TokenLogprobs) for entry in entries):
        output.prompt_logprobs = [
            None if entry is None else to_vllm_logprobs([entry], decode)[0] for entry in entries
        ]


def _finish_completion(completion: CompletionOutput, params: SamplingParams, decode) -> None:
    if completion.logprobs is not None and params.logprobs is not None:
        entries = completion.logprobs
        if entries and isinstance(entries[0], TokenLogprobs):
            completion.cumulative_logprob = float(sum(entry.logprob for entry in entries))
            completion.logprobs = to_vllm_logprobs(entries, decode)
    if not params.detokenize:
        completion.text = ""
        completion.text_delta = ""
