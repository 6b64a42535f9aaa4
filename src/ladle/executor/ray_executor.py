"""The Ray executor (`--distributed-executor-backend ray`): the multi-process executor's workers
started as Ray actors, one per rank, placed by a placement group, so the ranks of one model can
sit on several hosts of a Ray cluster (pipeline stages across hosts, tensor groups within one).

Everything after start-up is the multi-process executor's: plans and results over ZMQ (TCP here,
to the engine's host), torch.distributed among the ranks (NCCL on CUDA, gloo on the CPU; the
rendezvous at rank 0's host). An actor is owned by the engine process, so Ray ends it when the
engine ends; its handle answers poll/wait/kill as a subprocess would, so the liveness checks and
the shutdown are shared.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess

import zmq

from ladle.config import EngineConfig
from ladle.executor.multiprocess import MultiprocessExecutor, run_worker

# How long the placement group may wait for its bundles (GPUs or CPUs) to be free.
PLACEMENT_TIMEOUT_S = 300


class _RankActor:
    """One rank's worker, inside a Ray actor process."""

    def address(self) -> tuple[str, int, int]:
        """(this node's IP, a free TCP port on it, this process's pid)."""
        import ray  # optional, ~0.25 s: only the ray backend loads it (see _start_workers)

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port, os.getpid()

    def run(self, config_bytes: bytes, rank: int, addresses: tuple, device_index: int | None):
        input_address, output_address, ready_address, rendezvous = addresses
        run_worker(
            pickle.loads(config_bytes),
            rank,
            input_address,
            output_address,
            ready_address,
            rendezvous,
            device_index=device_index,
            watch_parent=False,
        )


class RayWorkerHandle:
    """A rank's actor, answering as a subprocess.Popen does where the executor asks."""

    def __init__(self, actor, run_ref, pid: int) -> None:
        self.actor = actor
        self.run_ref = run_ref
        self.pid = pid

    def poll(self) -> int | None:
        import ray  # optional, ~0.25 s: only the ray backend loads it (see _start_workers)

        done, _ = ray.wait([self.run_ref], timeout=0)
        if not done:
            return None
        try:
            ray.get(self.run_ref)
            return 0
        except Exception:
            return 1

    def wait(self, timeout: float | None = None) -> int:
        import ray  # optional, ~0.25 s: only the ray backend loads it (see _start_workers)

        done, _ = ray.wait([self.run_ref], timeout=timeout)
        if not done:
            raise subprocess.TimeoutExpired(f"ray actor {self.pid}", timeout)
        return self.poll() or 0

    def kill(self) -> None:
        import ray  # optional, ~0.25 s: only the ray backend loads it (see _start_workers)

        ray.kill(self.actor, no_restart=True)


class RayExecutor(MultiprocessExecutor):
    def __init__(self, config: EngineConfig) -> None:
        import ray  # optional, ~0.25 s: only the ray backend loads it (see _start_workers)

        if not ray.is_initialized():
            # A cluster the environment names (RAY_ADDRESS), else a local one.
            ray.init(ignore_reinit_error=True, log_to_driver=False)
        self._engine_ip = ray.util.get_node_ip_address()
        self._placement_group = None
        super().__init__(config)

    def _bind(self, zmq_socket: zmq.Socket, name: str) -> str:
        port = zmq_socket.bind_to_random_port(f"tcp://{self._engine_ip}")
        return f"tcp://{self._engine_ip}:{port}"

    def _start_workers(
        self,
        config: EngineConfig,
        input_addresses: list[str],
        output_address: str,
        ready_address: str,
    ) -> list[RayWorkerHandle]:
        # Ray is optional and ~0.25 s to import: the engine imports this module through
        # executor/factory.py whatever the backend, only the ray backend loads Ray.
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # The engine's host may have no GPU (a head node): 'auto' asks the cluster instead.
        device = config.model.device
        on_gpu = device.startswith("cuda") or (
            device == "auto" and ray.cluster_resources().get("GPU", 0) >= len(input_addresses)
        )
        bundle = {"GPU": 1, "CPU": 1} if on_gpu else {"CPU": 1}
        # PACK: ranks on as few hosts as fit (a tensor group wants NVLink, not the network).
        group = placement_group([dict(bundle) for _ in input_addresses], strategy="PACK")
        self._placement_group = group
        if not group.wait(PLACEMENT_TIMEOUT_S):
            ray.util.remove_placement_group(group)
            raise RuntimeError(
                f"Ray could not place {len(input_addresses)} workers of {bundle} each in "
                f"{PLACEMENT_TIMEOUT_S} s; the cluster has {ray.cluster_resources()}"
            )
        actor_class = ray.remote(num_cpus=1, num_gpus=1 if on_gpu else 0)(_RankActor)
        actors = [
            actor_class.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=rank
                )
            ).remote()
            for rank in range(len(input_addresses))
        ]
        places = ray.get([actor.address.remote() for actor in actors])
        rank0_ip, rank0_port, _ = places[0]
        rendezvous = f"tcp://{rank0_ip}:{rank0_port}"
        config_bytes = pickle.dumps(config)
        handles = []
        for rank, (actor, address) in enumerate(zip(actors, input_addresses)):
            # Ray gives each GPU actor only its own GPU (CUDA_VISIBLE_DEVICES): index 0.
            run_ref = actor.run.remote(
                config_bytes,
                rank,
                (address, output_address, ready_address, rendezvous),
                0 if on_gpu else None,
            )
            handles.append(RayWorkerHandle(actor, run_ref, places[rank][2]))
        return handles

    def shutdown(self) -> None:
        super().shutdown()
        if self._placement_group is not None:
            import ray  # optional, ~0.25 s: only the ray backend loads it (see _start_workers)

            for handle in self._processes:
                handle.kill()
            ray.util.remove_placement_group(self._placement_group)
            self._placement_group = None
