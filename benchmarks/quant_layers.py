"""Quantized linear layers on the GPU at the Llama-3.1-8B shapes: milliseconds per call (CUDA
graph replay, median) and relative error against the bf16 product, per method and batch size;
then the relative error of whole-model logits against bf16 per method, on random weights of
real shapes (dummy presets).

    python benchmarks/quant_layers.py --json out.json [--models qwen3-0.6b llama-3.1-8b]
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
from attention_bench import time_in_graph

LAYERS_8B = {
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 28672),
    "down": (14336, 4096),
}
METHODS = ("bf16", "fp8", "int8", "int4")


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm()).item()


@torch.no_grad()
def bench_layers(tokens_list: list[int]) -> list[dict]:
    from ladle.model.layers.linear import Linear
    from ladle.model.layers.quant import quantize_linears_

    rows = []
    for name, (inputs, outputs) in LAYERS_8B.items():
        generator = torch.Generator(device="cuda").manual_seed(0)
        weight = torch.randn(outputs, inputs, device="cuda", generator=generator) * 0.02
        weight = weight.to(torch.bfloat16)
        for method in METHODS:
            layer = Linear(inputs, outputs).to("cuda", torch.bfloat16)
            layer.weight.data.copy_(weight)
            if method != "bf16":
                quantize_linears_(torch.nn.Sequential(layer), method)
            for tokens in tokens_list:
                x = torch.randn(tokens, inputs, device="cuda", generator=generator)
                x = x.to(torch.bfloat16)
                expected = x.double() @ weight.double().t()
                ms = time_in_graph(lambda layer=layer, x=x: layer(x))
                row = {
                    "layer": name,
                    "method": method,
                    "tokens": tokens,
                    "ms": ms,
                    "rel_error": _relative_error(layer(x), expected),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            del layer
            torch.cuda.empty_cache()
    return rows


def _prefill_batch(prompts: list[list[int]], block_size: int, device: str = "cuda"):
    """One prefill step of whole prompts, each in its own run of blocks (block 0 left unused)."""
    from ladle.attention.metadata import AttentionMetadata

    tables, slots, starts, next_block = [], [], [0], 1
    for prompt in prompts:
        num_blocks = -(-len(prompt) // block_size)
        tables.append(list(range(next_block, next_block + num_blocks)))
        slots.extend(next_block * block_size + position for position in range(len(prompt)))
        next_block += num_blocks
        starts.append(starts[-1] + len(prompt))
    width = max(len(table) for table in tables)
    lengths = [len(prompt) for prompt in prompts]
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        block_tables=torch.tensor(
            [table + [0] * (width - len(table)) for table in tables],
            dtype=torch.int32,
            device=device,
        ),
        max_query_len=max(lengths),
        max_seq_len=max(lengths),
        block_size=block_size,
        query_start_loc_host=starts,
        seq_lens_host=lengths,
    )
    input_ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=device)
    positions = torch.tensor(
        [i for p in prompts for i in range(len(p))], dtype=torch.int64, device=device
    )
    return input_ids, positions, metadata


@torch.no_grad()
def logits_errors(preset: str) -> dict[str, float]:
    """Relative error of last-position logits against bf16, per method, on a dummy preset."""
    from ladle.attention.triton_backend import TritonAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.layers.quant import quantize_linears_
    from ladle.model.loader import load_model

    config = ModelConfig(model=preset, load_format="dummy")
    loaded = load_model(config, torch.device("cuda"), torch.bfloat16, TritonAttentionBackend())
    arch = loaded.arch_config
    generator = torch.Generator().manual_seed(0)
    lengths = [37, 200, 5]
    prompts = [
        torch.randint(0, arch.vocab_size, (n,), generator=generator).tolist() for n in lengths
    ]

    def run(model) -> torch.Tensor:
        input_ids, positions, metadata = _prefill_batch(prompts, block_size=16)
        num_blocks = int(metadata.block_tables.max()) + 1
        shape = (2, num_blocks, 16, arch.num_key_value_heads, arch.head_dim)
        caches = [
            torch.zeros(shape, dtype=torch.bfloat16, device="cuda")
            for _ in range(arch.num_hidden_layers)
        ]
        hidden = model(input_ids, positions, caches, metadata)
        ends = torch.tensor(lengths, device="cuda").cumsum(0) - 1
        return model.compute_logits(hidden[ends]).float()

    reference = run(loaded.model)
    errors = {}
    for method in METHODS[1:]:
        model = copy.deepcopy(loaded.model)
        quantize_linears_(model, method)
        logits = run(model)
        errors[method] = _relative_error(logits, reference)
        top1 = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
        errors[method + "_top1_agreement"] = top1
        print(
            json.dumps(
                {"model": preset, "method": method, "rel_error": errors[method], "top1": top1}
            ),
            flush=True,
        )
        del model
        torch.cuda.empty_cache()
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--models", nargs="*", default=["qwen3-0.6b", "llama-3.1-8b"])
    parser.add_argument("--skip-layers", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name()}
    if not args.skip_layers:
        result["layers"] = bench_layers(args.tokens)
    result["logits"] = {preset: logits_errors(preset) for preset in args.models}
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
