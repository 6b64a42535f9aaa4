"""Vectorised sampling: per-request rows in, one token (and optional logprobs) per request out."""

from ladle.sample.logprobs import gather_logprobs, logprobs_to_messages
from ladle.sample.metadata import (
    ROW_DTYPES,
    SamplingFlags,
    SamplingMetadata,
    build_banned_token_ids,
    build_penalty_token_ids,
    build_sampling_metadata,
    build_sampling_rows,
    pad_token_ids,
)
from ladle.sample.output import SamplerOutput
from ladle.sample.sampler import Sampler

__all__ = [
    "ROW_DTYPES",
    "Sampler",
    "SamplerOutput",
    "SamplingFlags",
    "SamplingMetadata",
    "build_banned_token_ids",
    "build_penalty_token_ids",
    "build_sampling_metadata",
    "build_sampling_rows",
    "gather_logprobs",
    "logprobs_to_messages",
    "pad_token_ids",
]
