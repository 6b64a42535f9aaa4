"""Perplexity of the default model after the calibration pass of `ladle quantize` with GPTQ
variants for int4 group 128 (alone and on top of AWQ's input scales).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/gptq_ablation.py \\
        --num-tokens 8192 --runs awq awq-gptq-wclip awq-gptq-wclip-act

Each run restores the float32 model, runs calibration.calibrate_linears on calibration windows
(the conversations after the perplexity bench's, calibration_text.py; sequential: each layer is
calibrated on the outputs of the already-quantized layers before it) and scores the bench's
windows with the quantized (dequantized in place) weights: the numbers `ladle quantize` writes
and the loader reads back, without the folder round trip.

    awq                  AWQ scales folded, then round to nearest with the weighted clipping
                         search (= the landed `ladle quantize --algorithm awq`)
    gptq / gptq-wclip    GPTQ in natural order, groups' ranges by round-to-nearest's rule /
                         by the weighted 2-D clipping search on the compensated group
    gptq-wclip-act       GPTQ in act-order (largest Hessian diagonal first) with static groups
                         (ranges by the weighted search on the uncompensated weight)
    awq-...              the same after AWQ's scales are folded
    awq-gptq-wclip-ao    awq-gptq-wclip with its groups formed in act-order (desc_act)

--rotation-seed N: every run on the model with a rotation folded into its residual stream
(`ladle quantize --rotate --rotation-seed N`).
"""

from __future__ import annotations

import argparse
import time

from perplexity import load_for_perplexity, perplexity

from ladle.model.default_model import resolve_default_model
from ladle.model.layers.quant.int4 import Int4Method
from ladle.model.layers.quant.rotation import rotate_residual_stream_
from ladle.model.loader.calibration import (
    calibrate_linears,
    clip_search_quantizer,
    gptq_quantizer,
)
from ladle.model.loader.calibration_text import (
    EVALUATION_CONVERSATIONS,
    calibration_texts,
    sharegpt_texts,
    token_windows,
)

METHOD = Int4Method()
# name -> (quantizer, AWQ scales folded first)
RUNS = {
    "rtn-wclip": (clip_search_quantizer(METHOD), False),
    "awq": (clip_search_quantizer(METHOD), True),
    "gptq": (gptq_quantizer(METHOD), False),
    "gptq-wclip": (gptq_quantizer(METHOD, "weighted"), False),
    "gptq-wclip-act": (gptq_quantizer(METHOD, "weighted", act_order="static"), False),
    "awq-gptq": (gptq_quantizer(METHOD), True),
    "awq-gptq-wclip": (gptq_quantizer(METHOD, "weighted"), True),
    "awq-gptq-wclip-act": (gptq_quantizer(METHOD, "weighted", act_order="static"), True),
    "awq-gptq-act": (gptq_quantizer(METHOD, None, act_order="static"), True),
    "awq-gptq-wclip-ao": (gptq_quantizer(METHOD, "weighted", act_order="dynamic"), True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-tokens", type=int, default=8192)
    parser.add_argument("--calibration-samples", type=int, default=32)
    parser.add_argument("--calibration-tokens", type=int, default=512)
    parser.add_argument("--runs", nargs="+", default=["awq", "awq-gptq-wclip"], choices=list(RUNS))
    parser.add_argument("--float32-perplexity", type=float, default=None, help="skip its run")
    parser.add_argument(
        "--rotation-seed",
        type=int,
        default=None,
        help="fold this seed's rotation into the residual stream first (ladle quantize --rotate)",
    )
    args = parser.parse_args()
    from ladle.model.tokenizer import load_tokenizer

    model_path = str(resolve_default_model())
    tokenizer = load_tokenizer(model_path)
    windows = token_windows(
        tokenizer, sharegpt_texts(0, EVALUATION_CONVERSATIONS), args.num_tokens, 1024
    )
    num_calibration = args.calibration_samples * args.calibration_tokens
    calibration = token_windows(
        tokenizer, calibration_texts(0), num_calibration, args.calibration_tokens
    )
    calibration = [w for w in calibration if len(w) == args.calibration_tokens]
    model = load_for_perplexity(model_path, "none")
    original = {name: value.clone() for name, value in model.state_dict().items()}
    base = args.float32_perplexity or perplexity(model, windows)
    print(f"{'float32':>20}: {base:.4f}", flush=True)
    for run in args.runs:
        quantizer, fold = RUNS[run]
        model.lm_head = None  # the default model's head is tied; a rotation unties it
        model.load_state_dict(original)
        started = time.perf_counter()
        if args.rotation_seed is not None:
            rotate_residual_stream_(model, args.rotation_seed)
        calibrate_linears(model, calibration, quantizer, fold_scales=fold)
        calibrated = time.perf_counter() - started
        result = perplexity(model, windows)
        print(
            f"{run:>20}: {result:.4f} {(result / base - 1) * 100:+.2f}% "
            f"(calibration {calibrated:.0f} s, {len(calibration)} x {args.calibration_tokens}; "
            f"total {time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
