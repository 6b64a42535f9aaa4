"""Where drafts are made: on the device, so that drafted requests' steps overlap
(worker/drafts_on_device.py, core/drafts_in_flight.py), or on the host.

The engine's scheduler and every worker ask drafts_on_device of the same config, so they agree;
it lives here, not in the engine, because the workers import nothing of the engine.
"""

from __future__ import annotations

from ladle.config import EngineConfig


def drafts_on_device(config: EngineConfig, device_type: str) -> bool:
    """n-gram speculation with overlapped steps, on one pipeline stage, on a GPU unless the
    config says otherwise (speculative_config.drafts_on_device: true also on the CPU, false
    never). Suffix and model drafts are read on the host."""
    speculative = config.scheduler.speculative
    if speculative is None:
        return False
    wanted = speculative.drafts_on_device
    return (
        (device_type == "cuda" if wanted is None else wanted)
        and speculative.method == "ngram"
        and config.scheduler.overlaps_on(device_type)
        and config.parallel.pipeline_parallel_size == 1
    )
