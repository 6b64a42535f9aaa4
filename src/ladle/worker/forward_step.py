"""A step whose forward pass is queued on the device and whose sampling is not launched yet.

ModelRunner.execute is launch_forward then sample. The engine calls the two apart when some row's
sampling needs the tokens of the step still in flight on the host (a grammar's bitmask, bad_words):
it launches the forward pass of step N+1, reads step N's sampled ids while the device computes,
advances the matchers, and only then launches N+1's sampling (executor/split_launch.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ladle.protocol.step import PromptLogprobsChunk, StepPlan
from ladle.sample.metadata import SamplingFlags
from ladle.worker.drafter import TargetOutputs
from ladle.worker.drafts_on_device import StepShape
from ladle.worker.kv_copier import KVReport
from ladle.worker.penalty_history import PenaltyRows
from ladle.worker.step_inputs import StepInputs


@dataclass
class ForwardStep:
    plan: StepPlan
    sampling_rows: list[tuple[int, int]]  # (position in the plan, drafts before the row)
    row_output_index: list[int]  # per sampling row: its token's index among the outputs
    inputs: StepInputs | None  # None for a plan with nothing scheduled
    logits: torch.Tensor | None  # [num_rows, vocab]; None when no request samples
    prompt_logprobs: dict[str, PromptLogprobsChunk] | None
    # Resolved at launch: a request the host ends before sampling still owns its row until then.
    penalty_rows: PenaltyRows | None
    sampling_flags: SamplingFlags | None  # of the sampling rows; None when none samples
    kv_report: KVReport | None = None  # the plan's KV copies, issued before the forward
    # With a draft network (worker/drafter.py): what the target gave it, for every row.
    target_outputs: TargetOutputs | None = None
    # The input ids the forward read (device-resolved); None for a plan with nothing scheduled.
    input_ids: torch.Tensor | None = None
    # With drafts on the device: what the host knows of the step's drafts (drafts_on_device.py).
    draft_shape: StepShape | None = None
