"""Perplexity of the default model with fp8 / int4 weight scales chosen by searches.

What a per-channel (fp8) or per-group (int4) scale chosen by least squared error does against
the engine's rules (fp8: each row's max -> 448; int4: round-to-nearest over the group's range).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/quant_search_ablation.py \\
        --num-tokens 8192 --runs fp8 fp8-mse32 int4 int4-wmse

Each run replaces the decoder projections' float32 weights by their quantized-dequantized
image (fp8 runs also quantize each Linear's input per token, and keep the last decoder layer
float as `--quantization fp8` does), then scores the perplexity bench's windows. Runs named
`w...` and `awq...` weight the error by the inputs' second moments, measured on the float model
over 16 x 512 calibration tokens (calibration_text.py: conversations the bench never scores).

    fp8-mseN      each row's scale searched over N steps of one octave above max/448 (every
                  relative placement on e4m3's grid), least plain squared error
    fp8-wmse32    the same, weighted by the inputs' second moments
    fp8-exact8    only scales that keep each row's max exact (max -> 448, 416, ..., 256, 240)
    int4-mse      int4_clip.py's search with every input weighted alike
    int4-wmse     int4_clip.py's search weighted by the inputs' second moments (= the landed
                  `ladle quantize --clip-search`, but from the float model's inputs)
    int4-awq      activation-aware scaling: each Linear's inputs scaled by s = mean|x|^alpha
                  (alpha in 0, 0.1, ..., 1 chosen per Linear by the output error on 1024
                  calibration tokens), W * s quantized by round-to-nearest, then / s (the
                  numbers of folding 1/s into the preceding norm or projection)
    int4-awq-mse / int4-awq-wmse   the same with the plain / weighted group search
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from fp8_ablation import fake_fp8
from perplexity import load_for_perplexity, perplexity, window_negative_log_likelihood

from ladle.model.default_model import resolve_default_model
from ladle.model.layers.linear import Linear
from ladle.model.layers.quant import LAYER_INDEX
from ladle.model.layers.quant.fp8 import FP8_DTYPE, FP8_MAX
from ladle.model.layers.quant.int4 import dequantize_int4_groups, quantize_int4_groups
from ladle.model.layers.quant.int4_clip import search_int4_groups
from ladle.model.loader.calibration_text import (
    EVALUATION_CONVERSATIONS,
    calibration_texts,
    sharegpt_texts,
    token_windows,
)

EXACT_MAX_TARGETS = (448, 416, 384, 352, 320, 288, 256, 240)
AWQ_ALPHAS = tuple(step / 10 for step in range(11))


class Calibration:
    """Per Linear: the inputs' second moments and up to 1024 of its input rows (float model)."""

    def __init__(self, model, linears: dict[str, Linear], tokenizer) -> None:
        windows = token_windows(tokenizer, calibration_texts(0, 300), 8192, 512)
        self.second_moment = {name: torch.zeros(m.input_size) for name, m in linears.items()}
        samples: dict[str, list[torch.Tensor]] = {name: [] for name in linears}

        def recorder(name: str):
            def hook(_, inputs):
                rows = inputs[0].reshape(-1, inputs[0].shape[-1])
                self.second_moment[name].add_((rows**2).sum(dim=0))
                if len(samples[name]) < 4:
                    samples[name].append(rows[::2].clone())

            return hook

        hooks = [m.register_forward_pre_hook(recorder(name)) for name, m in linears.items()]
        for window in windows:
            window_negative_log_likelihood(model, window)
        for hook in hooks:
            hook.remove()
        self.inputs = {name: torch.cat(rows) for name, rows in samples.items()}


