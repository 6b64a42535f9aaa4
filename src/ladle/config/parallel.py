"""ParallelConfig: tensor, pipeline, data and expert parallelism, and who runs the ranks."""

from __future__ import annotations

from dataclasses import dataclass, field

EXECUTOR_BACKENDS = ("uni", "mp", "ray")
# distributed/expert_dispatch.py implements the forms ("auto" times them at start-up).
DISPATCH_MODES = ("auto", "allreduce", "alltoall")


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is spread over devices and processes (vLLM's names). One worker process
    per rank; tensor and pipeline parallelism run today, and the issues that add data and expert
    parallelism lift those limits."""

    tensor_parallel_size: int = field(
        default=1, metadata={"help": "GPUs each layer is split over (tensor parallelism)"}
    )
    pipeline_parallel_size: int = field(
        default=1, metadata={"help": "stages the layers are split into (pipeline parallelism)"}
    )
    data_parallel_size: int = field(
        default=1, metadata={"help": "engine replicas in data parallel (one today)"}
    )
    enable_expert_parallel: bool = field(
        default=False, metadata={"help": "spread a mixture of experts' experts over the ranks"}
    )
    disable_custom_all_reduce: bool = field(
        default=False,
        metadata={"help": "keep NCCL for every tensor-parallel all-reduce (by default small ones "
                  "take a one-shot all-reduce over symmetric memory where start-up measures it "
                  "faster, on CUDA)"},
    )
    expert_parallel_dispatch: str = field(
        default="auto",
        metadata={"help": "how expert parallelism moves tokens to their experts' ranks: "
                  "'allreduce' (every rank runs its experts on every token, one all-reduce), "
                  "'alltoall' (tokens sent to their experts' ranks and back, then an "
                  "all-gather) or 'auto' (timed at start-up, chosen per step size)"},
    )
    distributed_executor_backend: str | None = field(
        default=None,
        metadata={"help": "how workers run: 'uni' (in the engine process), 'mp' (one process "
                  "per rank) or 'ray' (one Ray actor per rank, on any host of a Ray cluster); "
                  "default 'uni' for one rank, 'mp' for several"},
    )

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.data_parallel_size > 1:
            raise ValueError(
                f"data_parallel_size={self.data_parallel_size}: data parallelism inside one "
                "engine is not implemented; run replicas (ladle serve --replicas N)"
            )
        if self.expert_parallel_dispatch not in DISPATCH_MODES:
            raise ValueError(
                f"expert_parallel_dispatch must be one of {', '.join(DISPATCH_MODES)}, got "
                f"{self.expert_parallel_dispatch!r}"
            )
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {', '.join(EXECUTOR_BACKENDS)}, "
                f"got {backend!r}"
            )
        if backend == "uni" and self.world_size > 1:
            raise ValueError(
                "distributed_executor_backend='uni' runs one rank in the engine process; "
                f"{self.world_size} ranks (tensor_parallel_size={self.tensor_parallel_size}, "
                f"pipeline_parallel_size={self.pipeline_parallel_size}) need 'mp' (one process "
                "per rank)"
            )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def executor_backend(self) -> str:
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "mp" if self.world_size > 1 else "uni"
