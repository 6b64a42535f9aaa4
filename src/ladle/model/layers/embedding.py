"""Token embedding and the language-model head (which may share the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    """Looks up rows of a [vocab_size, hidden_size] table for int32 or int64 token ids."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"vocab={self.vocab_size}, hidden={self.hidden_size}"


class LMHead(VocabEmbedding):
    """Projects final hidden states onto the vocabulary. Logits are returned in float32 because
    samplers take softmax / log-softmax over them; the matmul itself runs in the model dtype, as
    in Hugging Face. With tied embeddings the model passes the embedding weight instead of
    owning a second copy (a shared Parameter would not survive materialisation from meta)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return compute_logits(hidden_states, self.weight)


def compute_logits(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[num_tokens, hidden] x [vocab, hidden]^T -> float32 [num_tokens, vocab]."""
    return F.linear(hidden_states, weight).float()
