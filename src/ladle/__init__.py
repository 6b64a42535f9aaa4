"""ladle: an LLM inference serving engine (paged KV cache, continuous batching, prefix caching)."""

from ladle.threads import prefer_passive_waiting

# Before torch loads (ladle imports it lazily): OpenMP threads that wait must not spin on a
# shared CPU (ladle/threads.py says why). The engine-core process inherits the setting.
prefer_passive_waiting()

from ladle.entrypoints.prompt_inputs import TextPrompt, TokensPrompt  # noqa: E402
from ladle.outputs import CompletionOutput, RequestOutput  # noqa: E402
from ladle.sampling.params import SamplingParams  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "CompletionOutput",
    "RequestOutput",
    "SamplingParams",
    "TextPrompt",
    "TokensPrompt",
    "__version__",
]


def __getattr__(name: str):
    # LLM pulls in torch and the model code; import it only when asked for (`import ladle`
    # stays light for the API process and the CLI's parser).
    if name == "LLM":
        from ladle.entrypoints.llm import LLM

        return LLM
    raise AttributeError(f"module 'ladle' has no attribute {name!r}")
