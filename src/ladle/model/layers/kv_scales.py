"""Float8 KV cache scales carried by a checkpoint, loaded into the attention layers' k_scale and
v_scale (model/layers/attention.py).

vLLM's fp8 checkpoints store them per layer as `model.layers.N.self_attn.k_scale` / `v_scale`
(llm-compressor, ModelOpt); older AutoFP8 ones as `...self_attn.k_proj.output_scale` /
`v_proj.output_scale`. Each is one float32 number: the dequantization scale (cached value =
code * scale). A layer given both keeps them; otherwise the start-up calibration sets them
(worker/kv_calibration.py).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ladle.attention.kv_quant import check_kv_scale
from ladle.model.load_errors import ModelLoadError

KV_SCALE_NAME = re.compile(
    r"^(?P<attention>.+\.self_attn)\.(?:(?P<kind>[kv])_scale|(?P<proj>[kv])_proj\.output_scale)$"
)


def load_kv_scale(model: nn.Module, checkpoint_name: str, tensor: torch.Tensor) -> bool:
    """Load `checkpoint_name` when it is a k/v cache scale (True), else leave it (False).

    ModelLoadError names the tensor when its layer does not exist or the value is not one
    finite positive number."""
    match = KV_SCALE_NAME.match(checkpoint_name)
    if match is None:
        return False
    try:
        attention = model.get_submodule(match["attention"] + ".attn")
    except AttributeError:
        raise ModelLoadError(f"unexpected weight {checkpoint_name!r} in checkpoint") from None
    try:
        value = check_kv_scale(checkpoint_name, tensor)
    except ValueError as error:
        raise ModelLoadError(str(error)) from None
    kind = match["kind"] or match["proj"]
    getattr(attention, f"{kind}_scale").fill_(value)
    loaded = getattr(attention, "checkpoint_kv_scales", set()) | {kind}
    attention.checkpoint_kv_scales = loaded
    if loaded == {"k", "v"}:
        attention.kv_scales_source = "checkpoint"
    return True
