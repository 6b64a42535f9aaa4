"""A decode step's whole decoder stack in one C call (decode_stack.c): the operand table it
reads, and the call.

The table holds, per layer, the pointers and flags of `layer_weights` in decode_stack.c (every
field 8 bytes) in an int64 tensor; it is built once per model from tensors that the model keeps
alive (`DecodeStackWeights.keep_alive` holds what was converted for it), and only the KV cache
pointers are written again when the cache tensors change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ladle.kernels.cpu_native.build import kernel_threads, native_library

# The fields of decode_stack.c's layer_weights, in its order.
PROJECTION_FIELDS = ("codes", "scale", "offset", "bias", "scale_is_half")
PROJECTIONS = ("qkv", "o", "gate_up", "down")
LAYER_FIELDS = (
    "input_norm",
    "post_attention_norm",
    *(f"{projection}.{field}" for projection in PROJECTIONS for field in PROJECTION_FIELDS),
    "kv_cache",
)
KV_CACHE_FIELD = LAYER_FIELDS.index("kv_cache")


@dataclass(frozen=True)
class Q4Projection:
    """One projection's 4-bit group-32 weight, as q4_int8_gemm.c reads it."""

    codes: torch.Tensor  # uint8 [n, K / 2]
    scale: torch.Tensor  # float16 or float32 [n, K / 32]
    offset: torch.Tensor | None  # the scale's dtype, or None
    bias: torch.Tensor | None  # float32 [n], or None

    def fields(self) -> list[int]:
        return [
            self.codes.data_ptr(),
            self.scale.data_ptr(),
            0 if self.offset is None else self.offset.data_ptr(),
            0 if self.bias is None else self.bias.data_ptr(),
            int(self.scale.dtype == torch.float16),
        ]


@dataclass(frozen=True)
class LayerOperands:
    input_norm: torch.Tensor  # float32 [hidden]
    post_attention_norm: torch.Tensor
    qkv: Q4Projection
    o: Q4Projection
    gate_up: Q4Projection
    down: Q4Projection


@dataclass(frozen=True)
class StackSizes:
    """The model's sizes (decode_stack.c's stack_dims without the step's)."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    attention_scale: float


class DecodeStackWeights:
    """The operand table of one model, built once; `call` runs a step."""

    def __init__(
        self, layers: list[LayerOperands], final_norm: torch.Tensor, sizes: StackSizes
    ) -> None:
        rows = [
            [
                layer.input_norm.data_ptr(),
                layer.post_attention_norm.data_ptr(),
                *layer.qkv.fields(),
                *layer.o.fields(),
                *layer.gate_up.fields(),
                *layer.down.fields(),
                0,  # kv_cache: written per step
            ]
            for layer in layers
        ]
        self.table = torch.tensor(rows, dtype=torch.int64)
        self.keep_alive = (layers, final_norm)
        self.final_norm = final_norm
        self.sizes = sizes
        self.num_layers = len(layers)
        self._kv_cache_pointers: tuple[int, ...] = ()

    def _point_at(self, kv_caches: list[torch.Tensor]) -> None:
        pointers = tuple(cache.data_ptr() for cache in kv_caches)
        if pointers != self._kv_cache_pointers:
            self.table[:, KV_CACHE_FIELD] = torch.tensor(pointers, dtype=torch.int64)
            self._kv_cache_pointers = pointers

    def call(
        self,
        embedded: torch.Tensor,  # float32 [m, hidden], contiguous
        rotary_tables: tuple[torch.Tensor, torch.Tensor],  # float32 [m, 1, head_dim] each
        kv_caches: list[torch.Tensor],  # float32 [2, blocks, block_size, kv_heads, head_dim]
        slot_mapping: torch.Tensor,  # int64 [m]
        context_slots: torch.Tensor,  # int64 [m * max_context]
        lengths: torch.Tensor,  # int64 [m]
        max_context: int,
        activation_bits: int,
    ) -> torch.Tensor | None:
        """The final norm's output [m, hidden]; None when the library is missing or the kernel
        refused (the caller then runs the layers one by one, which rewrite the same cache
        slots with the same values)."""
        library = native_library()
        if library is None or library.ladle_decode_stack_layer_fields() != len(LAYER_FIELDS):
            return None
        self._point_at(kv_caches)
        sizes, first_cache = self.sizes, kv_caches[0]
        num_rows = embedded.shape[0]
        num_slots = first_cache.shape[1] * first_cache.shape[2]
        dims = torch.tensor(
            [
                self.num_layers, num_rows, sizes.hidden, sizes.num_heads, sizes.num_kv_heads,
                sizes.head_dim, sizes.intermediate, activation_bits, num_slots, max_context,
            ],
            dtype=torch.int64,
        )  # fmt: skip
        cos, signed_sin = rotary_tables
        output = torch.empty_like(embedded)
        status = library.ladle_decode_stack(
            self.table.data_ptr(), dims.data_ptr(), sizes.eps, sizes.attention_scale,
            self.final_norm.data_ptr(), embedded.data_ptr(), cos.data_ptr(),
            signed_sin.data_ptr(), slot_mapping.data_ptr(), context_slots.data_ptr(),
            lengths.data_ptr(), output.data_ptr(), kernel_threads(),
        )  # fmt: skip
        return output if status == 0 else None
