"""ReplicaServerSettings: the `ladle serve` server options each replica applies to its own app,
admission and live log, so `ladle serve --replicas N --ttft-slo 1s ...` behaves per replica as
`ladle serve --ttft-slo 1s ...` does. Plain data: Ray pickles it to every replica."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReplicaServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_request_bytes: int = 4 * 1024 * 1024
    allow_unknown_fields: bool = False
    max_queued_requests: int = 1024
    max_queued_tokens: int = 1 << 20
    ttft_slo_s: float | None = None  # refuse requests predicted to miss it (429, Retry-After)
    stats_interval_s: float = 5.0  # the live stats line, per replica; 0: none
    log_requests: bool = True  # one log line per finished request
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    response_role: str = "assistant"  # vLLM's --response-role
    return_tokens_as_token_ids: bool = False  # vLLM's flag: logprobs name tokens token_id:N
    # Where each replica's own HTTP server listens (the front connects there); None: the
    # node's IP as Ray knows it, so a front on another node of the cluster reaches it.
    http_host: str | None = None

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        for name in ("max_queued_requests", "max_queued_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ttft_slo_s is not None and not self.ttft_slo_s > 0:
            raise ValueError(f"ttft_slo must be > 0 seconds, got {self.ttft_slo_s}")
        if self.stats_interval_s < 0:
            raise ValueError(f"stats_interval must be >= 0 seconds, got {self.stats_interval_s}")
