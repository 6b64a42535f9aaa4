"""`ladle serve MODEL --disaggregate 1P1D`: a prefill and a decode engine behind one endpoint.

On CUDA each engine takes a GPU of its own (prefill GPU 0, decode GPU 1); on the CPU both run
on the host's cores. The API process does not import torch, so GPUs are counted with
nvidia-smi (none found: the CPU)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

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


def instance_devices(disaggregation: Disaggregation, device: str) -> tuple[str, str] | None:
    """The (prefill, decode) engines' devices; None: both on the CPU."""
    if device.startswith("cpu"):
        return None
    num_gpus = count_cuda_devices()
    if device == "auto" and num_gpus == 0:
        return None
    device_type = "cuda"
    disaggregation.check_devices(device_type, num_gpus)
    return ("cuda:0", "cuda:1")


def build_disaggregated_client(
    text: str,
    engine_options: dict,
    metrics,
    admission,
    restart_policy,
    on_fatal: Callable[[str], None],
):
    """The DisaggregatedClient for --disaggregate TEXT (a ValueError names what is wrong)."""
    from ladle.frontend.disagg_client import DisaggregatedClient

    disaggregation = Disaggregation.parse(text)
    if engine_options.get("kv_transfer_config") is not None:
        raise ValueError(
            "--disaggregate sets each engine's kv_transfer_config itself; drop "
            "--kv-transfer-config (it configures one engine of a deployment you wire up)"
        )
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if (engine_options.get(name) or 1) > 1:
            raise ValueError(f"--disaggregate with {name} > 1 is not supported yet")
    devices = instance_devices(disaggregation, str(engine_options.get("device") or "auto"))
    return DisaggregatedClient(
        engine_options,
        metrics,
        admission,
        restart_policy=restart_policy,
        on_fatal=on_fatal,
        devices=devices,
    )
