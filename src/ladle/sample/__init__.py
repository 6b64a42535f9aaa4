"""Vectorised sampling: per-request rows in, one token (and optional logprobs) per request out."""

# The names are imported on first use: the engine's API side imports torch-free modules of this
# package (bad_words), and importing the sampler with them would pull torch into `ladle serve`'s
# API process, delaying the engine's spawn by torch's import time.
_EXPORTS = {
    "ROW_DTYPES": "ladle.sample.metadata",
    "Sampler": "ladle.sample.sampler",
    "SamplerOutput": "ladle.sample.output",
    "SamplingFlags": "ladle.sample.metadata",
    "SamplingMetadata": "ladle.sample.metadata",
    "build_banned_token_ids": "ladle.sample.metadata",
    "build_penalty_token_ids": "ladle.sample.metadata",
    "build_sampling_metadata": "ladle.sample.metadata",
    "build_sampling_rows": "ladle.sample.metadata",
    "gather_logprobs": "ladle.sample.logprobs",
    "logprobs_to_messages": "ladle.sample.logprobs",
    "pad_token_ids": "ladle.sample.metadata",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ladle.sample' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
