"""vLLM's module path for the sampling types: `from vllm.sampling_params import SamplingParams,
StructuredOutputsParams` becomes `from ladle.sampling_params import ...` (one word changed)."""

from ladle.sampling.params import SamplingParams
from ladle.structured.params import StructuredOutputsParams

__all__ = ["SamplingParams", "StructuredOutputsParams"]
