"""`ladle`: one entry point. `ladle generate`, `ladle chat`, `ladle serve`."""

from __future__ import annotations

import argparse
import sys


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine options every subcommand that starts an engine shares."""
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--load-format", default="auto", choices=["auto", "safetensors", "gguf", "dummy"]
    )
    group.add_argument("--dtype", default="auto")
    group.add_argument("--quantization", default="auto", choices=["auto", "none", "int8"])
    group.add_argument("--device", default="auto")
    group.add_argument("--max-model-len", type=int, default=None)
    group.add_argument("--block-size", type=int, default=16)
    group.add_argument("--max-num-batched-tokens", type=int, default=8192)
    group.add_argument("--max-num-seqs", type=int, default=256)
    group.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    group.add_argument("--cpu-kv-cache-gib", type=float, default=1.0)
    group.add_argument("--num-kv-blocks", type=int, default=None)
    group.add_argument("--no-prefix-caching", action="store_true")
    group.add_argument("--seed", type=int, default=0)


def engine_options_from_args(args: argparse.Namespace) -> dict:
    return {
        "load_format": args.load_format,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "device": args.device,
        "max_model_len": args.max_model_len,
        "block_size": args.block_size,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "cpu_kv_cache_gib": args.cpu_kv_cache_gib,
        "num_kv_blocks": args.num_kv_blocks,
        "enable_prefix_caching": not args.no_prefix_caching,
        "seed": args.seed,
    }


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--sampling-seed", type=int, default=None)


def _run_generate(args: argparse.Namespace) -> int:
    from ladle.entrypoints.llm import LLM
    from ladle.sampling_params import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sampling_seed,
    )
    llm = LLM(args.model, **engine_options_from_args(args))
    if args.command == "chat" or args.chat:
        outputs = llm.chat(
            [[{"role": "user", "content": p}] for p in args.prompt], params, use_tqdm=False
        )
    else:
        outputs = llm.generate(args.prompt, params, use_tqdm=False)
    for output in outputs:
        completion = output.outputs[0]
        print(completion.text)
        metrics = output.metrics
        print(
            f"[{completion.finish_reason}; {len(completion.token_ids)} tokens; "
            f"ttft {metrics.time_to_first_token:.3f}s; decode {metrics.decode_time:.3f}s]",
            file=sys.stderr,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ladle", description="ladle: an LLM inference engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("generate", "complete prompts offline and print the text"),
        ("chat", "answer prompts as user messages through the chat template"),
    ):
        sub = subparsers.add_parser(name, help=help_text)
        sub.add_argument(
            "model",
            nargs="?",
            default=None,
            help="HF folder, .gguf file or dummy preset; default: SmolLM2-135M",
        )
        sub.add_argument("--model", dest="model_option", default=None)
        sub.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
        sub.add_argument("--chat", action="store_true", help="apply the chat template")
        _add_sampling_arguments(sub)
        add_engine_arguments(sub)
        sub.set_defaults(handler=_run_generate)
    try:
        from ladle.entrypoints.openai.cli_serve import add_serve_parser
    except ImportError:  # the server extra is not installed
        pass
    else:
        add_serve_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "model_option", None):
        args.model = args.model_option
    try:
        return args.handler(args)
    except ValueError as error:
        print(f"ladle: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
