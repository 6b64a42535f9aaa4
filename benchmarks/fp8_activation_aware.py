"""fp8 weights calibrated against the activations' own fp8 error (issue 12 quality, ablation).

`--quantization fp8` computes y = Q(x) Q(W)^T: the per-token e4m3 rounding of x is noise that
GPTQ on the float inputs (gptq_fp8 with H = E[x x^T]) never sees. Here each projection first
gets the least-squares weight for the QUANTIZED inputs,

    W' = W E[x Q(x)^T] (E[Q(x) Q(x)^T] + damping)^-1      (argmin E |x W^T - Q(x) W'^T|^2)

W' is then rounded to e4m3 by the engine's rule (row max -> 448; `lsq`) or by GPTQ with
H = E[Q(x) Q(x)^T] (`lsq-gptq`), so the stored format is the plain hf-fp8 one. Statistics come
from the float model on calibration text (calibration_text.py), the last decoder layer stays
float, and the perplexity bench's windows are scored with the engine's per-token activation
quantization on every fp8 projection.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/fp8_activation_aware.py --runs lsq
"""

from __future__ import annotations

import argparse
import time

import torch
from fp8_ablation import fake_fp8
from perplexity import (
    load_for_perplexity,
    perplexity,
    window_negative_log_likelihood,
)

from ladle.model.default_model import resolve_default_model
from ladle.model.layers.linear import Linear
from ladle.model.layers.quant import LAYER_INDEX
from ladle.model.layers.quant.gptq import gptq_fp8

# Relative to each input's second moment; must stay below e4m3's relative rounding power
# (~3e-5 for per-token scales here), else the damping, not the rounding, sets W'.
DAMPING = 1e-6


class CrossMoments:
    """Per Linear: sum Q(x)^T Q(x) and sum x^T Q(x) over the float model's input rows."""

    def __init__(self, linears: dict[str, Linear]) -> None:
        self.quantized = {n: torch.zeros(m.input_size, m.input_size) for n, m in linears.items()}
        self.cross = {n: torch.zeros(m.input_size, m.input_size) for n, m in linears.items()}

    def hook(self, name: str):
        def record(_, inputs):
            rows = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
            rounded = fake_fp8(rows)
            self.quantized[name].addmm_(rounded.t(), rounded)
            self.cross[name].addmm_(rows.t(), rounded)

        return record


def least_squares_weight(weight, quantized_moment, cross_moment) -> torch.Tensor:
    """W E[x Q(x)^T] (E[Q(x) Q(x)^T] + damping * diag)^-1, in float64. The damping is relative
    to each input's own second moment, so that an outlier channel (this model has inputs 30x
    the others) does not swamp the small ones, as a multiple of the mean diagonal would."""
    hessian = quantized_moment.double()
    hessian = hessian + torch.diag(DAMPING * hessian.diagonal().clamp(min=1e-12))
    solved = torch.linalg.solve(hessian, (weight.double() @ cross_moment.double()).t()).t()
    return solved.float()


def rounded(weight: torch.Tensor, hessian: torch.Tensor | None) -> torch.Tensor:
    if hessian is None:
        return fake_fp8(weight)
    codes, scale = gptq_fp8(weight, hessian)
    return codes.float() * scale[:, None]


def main() -> None:
    from ladle.model.loader.calibration_text import (
        EVALUATION_CONVERSATIONS,
        calibration_texts,
        sharegpt_texts,
        token_windows,
    )
    from ladle.model.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tokens", type=int, default=8192)
    parser.add_argument("--calibration-samples", type=int, default=32)
    parser.add_argument("--runs", nargs="+", default=["rtn", "lsq", "lsq-gptq"])
    parser.add_argument("--float32-perplexity", type=float, default=None, help="skip its run")
    args = parser.parse_args()
    model_path = str(resolve_default_model())
    tokenizer = load_tokenizer(model_path)
    texts = sharegpt_texts(0, EVALUATION_CONVERSATIONS)
    windows = token_windows(tokenizer, texts, args.num_tokens, 1024)
    calibration = token_windows(
        tokenizer, calibration_texts(0), args.calibration_samples * 512, 512
    )
    model = load_for_perplexity(model_path, "none")
    last = model.config.num_hidden_layers - 1
    linears = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, Linear) and int(LAYER_INDEX.search(name)[1]) != last
    }
    originals = {name: m.weight.data.clone() for name, m in linears.items()}
    base = args.float32_perplexity or perplexity(model, windows)
    print(f"{'float32':>10}: {base:.4f}", flush=True)
    started = time.perf_counter()
    moments = CrossMoments(linears)
    hooks = [m.register_forward_pre_hook(moments.hook(name)) for name, m in linears.items()]
    for window in calibration:
        window_negative_log_likelihood(model, window)
    for hook in hooks:
        hook.remove()
    print(f"statistics of {len(calibration)} x 512 tokens: {time.perf_counter() - started:.0f} s")
    hooks = [
        m.register_forward_pre_hook(lambda _, inputs: (fake_fp8(inputs[0]),))
        for m in linears.values()
    ]
    for run in args.runs:
        started = time.perf_counter()
        for name, linear in linears.items():
            weight, hessian = originals[name], None
            if run.startswith("lsq"):
                weight = least_squares_weight(weight, moments.quantized[name], moments.cross[name])
            if run.endswith("gptq"):
                hessian = moments.quantized[name] / moments.quantized[name].diagonal().mean()
            linear.weight.data.copy_(rounded(weight, hessian))
        result = perplexity(model, windows)
        print(
            f"{run:>10}: {result:.4f} {(result / base - 1) * 100:+.2f}% "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
