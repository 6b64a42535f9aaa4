"""A rank's place in the pipeline: which contiguous layers its stage runs, and the hand-offs.

Stage s runs layers [first, end) of the decoder (stage 0 also the embedding, the last stage the
final norm, the LM head and the sampler). A step's hidden states and residual go from each rank
of stage s to the rank of the same tensor-parallel index in stage s + 1; the last stage's
sampled token ids are then broadcast to every rank, so each keeps the same request states and
the first stage can feed a decode row its last token from the device, as on one GPU.
World rank = stage * tensor_parallel_size + tensor-parallel rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class PipelineStage:
    index: int = 0
    size: int = 1
    tp_size: int = 1  # ranks per stage
    tp_rank: int = 0

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.size - 1

    @property
    def result_rank(self) -> int:
        """The world rank that sends step results to the engine: the last stage's first."""
        return (self.size - 1) * self.tp_size

    def layer_range(self, num_layers: int) -> range:
        """This stage's layers: an even split, the first `num_layers % size` stages one more."""
        if num_layers < self.size:
            raise ValueError(
                f"pipeline_parallel_size={self.size} exceeds the model's {num_layers} layers"
            )
        base, extra = divmod(num_layers, self.size)
        first = self.index * base + min(self.index, extra)
        return range(first, first + base + (1 if self.index < extra else 0))

    def send_forward(self, tensors: list[torch.Tensor]) -> None:
        """Hand this stage's outputs to the same tensor-parallel rank of the next stage."""
        peer = (self.index + 1) * self.tp_size + self.tp_rank
        for tensor in tensors:
            dist.send(tensor.contiguous(), peer)

    def receive_forward(
        self, shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device
    ) -> list[torch.Tensor]:
        """The previous stage's outputs, in the order it sent them."""
        peer = (self.index - 1) * self.tp_size + self.tp_rank
        received = []
        for shape in shapes:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(tensor, peer)
            received.append(tensor)
        return received

    def share_sampled(self, sampled: torch.Tensor) -> torch.Tensor:
        """The last stage's sampled ids, on every rank (each passes a buffer of their shape)."""
        if self.size > 1:
            dist.broadcast(sampled, self.result_rank)
        return sampled


SINGLE_STAGE = PipelineStage()
