"""The CPU's decode steps of a Llama-family model in one C call (kernels/cpu_native/decode_stack.c)
where the model allows it: every projection a 4-bit group-32 weight kept from a GGUF (the
default model's Q4_1), no per-head q/k norm, the CPU attention backend, a float32 KV cache, and
a step of decode rows only (one new token per request, up to the norm kernels' 64 rows), or a
speculative step that verifies drafts, run as one decode row per token (as_decode_rows).

The C call chains the very kernels the layer-by-layer path calls (norms, 4-bit matmuls with
the same activation bits, rotary and cache write, decode attention, SiLU-and-mul) on the same
operands, so the hidden states it returns are that path's bit for bit; it only drops the ~25
torch ops and ctypes calls per layer around them. Anything else (prefill chunks, other weight
formats, Qwen3's q/k norm, a float8 cache) runs the layers as before.

LADLE_CPU_DECODE_STACK=0 turns it off (tests compare the two paths).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ladle.attention.cpu_backend import CpuAttentionBackend, decode_gather_plan
from ladle.attention.metadata import AttentionMetadata
from ladle.kernels.cpu_native.decode_ops import MAX_ELEMENTWISE_ROWS
from ladle.kernels.cpu_native.decode_stack import (
    DecodeStackWeights,
    LayerOperands,
    Q4Projection,
    StackSizes,
)
from ladle.kernels.cpu_native.gemv import activation_bits, integer_activation_max_rows
from ladle.model.layers.group_quant import GroupQuantizedRows

ENABLE_ENV = "LADLE_CPU_DECODE_STACK"
_enabled = os.environ.get(ENABLE_ENV, "1") != "0"
# Where the model's weights do not fit the C call: remembered so the check runs once.
_NOT_APPLICABLE = "not applicable"


def set_decode_stack(enabled: bool) -> bool:
    """Turn the one-call decode stack on or off for this process; returns the previous
    setting."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


def _q4_projection(module: torch.nn.Module) -> Q4Projection | None:
    if getattr(module, "input_permutation", None) is not None:
        return None  # an act-order layer gathers its input in Linear.forward, which C skips
    weight = getattr(module, "quantized_weight", None)
    if not isinstance(weight, GroupQuantizedRows):
        return None
    if weight.bits != 4 or weight.group_size != 32 or weight.padded_columns != weight.num_columns:
        return None
    if weight.num_columns % 64 or weight.codes.device.type != "cpu":
        return None
    codes, scale, offset = weight.codes, weight.scale, weight.offset
    if codes.dtype != torch.uint8 or not codes.is_contiguous() or not scale.is_contiguous():
        return None
    if scale.dtype not in (torch.float16, torch.float32):
        return None
    if offset is not None and (offset.dtype != scale.dtype or not offset.is_contiguous()):
        return None
    bias = getattr(module, "bias", None)
    if bias is not None:
        bias = bias.detach().contiguous().float()
    return Q4Projection(codes, scale, offset, bias)


def _float32_norm(norm: torch.nn.Module) -> torch.Tensor | None:
    weight = norm.weight
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    return weight.detach().contiguous()


def _build(model: nn.Module) -> DecodeStackWeights | None:
    """The operand table, or None where some layer does not fit the C call."""
    layers: list[LayerOperands] = []
    norms = [model.norm]
    for layer in model.layers:
        attention = layer.self_attn
        if not hasattr(layer.mlp, "gate_up_proj"):  # a mixture of experts: no C path
            return None
        if attention.q_norm is not None or not isinstance(
            attention.attn.backend, CpuAttentionBackend
        ):
            return None
        projections = [
            _q4_projection(module)
            for module in (
                attention.qkv_proj,
                attention.o_proj,
                layer.mlp.gate_up_proj,
                layer.mlp.down_proj,
            )
        ]
        input_norm = _float32_norm(layer.input_layernorm)
        post_norm = _float32_norm(layer.post_attention_layernorm)
        if None in projections or input_norm is None or post_norm is None:
            return None
        layers.append(LayerOperands(input_norm, post_norm, *projections))
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    final_norm = _float32_norm(model.norm)
    if not layers or final_norm is None or len({norm.eps for norm in norms}) != 1:
        return None
    first = model.layers[0].self_attn
    sizes = StackSizes(
        hidden=model.norm.hidden_size,
        num_heads=first.num_heads,
        num_kv_heads=first.num_kv_heads,
        head_dim=first.head_dim,
        intermediate=model.layers[0].mlp.down_proj.input_size,
        eps=model.norm.eps,
        attention_scale=first.attn.scale,
    )
    return DecodeStackWeights(layers, final_norm, sizes)


