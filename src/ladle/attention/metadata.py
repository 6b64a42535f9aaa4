"""The attention metadata of one step: a flattened (varlen) batch over the paged KV cache.

Tokens of all scheduled requests are concatenated into one sequence of num_tokens. Request i owns
query rows query_start_loc[i]:query_start_loc[i+1]; those are the last query_len tokens of its
context, which is seq_lens[i] tokens long once this step's keys and values are written. A query
token at context position p attends to context positions 0..p (causal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    # [num_tokens] int64: flat cache slot (block_id * block_size + offset) where each token's key
    # and value are written. Padding tokens point at the null block 0.
    slot_mapping: torch.Tensor
    # [num_reqs + 1] int32: prefix sums of query lengths.
    query_start_loc: torch.Tensor
    # [num_reqs] int32: context length of each request after this step.
    seq_lens: torch.Tensor
    # [num_reqs, max_blocks_per_req] int32: physical block ids, padded with 0 (the null block).
    block_tables: torch.Tensor
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Host copies, for backends that loop over requests (the CPU reference backend). They cost
    # nothing extra: the runner builds them before the one host-to-device copy.
    query_start_loc_host: list[int]
    seq_lens_host: list[int]
    # The launches of a prefill graph (worker/prefill_graphs.py): one general attention launch
    # with fixed tiles, no choice following the host values above, so the template holds for any
    # layout that the replays bring. Set on the template and on an eager step that fits a prefill
    # bucket, so that graphs never change a step's numbers.
    graph_launches: bool = False
    # The request and token counts an attention launch is sized for (its split-KV factor), when
    # a graph bucket pads the step beyond num_reqs and num_tokens; None: the step's own. Set for
    # the same reason as graph_launches.
    launch_num_reqs: int | None = None
    launch_num_tokens: int | None = None
    # What a backend derives from this step's metadata once and reuses in every layer (the CPU
    # backend's gather indices and mask); empty when the step starts.
    backend_cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def one_fresh_prompt(
        cls, num_tokens: int, block_size: int, device: torch.device | str = "cpu"
    ) -> AttentionMetadata:
        """One uncached prompt of num_tokens whose keys and values go to blocks 1, 2, ... (block
        0 is the null block): the step of a whole-prompt forward outside the engine (perplexity,
        quality benches, tests)."""
        num_blocks = -(-num_tokens // block_size)
        return cls(
            slot_mapping=torch.arange(block_size, block_size + num_tokens, device=device),
            query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
            block_tables=torch.arange(1, num_blocks + 1, dtype=torch.int32, device=device)[None],
            max_query_len=num_tokens,
            max_seq_len=num_tokens,
            block_size=block_size,
            query_start_loc_host=[0, num_tokens],
            seq_lens_host=[num_tokens],
        )

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_host)
