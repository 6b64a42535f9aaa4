"""What the head learns from: the target's residual stream entering the three fused layers, and
its final normed hidden state (the LM head's input, from which the next-token distribution is
recomputed per batch rather than stored: 4 bytes x vocabulary a token would not fit), for each
token of (prompt + the target's own answer).

The target is loaded unquantized with ladle's loader and run with the autograd-free sequence
forward (models/llama_autograd_forward.py, held to the serving forward by its test): exact, no
paged cache, no transformers model to build, nothing unpickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from ladle.model.arch_config import ModelArchConfig, UnsupportedModelError
from ladle.model.models.llama_autograd_forward import sequence_hidden_states


@dataclass
class TargetModel:
    """The loaded target: its module and shape, the (frozen) embedding the head shares, and the
    LM head's weight [vocab, hidden] (the embedding when tied)."""

    model: nn.Module
    arch: ModelArchConfig
    embedding: torch.Tensor
    lm_head_weight: torch.Tensor


@dataclass
class SequenceFeatures:
    """One training (or held-out) sequence: prompt + answer tokens [T], how many of them are
    the prompt, the fused layers' states concatenated [T, 3 * hidden], the final normed hidden
    state [T, hidden] and the target's argmax next token at each position [T]."""

    token_ids: torch.Tensor
    prompt_length: int
    aux_hidden: torch.Tensor
    final_hidden: torch.Tensor
    target_argmax: torch.Tensor

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


def load_target(
    model: str,
    device: torch.device,
    dtype: torch.dtype,
    load_format: str = "auto",
    seed: int = 0,
) -> TargetModel:
    """The model `model` names (HF folder, .gguf file, or a preset with load_format='dummy', whose
    random weights `seed` fixes as the engine's do), unquantized in `dtype` on `device`."""
    from ladle.attention.backend import get_attention_backend
    from ladle.config import ModelConfig, supported_dtypes
    from ladle.model.loader import load_model

    dtype_name = next(name for name, value in supported_dtypes().items() if value == dtype)
    config = ModelConfig(
        model=model, load_format=load_format, quantization="none", dtype=dtype_name, seed=seed
    )
    loaded = load_model(config, device, dtype, get_attention_backend(device))
    if loaded.arch_config.num_experts:
        raise UnsupportedModelError(
            f"model {model!r} is a mixture of experts ({loaded.arch_config.architecture}): "
            "train-draft runs dense Llama-family models"
        )
    module = loaded.model
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    embedding = module.model.embed_tokens.weight
    head = embedding if module.lm_head is None else module.lm_head.weight
    return TargetModel(module, loaded.arch_config, embedding, head)


@torch.no_grad()
def collect_features(
    target: TargetModel,
    sequences: Sequence[tuple[list[int], int]],
    aux_layer_ids: tuple[int, int, int],
    storage_dtype: torch.dtype = torch.bfloat16,
    show_progress: bool = True,
) -> list[SequenceFeatures]:
    """Features of each (token ids, prompt length) sequence, kept on the target's device in
    `storage_dtype` (bfloat16 halves the memory; the head trains in its own dtype)."""
    device = target.embedding.device
    features = []
    for token_ids, prompt_length in tqdm(
        sequences, desc="target features", unit="seq", disable=not show_progress
    ):
        ids = torch.tensor(token_ids, dtype=torch.long, device=device)
        aux, final = sequence_hidden_states(target.model, ids, aux_layer_ids)
        argmax = (final @ target.lm_head_weight.t()).argmax(dim=-1)
        features.append(
            SequenceFeatures(
                token_ids=ids,
                prompt_length=prompt_length,
                aux_hidden=torch.cat(aux, dim=-1).to(storage_dtype),
                final_hidden=final.to(storage_dtype),
                target_argmax=argmax,
            )
        )
    return features
