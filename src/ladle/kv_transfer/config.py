"""--kv-transfer-config (vLLM's keys) and --disaggregate xPyD, parsed and checked.

A producer (kv_producer) computes prompts and their first token and keeps each such request's
KV blocks until a consumer has pulled them; a consumer (kv_consumer) pulls the blocks into its
own pool and decodes. kv_both does either, per request. ladle has one connector of its own,
LadleConnector: the consumer's worker reads the producer's exported pool (shared memory on the
CPU, CUDA IPC between GPUs of one host). vLLM's connector names are recognised so that their
users get "not supported" rather than "unknown".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
LADLE_CONNECTOR = "LadleConnector"
# vLLM's connectors: refused by name, with what ladle offers instead.
VLLM_CONNECTORS = (
    "NixlConnector",
    "P2pNcclConnector",
    "LMCacheConnectorV1",
    "MooncakeConnector",
    "SharedStorageConnector",
    "ExampleConnector",
    "OffloadingConnector",
    "MultiConnector",
    "PyNcclConnector",
)
# vLLM's keys ladle reads; the others of vLLM's are accepted and ignored (they configure
# transports ladle does not have), anything else is refused.
KNOWN_KEYS = {"kv_connector", "kv_role", "engine_id", "kv_rank", "kv_parallel_size",
              "kv_buffer_device", "kv_connector_extra_config"}
IGNORED_VLLM_KEYS = {"kv_buffer_size", "kv_ip", "kv_port", "kv_connector_module_path",
                     "enable_permute_local_kv", "kv_load_failure_policy"}
# How long a producer keeps a finished prompt's blocks for a consumer that never pulls them.
DEFAULT_HOLD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class KVTransferConfig:
    """One engine's part in a disaggregated deployment."""

    kv_role: str
    kv_connector: str = LADLE_CONNECTOR
    engine_id: str | None = None
    hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S

    @property
    def is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @classmethod
    def from_dict(cls, options: dict) -> KVTransferConfig:
        """Parse a --kv-transfer-config object; a ValueError names the bad field."""
        if not isinstance(options, dict):
            raise ValueError(f"kv_transfer_config must be a JSON object, got {options!r}")
        unknown = sorted(set(options) - KNOWN_KEYS - IGNORED_VLLM_KEYS)
        if unknown:
            raise ValueError(
                f"kv_transfer_config: unknown key(s) {', '.join(map(repr, unknown))}; ladle "
                f"reads {', '.join(sorted(KNOWN_KEYS))}"
            )
        connector = options.get("kv_connector") or LADLE_CONNECTOR
        if connector != LADLE_CONNECTOR:
            known = connector in VLLM_CONNECTORS
            raise ValueError(
                f"kv_transfer_config.kv_connector={connector!r} is "
                f"{'a vLLM connector ladle does not implement' if known else 'unknown'}; "
                f"ladle's connector is {LADLE_CONNECTOR!r} (shared memory on the CPU, CUDA IPC "
                "between GPUs of one host)"
            )
        role = options.get("kv_role")
        if role not in KV_ROLES:
            raise ValueError(
                f"kv_transfer_config.kv_role must be one of {', '.join(KV_ROLES)}, got {role!r}"
            )
        device = options.get("kv_buffer_device")
        if device not in (None, "cuda", "cpu"):
            raise ValueError(
                f"kv_transfer_config.kv_buffer_device must be 'cuda' or 'cpu', got {device!r}"
            )
        extra = options.get("kv_connector_extra_config") or {}
        if not isinstance(extra, dict):
            raise ValueError("kv_transfer_config.kv_connector_extra_config must be an object")
        unknown_extra = sorted(set(extra) - {"hold_timeout_s"})
        if unknown_extra:
            raise ValueError(
                f"kv_transfer_config.kv_connector_extra_config: unknown key(s) "
                f"{', '.join(map(repr, unknown_extra))}; ladle reads 'hold_timeout_s'"
            )
        timeout = extra.get("hold_timeout_s", DEFAULT_HOLD_TIMEOUT_S)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(
                "kv_transfer_config.kv_connector_extra_config.hold_timeout_s must be a number "
                f"> 0, got {timeout!r}"
            )
        engine_id = options.get("engine_id")
        if engine_id is not None and not isinstance(engine_id, str):
            raise ValueError(f"kv_transfer_config.engine_id must be a string, got {engine_id!r}")
        return cls(kv_role=role, engine_id=engine_id, hold_timeout_s=float(timeout))


@dataclass(frozen=True)
class Disaggregation:
    """--disaggregate xPyD: x prefill instances and y decode instances behind one endpoint."""

    num_prefill: int
    num_decode: int

    @property
    def num_instances(self) -> int:
        return self.num_prefill + self.num_decode

    @classmethod
    def parse(cls, text: str) -> Disaggregation:
        match = re.fullmatch(r"\s*(\d+)\s*[pP]\s*(\d+)\s*[dD]\s*", text or "")
        if match is None:
            raise ValueError(
                f"--disaggregate takes xPyD (x prefill and y decode instances), e.g. 1P1D; "
                f"got {text!r}"
            )
        num_prefill, num_decode = int(match.group(1)), int(match.group(2))
        if num_prefill < 1 or num_decode < 1:
            raise ValueError(f"--disaggregate {text}: needs at least 1 prefill and 1 decode")
        return cls(num_prefill, num_decode)
