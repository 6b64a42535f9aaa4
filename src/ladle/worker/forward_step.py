"""A step whose forward pass is queued on the device and whose sampling is not launched yet.

ModelRunner.execute is launch_forward then sample. The engine calls the two apart when some row's
sampling needs the tokens of the step still in flight on the host (a grammar's bitmask, bad_words):
it launches the forward pass of step N+1, reads step N's sampled ids while the device computes,
advances the matchers, and only then launches N+1's sampling (engine/split_launch.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ladle.core.request import Request
from ladle.sample.metadata import SamplingFlags
from ladle.structured.manager import PendingGrammarBitmask
from ladle.worker.penalty_history import PenaltyRows
from ladle.worker.prompt_logprobs import PromptLogprobsChunk
from ladle.worker.step_inputs import StepInputs


@dataclass
class ForwardStep:
    num_requests: int
    sampling_positions: list[int]  # rows of the step that sample
    sampling_requests: list[Request]
    num_output_tokens: list[int]  # per sampling request: its output count (its token's index)
    inputs: StepInputs
    logits: torch.Tensor | None  # [num_sampling, vocab]; None when no request samples
    prompt_logprobs: dict[str, PromptLogprobsChunk] | None
    # The grammar job started before the forward (execute), or None: sample() may start one.
    pending_bitmask: PendingGrammarBitmask | None
    # Resolved at launch: a request the host ends before sampling still owns its row until then.
    penalty_rows: PenaltyRows | None
    sampling_flags: SamplingFlags | None  # of the sampling requests; None when none samples
