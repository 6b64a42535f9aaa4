"""Offline throughput: ladle's LLM.generate against HF transformers' generate_batch, same prompts,
same run, generated tokens per second (median of several runs).

    # the default model on the CPU, against HF:
    python -m ladle.bench.offline_throughput --num-prompts 32 --output-len 128
    # random weights of a real shape on a GPU, ladle alone:
    python -m ladle.bench.offline_throughput --model qwen3-0.6b --load-format dummy \\
        --num-prompts 256 --input-len 100 1024 --output-len 100 1024 --peer none

Every request generates exactly its output length (EOS ignored), so both engines do the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from ladle import LLM, SamplingParams
from ladle.model.loader.presets import get_preset


def make_workload(
    num_prompts: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab_size: int,
    seed: int,
) -> tuple[list[list[int]], list[int]]:
    """Random token-id prompts (no special ids) and output lengths, uniform in the ranges."""
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(10, vocab_size) for _ in range(rng.randint(*input_len))]
        for _ in range(num_prompts)
    ]
    outputs = [rng.randint(*output_len) for _ in range(num_prompts)]
    return prompts, outputs


def run_ladle(llm: LLM, prompts: list[list[int]], output_lens: list[int]) -> tuple[float, int]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.engine.kv_cache_manager.reset_prefix_cache()  # the next run must not hit this one's cache
    return elapsed, generated


def run_hf(model, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    from transformers import GenerationConfig  # ~0.5 s: only the HF peer run needs it

    config = GenerationConfig(
        max_new_tokens=output_len, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    started = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    elapsed = time.perf_counter() - started
    generated = sum(len(r.generated_tokens) for r in results.values())
    return elapsed, generated


def load_hf_peer(model_path: str | None, preset: str | None, dtype: torch.dtype, device: str):
    """The same model in HF transformers: the same file, or for a dummy preset the same shape
    with HF's own random initialisation (throughput does not depend on the values)."""
    from transformers import AutoConfig, AutoModelForCausalLM  # ~0.5 s: only the HF peer run

    if model_path is None:
        values = dict(get_preset(preset))
        config = AutoConfig.for_model(values.pop("model_type"), **values)
        return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    if model_path.endswith(".gguf"):
        folder, name = os.path.split(model_path)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    return model.to(device).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, nargs=2, default=[32, 64])
    parser.add_argument("--output-len", type=int, nargs="+", default=[128])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peer", choices=["hf", "none"], default="hf")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    output_len = (
        tuple(args.output_len * 2)[:2] if len(args.output_len) == 1 else tuple(args.output_len)
    )

    llm = LLM(
        args.model,
        load_format=args.load_format,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    prompts, output_lens = make_workload(
        args.num_prompts, tuple(args.input_len), output_len, llm.engine.vocab_size, args.seed
    )
    run_ladle(llm, prompts[:4], [8] * 4)  # warm-up: first-call costs stay out of the timings
    ladle_runs = [run_ladle(llm, prompts, output_lens) for _ in range(args.runs)]
    results = {
        "device": str(llm.engine.executor.worker.device),
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        "model": llm.engine.executor.worker.model_path or args.model,
        "dtype": str(llm.engine.executor.worker.dtype),
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": list(output_len),
        "ladle_tokens_per_s": [g / t for t, g in ladle_runs],
    }
    print(f"ladle runs (generated tok/s): {results['ladle_tokens_per_s']}", flush=True)
    if args.peer == "hf":
        if len(set(output_lens)) != 1:
            raise SystemExit("the HF peer needs one fixed output length")
        hf_model = load_hf_peer(
            llm.engine.executor.worker.model_path,
            args.model,
            llm.engine.executor.worker.dtype,
            str(llm.engine.executor.worker.device),
        )
        run_hf(hf_model, prompts[:4], 8)
        hf_runs = [run_hf(hf_model, prompts, output_lens[0]) for _ in range(args.runs)]
        results["hf_tokens_per_s"] = [g / t for t, g in hf_runs]
        results["hf_generated_tokens"] = [g for _, g in hf_runs]
    results["ladle_generated_tokens"] = [g for _, g in ladle_runs]
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    line = f"ladle median {statistics.median(results['ladle_tokens_per_s']):.1f} generated tok/s"
    if "hf_tokens_per_s" in results:
        line += f"; HF generate_batch median {statistics.median(results['hf_tokens_per_s']):.1f}"
    print(line)


if __name__ == "__main__":
    main()
