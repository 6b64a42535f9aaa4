"""Which decoder layers and projections cost the most perplexity under int4 or fp8, measured on
CALIBRATION text (never on the perplexity bench's evaluation sample), so that a choice of
modules to keep float can be made without looking at the evaluation.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/quant_sensitivity.py \\
        --method int4-awq --num-tokens 4096

The whole model is quantized once (int4-awq: the calibration pass of `ladle quantize --algorithm
awq` or `awq-gptq`; fp8: fp8.py's per-row weights and per-token activations, the last layer float as
`--quantization fp8`), then each decoder layer (and each kind of projection across all layers)
is put back to float alone, and the perplexity on calibration windows that calibration did not
read is printed with what keeping it float gains. Under AWQ "float" means the folded float
weights (W * s beside the norm / s), which compute what the original weights do.
"""

from __future__ import annotations

import argparse
import time

import torch
from fp8_ablation import fake_fp8
from perplexity import load_for_perplexity, perplexity

from ladle.model.default_model import resolve_default_model
from ladle.model.layers.linear import Linear
from ladle.model.layers.quant import LAYER_INDEX
from ladle.model.layers.quant.fp8 import quantize_fp8_per_row
from ladle.model.layers.quant.int4 import Int4Method
from ladle.model.loader.calibration import (
    calibrate_linears,
    clip_search_quantizer,
    gptq_quantizer,
)
from ladle.model.loader.calibration_text import calibration_texts, token_windows

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _fp8_image(weight: torch.Tensor) -> torch.Tensor:
    codes, scale = quantize_fp8_per_row(weight)
    return codes.float() * scale[:, None]


class QuantizedImages:
    """Per Linear: its float weight and its quantized image; `use(names)` puts the float weight
    into the Linears `names` and the quantized image (plus, for fp8, the per-token activation
    quantizer) everywhere else."""

    def __init__(self, linears: dict[str, Linear], floats, images, fp8_inputs: bool) -> None:
        self.linears, self.floats, self.images = linears, floats, images
        self.fp8_inputs = fp8_inputs
        self.hooks = []

    def use(self, float_names: set[str]) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        for name, linear in self.linears.items():
            keep_float = name in float_names or name not in self.images
            linear.weight.data.copy_(self.floats[name] if keep_float else self.images[name])
            if self.fp8_inputs and not keep_float:
                self.hooks.append(
                    linear.register_forward_pre_hook(lambda _, inputs: (fake_fp8(inputs[0]),))
                )


def build_images(model, method: str, calibration: list[list[int]]) -> QuantizedImages:
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    last = model.config.num_hidden_layers - 1
    if method == "fp8":
        floats = {name: m.weight.data.clone() for name, m in linears.items()}
        images = {
            name: _fp8_image(weight)
            for name, weight in floats.items()
            if int(LAYER_INDEX.search(name)[1]) != last
        }
        return QuantizedImages(linears, floats, images, True)
    # int4-awq(-gptq): the folded float weight is what each quantizer call receives, layer by
    # layer in calibrate_linears' order (the model's Linear order).
    received: list[torch.Tensor] = []
    if method == "int4-awq":
        quantizer = clip_search_quantizer(Int4Method())
    else:
        quantizer = gptq_quantizer(Int4Method(), "weighted")

    def recording(weight: torch.Tensor, hessian: torch.Tensor):
        received.append(weight.clone())
        return quantizer(weight, hessian)

    calibrate_linears(model, calibration, recording, fold_scales=True)
    floats = dict(zip(linears, received, strict=True))
    images = {name: m.weight.data.clone() for name, m in linears.items()}
    return QuantizedImages(linears, floats, images, False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--method", choices=["int4-awq", "int4-awq-gptq", "fp8"], default="int4-awq-gptq"
    )
    parser.add_argument(
        "--num-tokens", type=int, default=4096, help="calibration-text tokens scored"
    )
    parser.add_argument("--calibration-samples", type=int, default=32)
    args = parser.parse_args()
    from ladle.model.tokenizer import load_tokenizer

    model_path = str(resolve_default_model())
    tokenizer = load_tokenizer(model_path)
    num_calibration = args.calibration_samples * 512
    stream = token_windows(tokenizer, calibration_texts(0), num_calibration + args.num_tokens, 512)
    calibration = stream[: args.calibration_samples]
    held_out = [token for window in stream[args.calibration_samples :] for token in window]
    scored = [held_out[start : start + 1024] for start in range(0, len(held_out), 1024)]
    model = load_for_perplexity(model_path, "none")
    base = perplexity(model, scored)
    images = build_images(model, args.method, calibration)
    linears = images.linears
    images.use(set())
    quantized = perplexity(model, scored)
    gap = quantized - base
    print(
        f"float32 {base:.4f}; {args.method} {quantized:.4f} ({(quantized / base - 1) * 100:+.2f}%)"
    )
    total = sum(images.floats[name].numel() for name in images.images)
    subsets: dict[str, set[str]] = {}
    for layer in range(model.config.num_hidden_layers):
        subsets[f"layer {layer}"] = {n for n in linears if int(LAYER_INDEX.search(n)[1]) == layer}
    for projection in PROJECTIONS:
        subsets[f"every {projection}"] = {n for n in linears if n.endswith(projection)}
    for label, names in subsets.items():
        names &= set(images.images)
        if not names:
            continue
        started = time.perf_counter()
        images.use(names)
        result = perplexity(model, scored)
        share = sum(images.floats[n].numel() for n in names) / total
        print(
            f"{label:>20} float: {result:.4f} ({(result / base - 1) * 100:+.2f}%), closes "
            f"{(quantized - result) / gap * 100:5.1f}% of the gap with {share * 100:.1f}% of the "
            f"quantized weights ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
