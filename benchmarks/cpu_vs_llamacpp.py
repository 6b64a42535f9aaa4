"""The default model on the CPU: ladle (each --quantization) against llama.cpp on the same GGUF,
interleaved in one run, medians of --repeats.

    PYTHONPATH=... python benchmarks/cpu_vs_llamacpp.py --threads 2 --repeats 3

Measures generated tokens/s of one greedy sequence (prompt of 64 tokens, --output-len tokens,
EOS ignored) and the time to the first token of a 200-token chat prompt (prefix cache cleared
between runs, so every run prefills the whole prompt), and the generated tokens/s of --batch
sequences decoded together (distinct 64-token prompts; llama.cpp through its low-level batch
API, llamacpp_batched.py). llama.cpp comes from `llama-cpp-python` (not a ladle dependency; it
builds from source with pip).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ladle import LLM, SamplingParams
from ladle.kernels.cpu_native.build import set_native_kernels
from ladle.kernels.cpu_native.gemv import activation_bits, set_activation_bits
from ladle.model.default_model import resolve_default_model

CHAT_PROMPT_WORDS = 150  # about 200 tokens once templated


def chat_prompt_ids(llm: LLM) -> list[int]:
    text = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 14)
    messages = [{"role": "user", "content": f"Summarise this text: {text}"}]
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    # LLM.get_tokenizer may hand back the Hugging Face tokenizer, which returns an encoding.
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return [int(token) for token in ids]


def time_ladle(llm: LLM, prompt: list[int], max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    llm.engine.kv_cache_manager.reset_prefix_cache()
    return elapsed


def time_ladle_batch(llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    llm.engine.kv_cache_manager.reset_prefix_cache()
    return elapsed


def with_c_kernels(enabled: bool, bits: int, run, *args) -> float:
    """run(*args) with ladle's C kernels for the CPU on or off (off: the torch path), and the
    4-bit layers' activations at `bits` (kernels/cpu_native/gemv.py)."""
    previous = set_native_kernels(enabled)
    previous_bits = set_activation_bits(bits)
    try:
        return run(*args)
    finally:
        set_native_kernels(previous)
        set_activation_bits(previous_bits)


def _has_4bit_groups(llm: LLM) -> bool:
    from ladle.model.layers.group_quant import GroupQuantizedRows

    model = llm.engine.executor.worker.model
    return any(
        isinstance(w, GroupQuantizedRows) and w.bits == 4
        for w in (getattr(m, "quantized_weight", None) for m in model.modules())
    )


def time_llamacpp(model, prompt: list[int], max_tokens: int) -> float:
    model.reset()
    started = time.perf_counter()
    produced = 0
    for _ in model.generate(prompt, temp=0.0, reset=True):
        produced += 1
        if produced == max_tokens:
            break
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--quantization", nargs="+", default=["auto", "int8", "gguf", "none"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--torch-ops-too",
        action="store_true",
        help="also run each ladle engine with its C kernels off (kernels/cpu_native): the torch "
        "path, interleaved in the same run",
    )
    parser.add_argument(
        "--activation-bits",
        type=int,
        nargs="+",
        default=None,
        help="run each ladle engine holding 4-bit layers once per value (8, 16, 32: the bits "
        "their activations are quantized to; LADLE_CPU_ACTIVATION_BITS), interleaved in the "
        "same run; default: LADLE_CPU_ACTIVATION_BITS's only",
    )
    args = parser.parse_args()
    from llama_cpp import Llama, llama_free
    from llamacpp_batched import batched_context, time_llamacpp_batched

    torch.set_num_threads(args.threads)
    path = str(resolve_default_model())
    engines = {f"ladle {q}": LLM(model=path, quantization=q) for q in args.quantization}
    peer = Llama(path, n_ctx=2048, n_threads=args.threads, n_batch=512, verbose=False)
    chat = chat_prompt_ids(next(iter(engines.values())))
    short = list(range(1000, 1064))
    decode: dict[str, list[float]] = {}
    first_token: dict[str, list[float]] = {}
    bits = args.activation_bits or [activation_bits()]
    variants = {}
    for name, engine in engines.items():
        if _has_4bit_groups(engine):  # `gguf`, and `auto` on a GGUF
            variants.update({f"{name} ({b}-bit act)": (engine, True, b) for b in bits})
        else:
            variants[name] = (engine, True, bits[0])
    if args.torch_ops_too:
        variants.update({f"{name} (torch ops)": (e, False, 32) for name, e in engines.items()})
    runners = {
        name: (lambda p, n, e=e, c=c, a=a: with_c_kernels(c, a, time_ladle, e, p, n))
        for name, (e, c, a) in variants.items()
    }
    runners["llama.cpp"] = lambda p, n: time_llamacpp(peer, p, n)
    batch_prompts = [list(range(1000 + 64 * i, 1064 + 64 * i)) for i in range(args.batch)]
    context_len = args.batch * (64 + args.output_len + 8)
    peer_context = batched_context(peer, args.batch, context_len, args.threads)
    batch_runners = {
        name: (lambda n, e=e, c=c, a=a: with_c_kernels(c, a, time_ladle_batch, e, batch_prompts, n))
        for name, (e, c, a) in variants.items()
    }
    batch_runners["llama.cpp"] = lambda n: time_llamacpp_batched(
        peer, peer_context, batch_prompts, n
    )
    batched: dict[str, list[float]] = {}
    with open("/proc/loadavg") as file:
        print(f"load average at the start: {file.read().split()[:3]}", flush=True)
    for run in runners.values():  # warm-up
        run(short, 4)
    for _ in range(args.repeats):
        for name, run in runners.items():
            # Decode rate: a full run minus its one-token run, so prefill is not counted.
            full, one = run(short, args.output_len + 1), run(short, 1)
            decode.setdefault(name, []).append(args.output_len / (full - one))
            first_token.setdefault(name, []).append(run(chat, 1))
        for name, run_batch in batch_runners.items():
            full, one = run_batch(args.output_len + 1), run_batch(1)
            batched.setdefault(name, []).append(args.batch * args.output_len / (full - one))
    print(f"threads={args.threads} chat prompt={len(chat)} tokens repeats={args.repeats}")
    with open("/proc/loadavg") as file:
        print(f"load average at the end: {file.read().split()[:3]}")
    for name in runners:
        rate, ttft = statistics.median(decode[name]), statistics.median(first_token[name])
        print(
            f"{name:>28}: batch-1 decode {rate:6.1f} tok/s {[round(x, 1) for x in decode[name]]},"
            f" TTFT {ttft * 1e3:6.0f} ms {[round(x * 1e3) for x in first_token[name]]},"
            f" batch-{args.batch} decode {statistics.median(batched[name]):6.1f} tok/s "
            f"{[round(x, 1) for x in batched[name]]}"
        )
    llama_free(peer_context)


if __name__ == "__main__":
    main()
