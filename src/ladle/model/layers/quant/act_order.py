"""Act-order int4 checkpoints (GPTQ `desc_act: true`, compressed-tensors `actorder: "group"`):
GPTQ quantized the input columns in order of decreasing activation energy and formed its groups
of 128 in that order, so a checkpoint's `g_idx[k]` (the group of input k) is a scatter rather than
k // 128. ladle's int4 kernels need each group's inputs side by side, so at load the columns are
put in group order (a stable sort of g_idx) and the layer gathers its input into that order
before the matmul (`Linear.input_permutation`, one index_select per call, as vLLM's exllama
kernels do):
    perm = argsort(g_idx, stable)      W'[:, i] = W[:, perm[i]]      y = x[:, perm] @ W'^T
Merged q/k/v and gate/up share their input, so their permutations must be the same (GPTQ's
Hessian is the input's, so they are). The checkpoint side (g_idx to a permutation, the words
reordered) is loader/checkpoint_tensors.py's group_order and permute_packed_inputs.
"""

from __future__ import annotations

import torch
from torch import nn

PERMUTATION = "input_permutation"


def add_input_permutations_(model: nn.Module) -> None:
    """Give every quantized Linear an input_permutation parameter (the identity) for an
    act-order checkpoint to fill: every one of its projections brings one."""
    for module in model.modules():
        if getattr(module, "quant_method", None) is not None:
            identity = torch.arange(module.input_size, device=_device(module))
            module.input_permutation = nn.Parameter(identity, requires_grad=False)
            module.input_permutation_shards = set()


def load_input_permutation(
    layer: nn.Module, loaded: torch.Tensor, shard_id: str | int | None
) -> None:
    """Copy one projection's permutation into the layer's; the shards of a merged layer must
    bring the same one (they share the input the layer gathers)."""
    from ladle.model.loader.errors import ModelLoadError

    loaded = loaded.to(layer.input_permutation.device, torch.int64)
    if layer.input_permutation_shards and not torch.equal(layer.input_permutation.data, loaded):
        raise ModelLoadError(
            "its act-order input permutation differs from the other projections of the same "
            "input, which ladle runs in one matmul"
        )
    layer.input_permutation.data.copy_(loaded)
    layer.input_permutation_shards.add(shard_id)


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
