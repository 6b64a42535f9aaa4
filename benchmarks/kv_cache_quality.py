"""What the float8 KV cache costs in quality: logits with an fp8 cache against the same model's
cache in its own dtype (bf16 on CUDA, float32 on the CPU).

    python benchmarks/kv_cache_quality.py --model qwen3-0.6b --load-format dummy   # CUDA
    python benchmarks/kv_cache_quality.py --text README.md docs/design.md          # CPU

One engine with `kv_cache_dtype="fp8"` (its scales calibrated at start-up as serving gets them)
prefills each prompt twice with the same weights: into its float8 cache, then into a cache in
the model's dtype. Every position's logits are compared (each prompt position attends over the
cache as a decode step would): relative L2 error over all of them, and how often the argmax
agrees. Prompts: seeded random token ids of --lengths, or windows of --window tokens of the
--text files (real text, for a real checkpoint).

Per layer, without compounding: each attention layer's output over an fp8 cache against its
output over the model-dtype cache, for the same inputs (those of the model-dtype run, longest
prompt). On random weights the whole-model error compounds through the layers (a random deep
network amplifies any perturbation), so this is the figure to compare across shapes.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.worker.kv_cache_alloc import zeros_lazily


def prefill_logits(runner, kv_caches: list[torch.Tensor], token_ids: list[int]) -> torch.Tensor:
    """float32 logits at every position of one prompt prefilled into blocks 1.. of kv_caches."""
    device = runner.device
    length, block_size = len(token_ids), runner.block_size
    metadata = AttentionMetadata.one_fresh_prompt(length, block_size, device)
    with torch.inference_mode():
        ids = torch.tensor(token_ids, device=device)
        hidden = runner.model(ids, torch.arange(length, device=device), kv_caches, metadata)
        return runner.model.compute_logits(hidden).float()


def per_layer_attention_error(runner, kv_caches, token_ids: list[int]) -> list[float]:
    """Relative L2 error of each attention layer's output with an fp8 cache (its scales) against
    the model-dtype cache, both fed the inputs of one model-dtype prefill of token_ids."""
    from ladle.attention.kv_quant import FP8_KV_DTYPE

    layers = _attention_layers(runner)
    captured: list[tuple] = []

    def capture(module, args, output):
        query, key, value, _, metadata = args
        captured.append((module, query.clone(), key.clone(), value.clone(), metadata, output))

    handles = [layer.register_forward_hook(capture) for layer in layers]
    try:
        prefill_logits(runner, kv_caches, token_ids)
    finally:
        for handle in handles:
            handle.remove()
    errors = []
    with torch.inference_mode():
        for module, query, key, value, metadata, output in captured:
            cache = torch.zeros(kv_caches[0].shape, dtype=FP8_KV_DTYPE, device=runner.device)
            value = value.view(key.shape)
            fp8 = module.backend.forward(
                query, key, value, cache, metadata, module.scale, (module.k_scale, module.v_scale)
            )
            fp8 = fp8.reshape(output.shape).float()
            reference = output.float()
            errors.append(((fp8 - reference).norm() / reference.norm()).item())
    return errors


def text_prompts(tokenizer, files: list[str], window: int, count: int) -> list[list[int]]:
    stream: list[int] = []
    for file in files:
        stream.extend(tokenizer.encode(Path(file).read_text(), add_special_tokens=False))
    windows = [stream[start : start + window] for start in range(0, len(stream), window)]
    return [w for w in windows if len(w) == window][:count]


def measure(options: dict, prompts_of, label: str) -> dict:
    from ladle import LLM

    llm = LLM(kv_cache_dtype="fp8", **options)
    runner = llm.engine.executor.worker
    prompts = prompts_of(llm, runner)
    fp8_caches = runner.kv_caches
    reference_caches = [
        zeros_lazily(tuple(cache.shape), runner.dtype, runner.device) for cache in fp8_caches
    ]
    squared_error = squared_norm = 0.0
    agree = total = 0
    per_prompt = []
    for prompt in prompts:
        fp8 = prefill_logits(runner, fp8_caches, prompt)
        reference = prefill_logits(runner, reference_caches, prompt)
        difference = (fp8 - reference).norm().item() ** 2
        norm = reference.norm().item() ** 2
        matches = int((fp8.argmax(-1) == reference.argmax(-1)).sum())
        squared_error += difference
        squared_norm += norm
        agree += matches
        total += len(prompt)
        per_prompt.append(
            {"length": len(prompt), "relative_error": (difference / norm) ** 0.5, "top1": matches}
        )
    longest = max(prompts, key=len)
    layer_errors = per_layer_attention_error(runner, reference_caches, longest)
    result = {
        "model": label,
        "attention_layer_relative_error_median": sorted(layer_errors)[len(layer_errors) // 2],
        "attention_layer_relative_error_max": max(layer_errors),
        "attention_layer_relative_errors": layer_errors,
        "device": str(runner.device),
        "model_dtype": str(runner.dtype),
        "num_prompts": len(prompts),
        "num_positions": total,
        "logits_relative_error": (squared_error / squared_norm) ** 0.5,
        "top1_agreement": agree / total,
        "k_scale_range": _range([layer.k_scale for layer in _attention_layers(runner)]),
        "v_scale_range": _range([layer.v_scale for layer in _attention_layers(runner)]),
        "per_prompt": per_prompt,
    }
    print(
        f"{label} on {runner.device}: fp8 KV vs {str(runner.dtype)[6:]} KV logits relative "
        f"error {result['logits_relative_error']:.4f}, top-1 agreement "
        f"{result['top1_agreement'] * 100:.2f}% over {total} positions of {len(prompts)} prompts; "
        f"per attention layer (same inputs, {len(longest)} tokens): median "
        f"{result['attention_layer_relative_error_median']:.4f}, max "
        f"{result['attention_layer_relative_error_max']:.4f}",
        flush=True,
    )
    del llm, runner, fp8_caches, reference_caches
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def _attention_layers(runner):
    from ladle.worker.kv_calibration import attention_layers

    return attention_layers(runner.model)


def _range(tensors: list[torch.Tensor]) -> list[float]:
    values = [float(tensor) for tensor in tensors]
    return [min(values), max(values)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=[None], help="default: the default model")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quantization", default="auto", help="weight quantization, as served")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 100, 512, 1024])
    parser.add_argument("--text", nargs="*", default=None, help="score windows of these files")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--num-windows", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    longest = args.window if args.text else max(args.lengths)
    results = []
    for model in args.model:

        def prompts_of(llm, runner):
            if args.text:
                return text_prompts(llm.get_tokenizer(), args.text, args.window, args.num_windows)
            rng = random.Random(args.seed)
            vocab = min(runner.arch.vocab_size, 10000)
            return [[rng.randrange(vocab) for _ in range(n)] for n in args.lengths]

        options = dict(
            model=model,
            load_format=args.load_format,
            device=args.device,
            quantization=args.quantization,
            num_kv_blocks=longest // 16 + 4,
            max_model_len=longest + 1,
        )
        results.append(measure(options, prompts_of, model or "default model"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
