"""Act-order int4 checkpoints (GPTQ `desc_act: true`, compressed-tensors `actorder: "group"`):
GPTQ quantized the input columns in order of decreasing activation energy and formed its groups
of 128 in that order, so a checkpoint's `g_idx[k]` (the group of input k) is a scatter rather than
k // 128. ladle's int4 kernels need each group's inputs side by side, so at load the columns are
put in group order (a stable sort of g_idx) and the layer gathers its input into that order
before the matmul (`Linear.input_permutation`, one index_select per call, as vLLM's exllama
kernels do):
    perm = argsort(g_idx, stable)      W'[:, i] = W[:, perm[i]]      y = x[:, perm] @ W'^T
Merged q/k/v and gate/up share their input, so their permutations must be the same (GPTQ's
Hessian is the input's, so they are). The MLP's down projection needs no gather: its input is
silu(gate) * up channel by channel, so gate's and up's output rows are put in down's order
instead, once at load (rows are independent in every int4 and float layout). The checkpoint
side (g_idx to a permutation, the words reordered) is loader/checkpoint_tensors.py's
group_order and permute_packed_inputs.
"""

from __future__ import annotations

import torch
from torch import nn

PERMUTATION = "input_permutation"


def add_input_permutations_(model: nn.Module) -> None:
    """Give every quantized Linear an input_permutation parameter (the identity) for an
    act-order checkpoint to fill: every one of its projections brings one, and
    `Linear.load_input_permutation` checks that the shards of a merged layer agree."""
    for module in model.modules():
        if getattr(module, "quant_method", None) is not None:
            identity = torch.arange(module.input_size, device=_device(module))
            module.input_permutation = nn.Parameter(identity, requires_grad=False)
            module.input_permutation_shards = set()


def drop_identity_permutations_(model: nn.Module) -> None:
    """Remove the permutations no checkpoint tensor changed from the identity, so those layers
    skip the gather."""
    for module in model.modules():
        permutation = getattr(module, PERMUTATION, None)
        if isinstance(permutation, nn.Parameter):
            identity = torch.arange(permutation.numel(), device=permutation.device)
            if torch.equal(permutation.data, identity):
                del module.input_permutation
                module.input_permutation = None


def _device(layer: nn.Module) -> torch.device:
    return next(iter(layer.parameters())).device


@torch.no_grad()
def fold_down_permutations_(model: nn.Module) -> None:
    """Move each MLP's down-projection gather into its gate/up rows: down then reads, in the
    order it wants, what silu(gate) * up computes, and no longer gathers (one launch fewer per
    layer and step). Call after loading, before finalize builds the runtime layouts."""
    for module in model.modules():
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        permutation = getattr(down, PERMUTATION, None)
        if permutation is None or gate_up is None or gate_up.bias is not None:
            continue
        for name, tensor in _row_tensors(gate_up):
            halves = tensor.data.view(2, down.input_size, *tensor.shape[1:])
            reordered = halves.index_select(1, permutation.data).reshape(tensor.shape)
            getattr(gate_up, name).data.copy_(reordered)
        del down.input_permutation
        down.input_permutation = None


def _row_tensors(layer: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A Linear's tensors with the output rows on dim 0: its quant method's canonical tensors,
    or its float weight."""
    method = getattr(layer, "quant_method", None)
    if method is None:
        return [("weight", layer.weight)]
    specs = method.canonical_specs(layer.output_size, layer.input_size)
    return [(name, getattr(layer, name)) for name in specs]
