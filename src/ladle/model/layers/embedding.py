"""Token embedding and the language-model head (which may share the embedding's weight).

Under tensor parallelism both split the vocabulary: each rank holds ceil(vocab / ranks) rows
(the last rank's tail padded with zeros). The embedding looks up the ids in its range and the
ranks sum (each row comes from exactly one rank); the head computes its rows' logits and the
ranks gather them, so every rank samples from the whole vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.distributed.tensor_parallel import SINGLE, TensorParallel
from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.layers.group_quant import GroupQuantizedRows
from ladle.model.layers.quantized_linear import (
    hold_quantized_rows,
    quantized_embedding,
    quantized_matmul,
)
from ladle.model.layers.weight_loading import default_weight_loader, rank_slice


class VocabEmbedding(nn.Module):
    """Looks up rows of a [vocab_size, hidden_size] table for int32 or int64 token ids.
    vocab_size is this rank's row count; full_vocab_size the model's."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.full_vocab_size = vocab_size
        self.vocab_size = -(-vocab_size // tp.size)
        self.vocab_start = tp.rank * self.vocab_size
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(self.vocab_size, hidden_size), requires_grad=False)

    # Set by quantize_model_: the table is then int8 codes + row scales.
    quantization: str | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self._lookup(input_ids)
        local_ids = input_ids - self.vocab_start
        mine = (local_ids >= 0) & (local_ids < self.vocab_size)
        rows = self._lookup(local_ids * mine)
        return self.tp.all_reduce(rows * mine.unsqueeze(-1).to(rows.dtype))

    def _lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quantization is not None:
            return quantized_embedding(self, input_ids)
        return F.embedding(input_ids, self.weight)

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor | GroupQuantizedRows
    ) -> None:
        """Copy the checkpoint's table in, or hold a group-quantized one (kept in its format)."""
        if self.tp.size > 1:
            self._load_rank_rows(param, loaded_weight)
            return
        if isinstance(loaded_weight, GroupQuantizedRows):
            hold_quantized_rows(self, param, loaded_weight, 0, self.vocab_size, self.hidden_size)
            return
        default_weight_loader(param.data, loaded_weight)

    def _load_rank_rows(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """This rank's rows of the table; rows past the vocabulary (the padding) are zeros."""
        rows = max(0, min(self.vocab_size, self.full_vocab_size - self.vocab_start))
        param.data.zero_()
        if rows:
            default_weight_loader(
                param.data[:rows],
                rank_slice(loaded_weight, 0, self.vocab_start, rows, self.full_vocab_size),
            )

    def logits(self, hidden_states: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """hidden [n, hidden_size] x this table^T -> logits [n, vocab_size], float32 unless
        float32=False (compute_logits)."""
        if self.quantization is not None:
            logits = quantized_matmul(self, hidden_states)
            logits = logits.float() if float32 else logits
        else:
            logits = compute_logits(hidden_states, self.weight, float32)
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits)[:, : self.full_vocab_size]

    def extra_repr(self) -> str:
        shard = f" of {self.full_vocab_size}" if self.tp.size > 1 else ""
        return f"vocab={self.vocab_size}{shard}, hidden={self.hidden_size}"


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
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.gemv import gemv, gemv_applies

        if gemv_applies(hidden_states, weight):
            return gemv(hidden_states, weight, out_dtype=torch.float32 if float32 else None)
    logits = F.linear(hidden_states, weight)
    return logits.float() if float32 else logits