def _weights(model: nn.Module) -> DecodeStackWeights | None:
    cached = model.__dict__.get("_cpu_decode_stack")
    if cached is None:
        cached = _build(model) or _NOT_APPLICABLE
        # In the instance dict, not as a submodule or buffer: it only points at the model's
        # own tensors.
        model.__dict__["_cpu_decode_stack"] = cached
    return None if cached is _NOT_APPLICABLE else cached


# A step whose requests each bring at most this many new tokens after cached context (a decode
# verifying up to 16 drafts) runs as one decode row per token (as_decode_rows).
MAX_VERIFY_QUERY_LEN = 17


def as_decode_rows(metadata: AttentionMetadata, num_rows: int) -> AttentionMetadata | None:
    """A speculative step (requests with a few new tokens each, after context already in the
    cache) as one decode row per token: row j of a request reads its context up to and
    including its own token. Exact, because decode_stack.c writes every row's key and value
    into the cache before any row attends (so a row sees the tokens before it in its request
    and none after). None for other steps: a prompt's start (no context before its tokens),
    long chunks, or a step that is decode rows already."""
    starts = metadata.query_start_loc_host
    if not 1 < metadata.max_query_len <= MAX_VERIFY_QUERY_LEN or starts[-1] != num_rows:
        return None
    seq_lens: list[int] = []
    requests: list[int] = []
    for request, seq_len in enumerate(metadata.seq_lens_host):
        num_new = starts[request + 1] - starts[request]
        if num_new >= seq_len:
            return None
        seq_lens += range(seq_len - num_new + 1, seq_len + 1)
        requests += [request] * num_new
    device = metadata.block_tables.device
    return AttentionMetadata(
        slot_mapping=metadata.slot_mapping,
        query_start_loc=torch.arange(num_rows + 1, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=metadata.block_tables[torch.tensor(requests, device=device)],
        max_query_len=1,
        max_seq_len=max(seq_lens),
        block_size=metadata.block_size,
        query_start_loc_host=list(range(num_rows + 1)),
        seq_lens_host=seq_lens,
    )


def _is_decode_step(metadata: AttentionMetadata, num_rows: int) -> bool:
    starts = metadata.query_start_loc_host
    return (
        metadata.max_query_len == 1
        and metadata.num_reqs == num_rows
        and len(starts) == num_rows + 1
        and starts[-1] == num_rows
    )


def _is_float32_cache(cache: torch.Tensor, sizes: StackSizes) -> bool:
    return (
        cache.dtype == torch.float32
        and cache.device.type == "cpu"
        and cache.dim() == 5
        and cache.is_contiguous()
        and tuple(cache.shape[3:]) == (sizes.num_kv_heads, sizes.head_dim)
    )


def cpu_decode_stack(
    model: nn.Module,
    embedded: torch.Tensor,
    rotary_tables: tuple[torch.Tensor, torch.Tensor],
    kv_caches: list[torch.Tensor],
    metadata: AttentionMetadata,
) -> torch.Tensor | None:
    """The final hidden states of a decode step through one C call, or None where it does not
    apply (the caller then runs the layers)."""
    if not _enabled or embedded.dim() != 2 or embedded.device.type != "cpu":
        return None
    num_rows = embedded.shape[0]
    max_rows = integer_activation_max_rows()
    bits = activation_bits()
    if bits not in (8, 16) or num_rows > min(MAX_ELEMENTWISE_ROWS, max_rows or num_rows):
        return None
    if embedded.dtype != torch.float32 or embedded.requires_grad:
        return None
    if not _is_decode_step(metadata, num_rows):
        metadata = as_decode_rows(metadata, num_rows)
        if metadata is None:
            return None
    weights = _weights(model)
    if weights is None or not all(_is_float32_cache(c, weights.sizes) for c in kv_caches):
        return None
    cos, signed_sin = rotary_tables
    if cos.dtype != torch.float32 or cos.numel() != num_rows * weights.sizes.head_dim:
        return None
    slot_mapping = metadata.slot_mapping
    if slot_mapping.dtype != torch.int64 or slot_mapping.device.type != "cpu":
        return None
    plan = decode_gather_plan(metadata, list(range(num_rows)), embedded.device)
    return weights.call(
        embedded.contiguous(),
        (cos.contiguous(), signed_sin.contiguous()),
        kv_caches,
        slot_mapping.contiguous(),
        plan.slots,
        plan.lengths,
        plan.context_len,
        bits,
    )