def fp8_rows(weight: torch.Tensor, factors: list[float], importance=None) -> torch.Tensor:
    """The dequantized e4m3 image of each row at the scale row max * factor of least (weighted)
    squared error among `factors` (1/448 is the engine's rule)."""
    weight = weight.float()
    row_max = weight.abs().amax(dim=-1)
    best_error = best = None
    for factor in factors:
        scale = (row_max * factor).clamp(min=1e-12)[:, None]
        image = (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale
        error = (image - weight) ** 2
        error = (error if importance is None else error * importance).sum(-1, dtype=torch.float64)
        if best is None:
            best_error, best = error, image
            continue
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best = torch.where(better[:, None], image, best)
    return best


def octave_factors(steps: int) -> list[float]:
    return [(1.0 + step / steps) / FP8_MAX for step in range(steps)]


EXACT_MAX_FACTORS = [1.0 / target for target in EXACT_MAX_TARGETS]


def int4_image(weight: torch.Tensor, importance: torch.Tensor | None) -> torch.Tensor:
    if importance is None:
        return dequantize_int4_groups(*quantize_int4_groups(weight))
    return dequantize_int4_groups(*search_int4_groups(weight, importance))


def awq_image(weight, inputs, importance, quantize_group_search: str | None) -> torch.Tensor:
    """Activation-aware scaling, alpha chosen per Linear by the output error on `inputs`."""
    weight = weight.float()
    magnitude = inputs.abs().mean(dim=0).clamp(min=1e-6)
    reference = inputs @ weight.t()
    best = None
    for alpha in AWQ_ALPHAS:
        scale = magnitude**alpha
        scale = scale / (scale.max() * scale.min()).sqrt()
        if quantize_group_search is None:
            image = int4_image(weight * scale, None)
        elif quantize_group_search == "plain":
            image = int4_image(weight * scale, torch.ones_like(scale))
        else:
            image = int4_image(weight * scale, importance / scale**2)
        image = image / scale
        error = float(((inputs @ image.t() - reference) ** 2).sum())
        if best is None or error < best[0]:
            best = (error, image)
    return best[1]


Run = Callable[[str, torch.Tensor, Calibration | None], torch.Tensor]
RUNS: dict[str, tuple[Run, bool]] = {  # name -> (weight image, calibration needed)
    "fp8": (lambda n, w, c: fp8_rows(w, [1.0 / FP8_MAX]), False),
    "fp8-mse16": (lambda n, w, c: fp8_rows(w, octave_factors(16)), False),
    "fp8-mse32": (lambda n, w, c: fp8_rows(w, octave_factors(32)), False),
    "fp8-mse64": (lambda n, w, c: fp8_rows(w, octave_factors(64)), False),
    "fp8-wmse32": (lambda n, w, c: fp8_rows(w, octave_factors(32), c.second_moment[n]), True),
    "fp8-exact8": (lambda n, w, c: fp8_rows(w, EXACT_MAX_FACTORS), False),
    "fp8-wexact8": (lambda n, w, c: fp8_rows(w, EXACT_MAX_FACTORS, c.second_moment[n]), True),
    "int4": (lambda n, w, c: int4_image(w, None), False),
    "int4-mse": (lambda n, w, c: int4_image(w, torch.ones(w.shape[1])), False),
    "int4-wmse": (lambda n, w, c: int4_image(w, c.second_moment[n]), True),
    "int4-awq": (lambda n, w, c: awq_image(w, c.inputs[n], c.second_moment[n], None), True),
    "int4-awq-mse": (lambda n, w, c: awq_image(w, c.inputs[n], c.second_moment[n], "plain"), True),
    "int4-awq-wmse": (
        lambda n, w, c: awq_image(w, c.inputs[n], c.second_moment[n], "weighted"),
        True,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tokens", type=int, default=8192)
    parser.add_argument("--runs", nargs="+", default=["fp8", "int4"], choices=list(RUNS))
    args = parser.parse_args()
    from ladle.model.tokenizer import load_tokenizer

    model_path = str(resolve_default_model())
    tokenizer = load_tokenizer(model_path)
    texts = sharegpt_texts(0, EVALUATION_CONVERSATIONS)
    windows = token_windows(tokenizer, texts, args.num_tokens, 1024)
    model = load_for_perplexity(model_path, "none")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    originals = {name: linear.weight.data.clone() for name, linear in linears.items()}
    last_layer = model.config.num_hidden_layers - 1
    needs_calibration = any(RUNS[run][1] for run in args.runs)
    calibration = Calibration(model, linears, tokenizer) if needs_calibration else None
    base = perplexity(model, windows)
    print(f"{'float32':>16}: {base:.4f}", flush=True)
    for run in args.runs:
        image, _ = RUNS[run]
        is_fp8 = run.startswith("fp8")
        started = time.perf_counter()
        hooks = []
        for name, linear in linears.items():
            if is_fp8 and int(LAYER_INDEX.search(name)[1]) == last_layer:
                linear.weight.data.copy_(originals[name])
                continue
            linear.weight.data.copy_(image(name, originals[name], calibration))
            if is_fp8:
                hooks.append(
                    linear.register_forward_pre_hook(lambda _, inputs: (fake_fp8(inputs[0]),))
                )
        result = perplexity(model, windows)
        for hook in hooks:
            hook.remove()
        print(
            f"{run:>16}: {result:.4f} {(result / base - 1) * 100:+.2f}% "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
