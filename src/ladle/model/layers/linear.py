"""Linear layers that know how to load their checkpoint weights.

Each layer owns a weight_loader(param, loaded_weight, shard_id) that copies one checkpoint tensor
into its slice of the parameter. Merged layers (QKV, gate_up) run one matmul instead of three or
two, and load their checkpoint's separate q/k/v or gate/up tensors into row slices. Tensor
parallelism would add column/row-parallel variants whose loaders also slice by rank; these are
the single-device versions, kept explicit so that change is local.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.layers.deferred_norm import DeferredNorm
from ladle.model.layers.group_quant import GroupQuantizedRows
from ladle.model.layers.quantized_linear import hold_quantized_rows, quantized_matmul
from ladle.model.layers.weight_loading import default_weight_loader
from ladle.model.load_errors import ModelLoadError

if TYPE_CHECKING:
    # Only the annotation names it: the quant package sits above Linear (its model walks find
    # Linears), so importing it here at run time would make the two import each other.
    from ladle.model.layers.quant.base import QuantMethod


class Linear(nn.Module):
    """y = x W^T + b, with W [output_size, input_size]. Parameters start uninitialised.
    After `quantize_model_` the weight is int8 codes + row scales (quantized_linear.py); after
    the GPU methods (quant/) `quant_method` holds the method that runs the matmul."""

    quantization: str | None = None
    quant_method: QuantMethod | None = None

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False) if bias else None
        # An act-order int4 checkpoint's input order (quant/act_order.py): x is gathered into it.
        # An instance attribute, so that the parameter can take its name.
        self.input_permutation: nn.Parameter | None = None

    def forward(self, x: torch.Tensor | DeferredNorm) -> torch.Tensor:
        if isinstance(x, DeferredNorm):
            if self.runs_gemv(x.x):
                from ladle.kernels.gemv import gemv  # CUDA only, as below

                return gemv(x.x, self.weight, self.bias, **x.gemv_operands())
            x = x.materialize()
        if self.input_permutation is not None:
            x = x.index_select(-1, self.input_permutation)
        if self.quant_method is not None:
            return self.quant_method.apply(self, x)
        if self.quantization is not None:
            return quantized_matmul(self, x, self.bias)
        if x.shape[0] == 1 and use_fused_kernels(x):
            # Batch-1 decode: a weight-read-bound row, faster in ladle's GEMV than in cuBLAS.
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py).
            from ladle.kernels.gemv import gemv, gemv_applies

            if gemv_applies(x, self.weight):
                return gemv(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def runs_gemv(self, x: torch.Tensor) -> bool:
        """Whether forward(x) is ladle's batch-1 GEMV on these plain weights (one row on CUDA)."""
        plain = (
            self.input_permutation is None
            and self.quant_method is None
            and self.quantization is None
        )
        if not (plain and x.shape[0] == 1 and use_fused_kernels(x)):
            return False
        from ladle.kernels.gemv import gemv_applies  # CUDA only, as in forward

        return gemv_applies(x, self.weight)

    def takes_deferred_norm(
        self, x: torch.Tensor, norm_weight: torch.Tensor, residual: torch.Tensor | None
    ) -> bool:
        """Whether this layer can run the RMSNorm (norm_weight, residual) of its input x inside
        its own GEMV launch (layers/deferred_norm.py). Not while hooks watch this layer's
        input (calibration records it): they would see the DeferredNorm."""
        if self._forward_pre_hooks or self._forward_hooks or not self.runs_gemv(x):
            return False
        from ladle.kernels.gemv import norm_prologue_applies

        return norm_prologue_applies(x, norm_weight, residual)

    def shard_rows(self, shard_id: str | int | None) -> tuple[int, int]:
        """(first row, number of rows) of the parameter that one checkpoint tensor fills."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard_id!r}")
        return 0, self.output_size

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy a checkpoint tensor (weight or bias) into its rows, casting dtype and device. A
        group-quantized tensor (a GGUF tensor kept in its own format) is held until
        `adopt_native_weights_` stacks the shards. An act-order input permutation is the whole
        input's, the same in every shard."""
        if param is self.input_permutation:
            self.load_input_permutation(loaded_weight, shard_id)
            return
        start, num_rows = self.shard_rows(shard_id)
        if isinstance(loaded_weight, GroupQuantizedRows):
            hold_quantized_rows(self, param, loaded_weight, start, num_rows, self.input_size)
            return
        default_weight_loader(param.data.narrow(0, start, num_rows), loaded_weight)

    def load_input_permutation(self, loaded: torch.Tensor, shard_id: str | int | None) -> None:
        """Copy one projection's act-order permutation into the layer's (quant/act_order.py
        gives it the identity first); the shards of a merged layer must bring the same one: they
        share the input the layer gathers."""
        loaded = loaded.to(self.input_permutation.device, torch.int64)
        if self.input_permutation_shards and not torch.equal(self.input_permutation.data, loaded):
            raise ModelLoadError(
                "its act-order input permutation differs from the other projections of the same "
                "input, which ladle runs in one matmul"
            )
        self.input_permutation.data.copy_(loaded)
        self.input_permutation_shards.add(shard_id)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}"


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output: gate_up = [gate; up].
    Checkpoint shards are loaded by index into the stack."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def gate_up_silu(self, x: torch.Tensor | DeferredNorm) -> torch.Tensor | None:
        """silu(gate) * up of this [gate; up] layer's output for one row on CUDA, in one GEMV
        launch (kernels/gemv.py: gate_up_silu; a DeferredNorm input is normalised in the same
        launch), or the quantization method's (QuantMethod.gate_up_silu); None where neither
        applies (permuted or biased weights, more rows, unequal halves, the CPU): the caller
        then runs the projection and SiLU-and-mul."""
        row = x.x if isinstance(x, DeferredNorm) else x
        halves = len(self.output_sizes) == 2 and self.output_sizes[0] == self.output_sizes[1]
        if not halves or self.bias is not None:
            return None
        if self.quant_method is not None and self.input_permutation is None:
            # The quantized weight's own fused launch (fp8: quant/fp8_one_row.py), or None.
            return self.quant_method.gate_up_silu(self, x)
        if not self.runs_gemv(row):
            return None
        from ladle.kernels.gemv import gate_up_silu  # CUDA only, as above

        if isinstance(x, DeferredNorm):
            return gate_up_silu(x.x, self.weight, **x.gemv_operands())
        return gate_up_silu(x, self.weight)

    def shard_rows(self, shard_id: str | int | None) -> tuple[int, int]:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"{type(self).__name__} has no shard {shard_id!r}")
        return sum(self.output_sizes[:shard_id]), self.output_sizes[shard_id]


class QKVLinear(MergedLinear):
    """The merged query/key/value projection; output is [q (num_heads * head_dim); k; v]."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool
    ) -> None:
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, [self.q_size, self.kv_size, self.kv_size], bias)

    def shard_rows(self, shard_id: str | int | None) -> tuple[int, int]:
        index = {"q": 0, "k": 1, "v": 2}.get(shard_id) if isinstance(shard_id, str) else None
        if index is None:
            raise ValueError(f"QKVLinear has no shard {shard_id!r}; use 'q', 'k' or 'v'")
        return super().shard_rows(index)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split the merged output [num_tokens, q + 2 * kv] into q, k, v views."""
        return qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
