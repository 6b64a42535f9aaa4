"""Load the network that drafts in the worker (speculative_config.model): a smaller model of
the target's tokenizer (draft_model) or an EAGLE-1 / EAGLE-3 head, checked against the target
at start-up; every refusal names speculative_config.model and what does not match.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ladle.attention.base import AttentionBackend
from ladle.config import RANDOM_DRAFT_HEAD, ModelConfig, SpeculativeConfig
from ladle.model.arch_config import ModelArchConfig
from ladle.model.load_errors import ModelLoadError
from ladle.model.loader import load_model
from ladle.model.loader.safetensors import find_safetensors_files, iter_safetensors_weights
from ladle.model.models.eagle import EagleHead
from ladle.model.models.eagle_config import (
    FIELD,
    EagleHeadConfig,
    eagle_method_of,
    random_eagle3_config,
    read_eagle_config,
)

# Weight files that are pickles: never loaded (loading a pickle can run code).
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


@dataclass
class DraftNetwork:
    """The loaded drafter: method "draft_model" (model set) or "eagle"/"eagle3" (head set)."""

    method: str
    arch: ModelArchConfig  # the draft model's, or the head's one layer
    model: nn.Module | None = None
    head: EagleHead | None = None


def resolve_drafter_method(spec: SpeculativeConfig) -> str:
    """draft_model, eagle or eagle3 for a config that drafts with a network (auto: what the
    folder holds)."""
    if spec.method in ("draft_model", "eagle", "eagle3"):
        return spec.method
    assert spec.model is not None
    if spec.model == RANDOM_DRAFT_HEAD:
        return "eagle3"
    return eagle_method_of(spec.model) or "draft_model"


def load_draft_network(
    spec: SpeculativeConfig,
    target_config: ModelConfig,
    target_arch: ModelArchConfig,
    device: torch.device,
    dtype: torch.dtype,
    backend: AttentionBackend,
) -> DraftNetwork:
    method = resolve_drafter_method(spec)
    assert spec.model is not None
    if method == "draft_model":
        return _load_draft_model(spec.model, target_config, target_arch, device, dtype, backend)
    if spec.model == RANDOM_DRAFT_HEAD:
        if target_config.load_format != "dummy":
            raise ModelLoadError(
                f"{FIELD}='random' (a random EAGLE-3 head) is for benchmarks on random weights: "
                "it needs load_format='dummy'"
            )
        config = random_eagle3_config(target_arch)
        head = _build_head(config, device, dtype, backend)
        head.randomize_(target_config.seed + 1)
        return DraftNetwork(method, config.arch, head=head)
    config = read_eagle_config(spec.model, method, target_arch)
    head = _build_head(config, device, dtype, backend)
    head.load_weights(iter_safetensors_weights(_safetensors_files(spec.model)))
    return DraftNetwork(method, config.arch, head=head)


def _build_head(
    config: EagleHeadConfig, device: torch.device, dtype: torch.dtype, backend: AttentionBackend
) -> EagleHead:
    """Built on the meta device, then materialised once on `device` (as build_model does)."""
    with torch.device("meta"):
        head = EagleHead(config, backend)
    head = head._apply(
        lambda meta: torch.empty(
            meta.shape, dtype=dtype if meta.is_floating_point() else meta.dtype, device=device
        )
    )
    head.rotary_emb.init_buffers()
    if config.method == "eagle3":
        head.d2t.zero_()
    return head.eval()


def _safetensors_files(path: str) -> list[Path]:
    folder = Path(path).expanduser()
    has_safetensors = folder.is_dir() and any(folder.glob("*.safetensors"))
    if has_safetensors:
        return find_safetensors_files(folder)
    pickled = sorted(p.name for p in folder.glob("*") if p.suffix in _PICKLE_SUFFIXES)
    if pickled:
        raise ModelLoadError(
            f"{FIELD}={path!r} holds only pickled weights ({', '.join(pickled)}); ladle loads "
            "safetensors only (pickle can run code): convert them to model.safetensors"
        )
    raise ModelLoadError(f"{FIELD}={path!r} has no .safetensors weights")


def _load_draft_model(
    path: str,
    target_config: ModelConfig,
    target_arch: ModelArchConfig,
    device: torch.device,
    dtype: torch.dtype,
    backend: AttentionBackend,
) -> DraftNetwork:
    folder = Path(path).expanduser()
    if folder.is_dir() and not any(folder.glob("*.safetensors")):
        _safetensors_files(path)  # names the pickled files, if that is what is there
    draft_config = dataclasses.replace(
        target_config,
        model=path,
        tokenizer=None,
        hf_overrides={},
        max_model_len=None,
        # The draft runs unquantized (it is small); GGUF drafts keep their own format.
        quantization="none" if target_config.quantization not in ("auto", "gguf") else "auto",
    )
    try:
        loaded = load_model(draft_config, device, dtype, backend)
    except ModelLoadError as error:
        raise ModelLoadError(f"{FIELD}={path!r}: {error}") from None
    arch = loaded.arch_config
    if arch.vocab_size != target_arch.vocab_size:
        raise ModelLoadError(
            f"{FIELD}={path!r}: the draft model's vocab_size is {arch.vocab_size}, the target's "
            f"{target_arch.vocab_size}; a draft model must share the target's tokenizer"
        )
    _check_tokenizers(path, target_config, target_arch, arch)
    return DraftNetwork("draft_model", arch, model=loaded.model)


def _check_tokenizers(
    path: str, target_config: ModelConfig, target_arch: ModelArchConfig, arch: ModelArchConfig
) -> None:
    """Same special ids, and where both folders hold a tokenizer.json, the same vocabulary."""
    if arch.bos_token_id != target_arch.bos_token_id or (
        set(arch.eos_token_ids) != set(target_arch.eos_token_ids)
    ):
        raise ModelLoadError(
            f"{FIELD}={path!r}: the draft model's tokenizer differs from the target's (bos "
            f"{arch.bos_token_id} / eos {list(arch.eos_token_ids)} against bos "
            f"{target_arch.bos_token_id} / eos {list(target_arch.eos_token_ids)})"
        )
    target_folder = target_config.tokenizer or target_config.model
    target_vocab = _tokenizer_vocab(target_folder)
    draft_vocab = _tokenizer_vocab(path)
    if target_vocab is not None and draft_vocab is not None and target_vocab != draft_vocab:
        differing = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()))[:3]
        raise ModelLoadError(
            f"{FIELD}={path!r}: the draft model's tokenizer differs from the target's (their "
            f"tokenizer.json vocabularies differ, e.g. {differing})"
        )


def _tokenizer_vocab(folder: object) -> dict | None:
    if folder is None:
        return None
    path = Path(str(folder)).expanduser() / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        model = json.loads(path.read_text()).get("model") or {}
    except (OSError, ValueError):
        return None
    vocab = model.get("vocab")
    return vocab if isinstance(vocab, dict) else None
