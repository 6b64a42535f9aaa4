"""`ladle serve MODEL --disaggregate xPyD`: x prefill and y decode engines behind one endpoint.

On CUDA each engine takes a GPU of its own (the prefill engines GPUs 0..x-1, the decode
engines GPUs x..x+y-1; more engines than GPUs is refused); on the CPU all run on the host's
cores. The API process does not import torch, so GPUs are counted with
nvidia-smi (none found: the CPU)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from ladle.frontend.disagg_client import DisaggregatedClient
from ladle.frontend.disagg_routing import SplitPolicy
from ladle.frontend.local_replicas import LocalReplicasClient
from ladle.kv_transfer.config import Disaggregation


def count_cuda_devices() -> int:
    """GPUs nvidia-smi lists (CUDA_VISIBLE_DEVICES narrows what an engine sees, not this)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def instance_devices(num_instances: int, device: str) -> list[str] | None:
    """Each engine's device (GPU i for instance i); None: all on the CPU."""
    if device.startswith("cpu"):
        return None
    num_gpus = count_cuda_devices()
    if device == "auto" and num_gpus == 0:
        return None
    if num_instances > num_gpus:
        raise ValueError(
            f"{num_instances} engines need {num_instances} GPUs (one each), this machine has "
            f"{num_gpus}"
        )
    return [f"cuda:{index}" for index in range(num_instances)]


def build_disaggregated_client(
    text: str | None,
    num_local_replicas: int,
    engine_options: dict,
    metrics,
    admission,
    restart_policy,
    on_fatal: Callable[[str], None],
    min_prompt_tokens: int | str = 0,
):
    """The client for --disaggregate TEXT or --local-replicas N (a ValueError names what is
    wrong)."""
    if text is not None and num_local_replicas != 1:
        raise ValueError("--disaggregate and --local-replicas exclude each other: pick one")
    if num_local_replicas < 1:
        raise ValueError(f"--local-replicas must be >= 1, got {num_local_replicas}")
    if engine_options.get("kv_transfer_config") is not None:
        raise ValueError(
            "--disaggregate / --local-replicas set up the engines themselves; drop "
            "--kv-transfer-config (it configures one engine of a deployment you wire up)"
        )
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if (engine_options.get(name) or 1) > 1:
            raise ValueError(f"--disaggregate / --local-replicas with {name} > 1: not supported")
    device = str(engine_options.get("device") or "auto")

    split_policy = SplitPolicy.parse(min_prompt_tokens, engine_options.get("itl_slo_ms"))
    if (split_policy.min_prompt_tokens or split_policy.is_auto) and text is None:
        raise ValueError("--disaggregate-min-prompt goes with --disaggregate")
    if text is None:
        return LocalReplicasClient(
            engine_options, metrics, admission, num_local_replicas,
            restart_policy=restart_policy, on_fatal=on_fatal,
            devices=instance_devices(num_local_replicas, device),
        )
    disaggregation = Disaggregation.parse(text)
    devices = instance_devices(disaggregation.num_instances, device)
    return DisaggregatedClient(
        engine_options,
        metrics,
        admission,
        restart_policy=restart_policy,
        on_fatal=on_fatal,
        devices=devices,
        split_policy=split_policy,
        num_prefill=disaggregation.num_prefill,
        num_decode=disaggregation.num_decode,
    )
