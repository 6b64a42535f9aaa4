"""Architecture name (config.json "architectures"[0]) -> model class."""

from __future__ import annotations

from torch import nn

from ladle.model.arch_config import UnsupportedModelError
from ladle.model.models.llama import LlamaForCausalLM
from ladle.model.models.sparse_moe import MixtralForCausalLM, Qwen3MoeForCausalLM

# One class serves the dense Llama family (ModelArchConfig's switches tell them apart); the
# mixtures of experts subclass it.
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    """The class that runs `architecture`; UnsupportedModelError names the ones that exist."""
    model_class = MODEL_REGISTRY.get(architecture)
    if model_class is None:
        raise UnsupportedModelError(
            f"unsupported architecture {architecture!r}; ladle runs {', '.join(MODEL_REGISTRY)}"
        )
    return model_class
