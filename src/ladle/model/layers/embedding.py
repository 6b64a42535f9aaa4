"""Token embedding and the language-model head (which may share the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.layers.group_quant import GroupQuantizedRows
from ladle.model.layers.quantized_linear import (
    hold_quantized_rows,
    quantized_embedding,
    quantized_matmul,
)
from ladle.model.layers.weight_loading import default_weight_loader


class VocabEmbedding(nn.Module):
    """Looks up rows of a [vocab_size, hidden_size] table for int32 or int64 token ids."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    # Set by quantize_model_: the table is then int8 codes + row scales.
    quantization: str | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quantization is not None:
            return quantized_embedding(self, input_ids)
        return F.embedding(input_ids, self.weight)

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor | GroupQuantizedRows
    ) -> None:
        """Copy the checkpoint's table in, or hold a group-quantized one (kept in its format)."""
        if isinstance(loaded_weight, GroupQuantizedRows):
            hold_quantized_rows(self, param, loaded_weight, 0, self.vocab_size, self.hidden_size)
            return
        default_weight_loader(param.data, loaded_weight)

    def logits(self, hidden_states: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """hidden [n, hidden_size] x this table^T -> logits [n, vocab_size], float32 unless
        float32=False (compute_logits)."""
        if self.quantization is not None:
            logits = quantized_matmul(self, hidden_states)
            return logits.float() if float32 else logits
        return compute_logits(hidden_states, self.weight, float32)

    def extra_repr(self) -> str:
        return f"vocab={self.vocab_size}, hidden={self.hidden_size}"


class LMHead(VocabEmbedding):
    """Projects final hidden states onto the vocabulary. Logits are returned in float32 because
    samplers take softmax / log-softmax over them; the matmul itself runs in the model dtype, as
    in Hugging Face. With tied embeddings the model passes the embedding weight instead of
    owning a second copy (a shared Parameter would not survive materialisation from meta)."""

    def forward(self, hidden_states: torch.Tensor, float32: bool = True) -> torch.Tensor:
        return self.logits(hidden_states, float32)


def compute_logits(
    hidden_states: torch.Tensor, weight: torch.Tensor, float32: bool = True
) -> torch.Tensor:
    """[num_tokens, hidden] x [vocab, hidden]^T -> [num_tokens, vocab] logits: float32, or with
    float32=False in the matmul's own dtype, for a consumer that widens only what it must (the
    sampler, whose fused draw reads 16-bit logits as they are: a float32 copy of 256 rows of a
    128k vocabulary cost 0.1 ms of every batch-256 decode step on an H100)."""
    if hidden_states.shape[0] == 1 and use_fused_kernels(hidden_states):
        # One sampling row (batch-1 decode): ladle's GEMV, rounded as the matmul's own dtype.
        from ladle.kernels.gemv import gemv, gemv_applies

        if gemv_applies(hidden_states, weight):
            return gemv(hidden_states, weight, out_dtype=torch.float32 if float32 else None)
    logits = F.linear(hidden_states, weight)
    return logits.float() if float32 else logits
