"""`ladle`: one entry point. `ladle generate`, `ladle chat`, `ladle serve`, `ladle bench`,
`ladle quantize`, `ladle train-draft`."""

from __future__ import annotations

import argparse
import os
import sys

import ladle
from ladle.bench.engine_bench import add_bench_parsers
from ladle.bench.multiturn import add_bench_multiturn_parser
from ladle.bench.serve import add_parser as add_bench_serve_parser
from ladle.bench.startup import add_bench_startup_parser
from ladle.bench.workloads import describe_workloads
from ladle.cli.engine_args import add_engine_arguments, engine_options_from_args, expand_config_file
from ladle.cli.generate import run_generate
from ladle.cli.quantize import add_quantize_parser
from ladle.cli.train_draft import add_train_draft_parser
from ladle.model.arch_config import UnsupportedModelError
from ladle.model.load_errors import ModelLoadError
from ladle.sampling.params import SamplingParams

try:
    from ladle.cli.serve import add_serve_parser
except ImportError as error:  # a broken install: say what to reinstall rather than hide serve
    add_serve_parser = None
    SERVE_IMPORT_ERROR: ImportError | None = error
else:
    SERVE_IMPORT_ERROR = None

# One status per kind of failure, the same from every subcommand.
EXIT_MODEL_LOAD_FAILED = 1
EXIT_BAD_OPTION = 2


# Engine flags are generated from the config dataclasses (ladle/cli/engine_args.py).
__all__ = ["add_engine_arguments", "build_parser", "engine_options_from_args", "main"]


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--sampling-seed", type=int, default=None)


def _run_generate(args: argparse.Namespace) -> int:
    from ladle.entrypoints.llm import LLM  # the engine imports torch (~1 s): not for --help

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sampling_seed,
    )
    options = engine_options_from_args(args)
    if args.tokenizer:
        options["tokenizer"] = args.tokenizer
    llm = LLM(args.model, **options)
    return run_generate(llm, args.prompt, params, chat=args.command == "chat" or args.chat)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ladle", description="ladle: an LLM inference engine")
    parser.add_argument("--version", action="version", version=f"ladle {ladle.__version__}")
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
        sub.add_argument(
            "--tokenizer",
            default=None,
            help="tokenizer folder, hub id or .gguf file, if not the model's (random weights "
            "of a preset use the default model's)",
        )
        _add_sampling_arguments(sub)
        add_engine_arguments(sub)
        sub.set_defaults(handler=_run_generate)

    bench = subparsers.add_parser(
        "bench",
        help="benchmarks (see docs/benchmarks.md)",
        description="Benchmarks of ladle (see docs/benchmarks.md for the figures).",
        epilog=describe_workloads(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    add_bench_parsers(bench_commands)
    add_bench_multiturn_parser(bench_commands)
    add_bench_serve_parser(bench_commands)
    add_bench_startup_parser(bench_commands)
    add_quantize_parser(subparsers)
    add_train_draft_parser(subparsers)
    if add_serve_parser is None:
        _add_unavailable_serve_parser(subparsers, SERVE_IMPORT_ERROR)
    else:
        add_serve_parser(subparsers)
    return parser


def _add_unavailable_serve_parser(subparsers: argparse._SubParsersAction, error: ImportError):
    missing = getattr(error, "name", None) or str(error)

    def explain(_args: argparse.Namespace) -> int:
        print(
            f"ladle: error: `ladle serve` needs the server stack, but importing {missing!r} "
            f"failed ({error}). Install it with: pip install 'ladle[server]' (or: pip install "
            "fastapi uvicorn 'pydantic>=2' pyzmq msgspec prometheus-client)",
            file=sys.stderr,
        )
        return 1

    sub = subparsers.add_parser("serve", help="serve a model (server stack not installed)")
    sub.add_argument("rest", nargs=argparse.REMAINDER)
    sub.set_defaults(handler=explain)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Programs may pass paths as os.PathLike (pathlib.Path); argparse takes text.
    argv = sys.argv[1:] if argv is None else [os.fspath(arg) for arg in argv]
    try:
        argv = expand_config_file(argv)
    except ValueError as error:
        parser.error(str(error))
    args = parser.parse_args(argv)
    if getattr(args, "model_option", None):
        args.model = args.model_option
    try:
        return args.handler(args)
    except ValueError as error:
        print(f"ladle: error: {error}", file=sys.stderr)
        return exit_status_of(error)


def exit_status_of(error: ValueError) -> int:
    """EXIT_MODEL_LOAD_FAILED for a model that cannot be loaded (every command, serve included),
    EXIT_BAD_OPTION (argparse's usage status) for any other bad option."""
    cannot_load = isinstance(error, (ModelLoadError, UnsupportedModelError))
    return EXIT_MODEL_LOAD_FAILED if cannot_load else EXIT_BAD_OPTION


if __name__ == "__main__":
    sys.exit(main())
