"""Time and GPU memory of `ladle quantize --tune-steps` on a real model shape with random weights
(load_format dummy, so no download): the float model's targets on the windows, fp8's rounding to
nearest or int4's clipping search, then the tuning steps. Prints seconds per phase and step and
the peak memory allocated. The written folder is not part of it (the writer streams tensors).

    python scripts/tuning_memory_probe.py llama-3.1-8b --method fp8 --steps 4 --windows 8
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ladle.attention.backend import get_attention_backend
from ladle.config import ModelConfig
from ladle.model.layers.quant import default_float_layers, get_quant_method
from ladle.model.loader import load_model
from ladle.model.loader.calibration import calibrate_linears, clip_search_quantizer, round_linears_
from ladle.model.loader.scale_tuning import WINDOWS_PER_STEP, teacher_targets, tune_scales_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="a dummy preset name, e.g. llama-3.1-8b")
    parser.add_argument("--method", choices=["fp8", "int4"], default="fp8")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512, help="tokens a window")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    device = torch.device("cuda")
    config = ModelConfig(
        model=args.preset, load_format="dummy", quantization="none", dtype="bfloat16"
    )
    model = load_model(config, device, torch.bfloat16, get_attention_backend(device)).model
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    windows = [
        torch.randint(0, vocab, (args.tokens,), generator=generator).tolist()
        for _ in range(args.windows)
    ]
    method = get_quant_method(args.method)
    float_layers = default_float_layers(args.method, len(model.model.layers))
    phases: dict[str, float] = {}

    def timed(name, function, *a, **k):
        torch.cuda.synchronize()
        started = time.perf_counter()
        result = function(*a, **k)
        torch.cuda.synchronize()
        phases[name] = round(time.perf_counter() - started, 2)
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"{name}: {phases[name]:.1f} s, peak {peak:.1f} GiB", flush=True)
        return result

    loaded = torch.cuda.max_memory_allocated()
    targets = timed("targets", teacher_targets, model, windows)
    if args.method == "fp8":
        results = timed("round to nearest", round_linears_, model, method, float_layers, ())
    else:
        quantizer = clip_search_quantizer(method)
        results = timed(
            "clipping search", calibrate_linears, model, windows, quantizer, None, float_layers
        )
    torch.cuda.reset_peak_memory_stats()
    before_tuning = torch.cuda.memory_allocated()
    group_size = getattr(method, "group_size", None)
    timed("tuning", tune_scales_, model, windows, results, targets, args.steps, group_size)
    summary = {
        "preset": args.preset,
        "method": args.method,
        "windows": args.windows,
        "tokens": args.tokens,
        "steps": args.steps,
        "windows_per_step": WINDOWS_PER_STEP,
        "seconds": phases,
        "seconds_per_step": round(phases["tuning"] / args.steps, 2),
        "model_gib": round(loaded / 2**30, 2),
        "before_tuning_gib": round(before_tuning / 2**30, 2),
        "tuning_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "gpu": torch.cuda.get_device_name(),
    }
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(summary, file)


if __name__ == "__main__":
    main()
