"""Projections a quantized checkpoint keeps in float in EVERY decoder layer
(`ladle quantize --float-projections q_proj,k_proj,v_proj`), listed in the folder's
`modules_to_not_convert` so that ladle and vLLM both leave them unquantized.

Why (docs/quantization.md, "Quality"): on the default model, int4's perplexity gap is spread
over the layers (each closes 0-7% of it alone, one 21%), but q/k/v alone make 59% of it with
15.6% of the projection weights (`python benchmarks/quant_sensitivity.py`, on calibration
text). ladle merges q/k/v and gate/up into one module each, so those are kept float together
or not at all.
"""

from __future__ import annotations

from collections.abc import Collection

# ladle's module in a decoder layer -> the checkpoint projections it merges
LADLE_MODULES = {
    "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "self_attn.o_proj": ("o_proj",),
    "mlp.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.down_proj": ("down_proj",),
}
PROJECTIONS = tuple(name for names in LADLE_MODULES.values() for name in names)


def parse_float_projections(text: str) -> frozenset[str]:
    """The checkpoint projection names of a comma list, checked: each known, and a merged
    module's projections (q/k/v, gate/up) all or none."""
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(names - set(PROJECTIONS))
    if unknown:
        raise ValueError(
            f"--float-projections: unknown projection(s) {unknown}; expected some of "
            f"{', '.join(PROJECTIONS)}"
        )
    for merged in LADLE_MODULES.values():
        if names & set(merged) and not set(merged) <= names:
            raise ValueError(
                f"--float-projections: {'/'.join(merged)} are one module in ladle; list all of "
                f"them or none (missing {sorted(set(merged) - names)})"
            )
    return names


def float_ladle_modules(projections: Collection[str]) -> set[str]:
    """ladle's module names in a decoder layer ("self_attn.qkv_proj", ...) kept float."""
    return {module for module, merged in LADLE_MODULES.items() if set(merged) <= set(projections)}


def is_float_projection(weight_name: str, projections: Collection[str]) -> bool:
    """Whether checkpoint tensor `weight_name` (...layers.N.self_attn.q_proj.weight) is one of
    `projections`."""
    return weight_name.removesuffix(".weight").rsplit(".", 1)[-1] in projections
