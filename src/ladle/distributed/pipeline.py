"""A rank's place in the pipeline: which contiguous layers its stage runs, and the hand-offs.

Stage s runs layers [first, end) of the decoder (stage 0 also the embedding, the last stage the
final norm, the LM head and the sampler). A step's hidden states and residual go from each rank
of stage s to the rank of the same tensor-parallel index in stage s + 1; the last stage's
sampled token ids then go back to every rank of the earlier stages, so each keeps the same
request states and the first stage can feed a decode row its last token from the device.
World rank = stage * tensor_parallel_size + tensor-parallel rank.

Several steps (micro-batches) are in flight at once: while the last stage computes step N, the
first computes step N+1. So no hand-off waits on the host: the hidden states leave with isend,
and the sampled ids come back through an asynchronous broadcast that the earlier stages apply
only when a later step needs them (worker/shared_samples.py). The two kinds of hand-off use
their own process groups (forward_group, result_group), and every rank issues each group's
operations in step order, so neither can wait behind the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class PipelineStage:
    index: int = 0
    size: int = 1
    tp_size: int = 1  # ranks per stage
    tp_rank: int = 0
    # Hidden states stage to stage (all ranks), and sampled ids back from the result rank to
    # the earlier stages (those ranks only); None with one stage.
    forward_group: object = None
    result_group: object = None
    # Sends not known complete yet: their tensors must live until they are.
    _sends: list = field(default_factory=list, compare=False, repr=False)

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
        """Hand this stage's outputs to the same tensor-parallel rank of the next stage,
        without waiting for the next stage to take them."""
        peer = (self.index + 1) * self.tp_size + self.tp_rank
        self._sends[:] = [(work, kept) for work, kept in self._sends if not work.is_completed()]
        for tag, tensor in enumerate(tensors):
            tensor = tensor.contiguous()
            work = dist.isend(tensor, peer, group=self.forward_group, tag=tag)
            self._sends.append((work, tensor))

    def receive_forward(
        self, shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device
    ) -> list[torch.Tensor]:
        """The previous stage's outputs, in the order it sent them."""
        received = [torch.empty(shape, dtype=dtype, device=device) for shape in shapes]
        self.receive_forward_into(received)
        return received

    def receive_forward_into(self, buffers: list[torch.Tensor]) -> None:
        """The previous stage's outputs, received into `buffers` (contiguous, in the order it
        sent them): a graph's fixed inputs. The receive is queued behind the work already on
        the stream, so an earlier replay that reads these buffers finishes first."""
        peer = (self.index - 1) * self.tp_size + self.tp_rank
        for tag, buffer in enumerate(buffers):
            dist.recv(buffer, peer, group=self.forward_group, tag=tag)

    @property
    def shares_sampled(self) -> bool:
        """Whether this rank takes part in the sampled ids' broadcast (the result rank and
        every rank of an earlier stage; the last stage's other ranks sampled alike)."""
        return self.size > 1 and (not self.is_last or self.tp_rank == 0)

    def share_sampled(self, sampled: torch.Tensor):
        """Start the broadcast of the last stage's sampled ids to the earlier stages (each of
        those passes a buffer of their shape); returns its Work, or None where this rank takes
        no part. The buffer is final only once the Work is (worker/shared_samples.py)."""
        if not self.shares_sampled:
            return None
        return dist.broadcast(sampled, self.result_rank, group=self.result_group, async_op=True)


SINGLE_STAGE = PipelineStage()
