"""`transformers serve --continuous-batching` on random weights of a ladle preset's shape (the
peer of issue 9, item 5), for a machine that cannot download checkpoints.

    python scripts/transformers_serve_peer.py llama-3.1-8b --tokenizer DIR --port 8123

It is transformers' own `Serve` (its FastAPI app, its continuous-batching manager, its CB
streamer), started as the `transformers serve` command starts it; only the two loaders of its
ModelManager are replaced: the model is built from the preset's config.json values with random
weights on the GPU (what ladle's `--load-format dummy` serves), and the tokenizer is read from a
local folder. Everything a request touches after loading is transformers' code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _install_loaders(preset: str, tokenizer_dir: str, dtype: str, ignore_eos: bool) -> None:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.cli.serving import model_manager

    from ladle.model.loader.presets import get_preset

    if Path(preset, "config.json").is_file():  # a local folder's config (CPU smoke runs)
        config = AutoConfig.from_pretrained(preset)
    else:
        values = get_preset(preset)
        if values is None:
            raise SystemExit(f"unknown preset {preset!r} (and no folder with a config.json)")
        model_type = values.pop("model_type")
        values.pop("architectures", None)
        config = AutoConfig.for_model(model_type, **values)

    def load_model(self, model_id_and_revision, tqdm_class=None, progress_callback=None, **_):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        kwargs = {"dtype": getattr(torch, dtype)}
        if self.attn_implementation is not None:
            kwargs["attn_implementation"] = self.attn_implementation
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        if ignore_eos:  # -1: the continuous-batching manager's "no end token"
            model.generation_config.eos_token_id = -1
        return model.eval()

    def load_processor(self, model_id_and_revision, gguf_file=None):
        return AutoTokenizer.from_pretrained(tokenizer_dir)

    model_manager.ModelManager._load_model = load_model
    model_manager.ModelManager._load_processor = load_processor
    print(f"[peer] transformers {transformers.__version__}, random {preset} weights", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "preset",
        help="a ladle preset name (its config.json values), or a folder with a config.json",
    )
    parser.add_argument("--tokenizer", required=True, help="a local tokenizer folder")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cb-max-batch-tokens", type=int, default=None)
    parser.add_argument("--cb-use-cuda-graph", action="store_true")
    parser.add_argument("--attn-implementation", default=None)
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="generate every request's max_tokens (the server refuses the ignore_eos field)",
    )
    args = parser.parse_args()
    _install_loaders(args.preset, args.tokenizer, args.dtype, args.ignore_eos)
    from transformers.cli.serve import Serve

    options = {}
    if args.cb_max_batch_tokens is not None:
        options["cb_max_batch_tokens"] = args.cb_max_batch_tokens
    if args.cb_use_cuda_graph:
        options["cb_use_cuda_graph"] = True
    Serve(
        force_model=f"dummy/{args.preset}",
        continuous_batching=True,
        attn_implementation=args.attn_implementation,
        device="cuda" if _has_cuda() else "cpu",
        dtype=args.dtype,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        **options,
    )
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
