"""Where fp8 costs perplexity on the default model: fp8 (e4m3, fp8.py's per-row weight scales and
per-token activation scales) applied to a subset of the decoder's projections, weights and/or
activations, the rest left in float32.

    PYTHONPATH=src python benchmarks/fp8_ablation.py --num-tokens 8192 --runs "all" "last layer"

Each run quantizes and dequantizes with fp8.py's own quantizer (the numbers --quantization fp8
computes), on the perplexity bench's windows (benchmarks/perplexity.py).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from perplexity import load_for_perplexity, perplexity

from ladle.model.default_model import resolve_default_model
from ladle.model.layers.linear import Linear
from ladle.model.layers.quant import LAYER_INDEX
from ladle.model.layers.quant.fp8 import quantize_fp8_per_row
from ladle.model.loader.calibration_text import (
    EVALUATION_CONVERSATIONS,
    sharegpt_texts,
    token_windows,
)

Selector = Callable[[str, int], bool]  # (module name, layer index) -> quantize it?


def _every(_: str, __: int) -> bool:
    return True


# name -> (which projections, weights in fp8, activations in fp8)
RUNS: dict[str, tuple[Selector, bool, bool]] = {
    "all": (_every, True, True),
    "weights only": (_every, True, False),
    "activations only": (_every, False, True),
    "qkv only": (lambda name, _: "qkv_proj" in name, True, True),
    "o only": (lambda name, _: "o_proj" in name, True, True),
    "gate_up only": (lambda name, _: "gate_up_proj" in name, True, True),
    "down only": (lambda name, _: "down_proj" in name, True, True),
    "layers 0-9": (lambda _, layer: layer < 10, True, True),
    "layers 10-19": (lambda _, layer: 10 <= layer < 20, True, True),
    "layers 20-29": (lambda _, layer: layer >= 20, True, True),
    "first layer only": (lambda _, layer: layer == 0, True, True),
    "last layer only": (lambda _, layer: layer == 29, True, True),
    "last layer down only": (lambda name, layer: layer == 29 and "down_proj" in name, True, True),
    "all but the last layer": (lambda _, layer: layer != 29, True, True),
    "all but the last two layers": (lambda _, layer: layer < 28, True, True),
}


def fake_fp8(x: torch.Tensor) -> torch.Tensor:
    """x with every row quantized to e4m3 at its own scale and dequantized."""
    codes, scale = quantize_fp8_per_row(x.reshape(-1, x.shape[-1]))
    return (codes.float() * scale[:, None]).reshape(x.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tokens", type=int, default=8192)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args()
    from ladle.model.tokenizer import load_tokenizer

    model_path = str(resolve_default_model())
    texts = sharegpt_texts(0, EVALUATION_CONVERSATIONS)
    windows = token_windows(load_tokenizer(model_path), texts, args.num_tokens, 1024)
    model = load_for_perplexity(model_path, "none")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    originals = {name: linear.weight.data.clone() for name, linear in linears.items()}
    base = perplexity(model, windows)
    print(f"{'float32':>28}: {base:.4f}", flush=True)
    for run in args.runs:
        select, weights, activations = RUNS[run]
        hooks = []
        for name, linear in linears.items():
            chosen = select(name, int(LAYER_INDEX.search(name)[1]))
            linear.weight.data.copy_(
                fake_fp8(originals[name]) if chosen and weights else originals[name]
            )
            if chosen and activations:
                hooks.append(
                    linear.register_forward_pre_hook(lambda _, inputs: (fake_fp8(inputs[0]),))
                )
        started = time.perf_counter()
        result = perplexity(model, windows)
        for hook in hooks:
            hook.remove()
        print(
            f"{run:>28}: {result:.4f} {(result / base - 1) * 100:+.2f}% "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
