"""`ladle quantize MODEL OUT --method fp8|int8|int4 [--format hf-fp8|gptq|awq|ladle]`: write a
quantized Hugging Face folder that `ladle serve OUT` (and `LLM(OUT)`) loads with the method the
folder's quantization_config names. The work is in model/loader/quantized_writer.py."""

from __future__ import annotations

import argparse
import sys
import time

from ladle.config import SUPPORTED_DTYPES


def add_quantize_parser(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser(
        "quantize",
        help="write a quantized copy of a Hugging Face checkpoint (fp8, int8, int4)",
        description="Quantize every decoder projection of a float Hugging Face checkpoint and "
        "write a Hugging Face folder (safetensors + config.json quantization_config). The "
        "embedding and LM head stay in --dtype. See docs/quantization.md.",
    )
    sub.add_argument("model", help="float Hugging Face folder or Hub id")
    sub.add_argument("out", help="output folder (created)")
    sub.add_argument("--method", required=True, choices=["fp8", "int8", "int4"])
    sub.add_argument(
        "--format",
        default=None,
        choices=["hf-fp8", "gptq", "awq", "ladle"],
        help="tensor layout (default: hf-fp8 for fp8, gptq for int4, ladle for int8)",
    )
    sub.add_argument(
        "--dtype",
        default="bfloat16",
        choices=sorted(SUPPORTED_DTYPES),
        help="dtype the weights are cast to before quantizing, and of the unquantized tensors "
        "(the dtype you will serve in; default bfloat16)",
    )
    sub.add_argument(
        "--symmetric", action="store_true", help="int4: symmetric groups (zero 8), as GPTQ sym"
    )
    sub.add_argument("--revision", default=None, help="Hub revision of MODEL")
    sub.set_defaults(handler=run_quantize)


def run_quantize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ladle.model.loader.hub import looks_like_hub_id, resolve_hub_model
    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

    source = Path(args.model).expanduser()
    if not source.is_dir():
        if not looks_like_hub_id(args.model):
            raise ValueError(f"model {args.model!r} is not a Hugging Face folder or Hub id")
        source = resolve_hub_model(args.model, args.revision, None)
    start = time.perf_counter()
    summary = write_quantized_checkpoint(
        source,
        args.out,
        args.method,
        args.format,
        SUPPORTED_DTYPES[args.dtype],
        args.symmetric,
    )
    print(
        f"ladle quantize: {summary['quantized']} weights to {args.method} in "
        f"{time.perf_counter() - start:.1f}s; {summary['bytes_in'] / 2**20:.1f} MiB -> "
        f"{summary['bytes_out'] / 2**20:.1f} MiB in {args.out}",
        file=sys.stderr,
    )
    return 0
