"""An EAGLE head's config.json (the layout vLLM and SGLang load), read and checked against the
target model it drafts for.

EAGLE-1 heads name `LlamaForCausalLMEagle` / `EAGLEModel` (a Llama decoder layer over fc of the
token embedding and the target's last hidden state); EAGLE-3 heads name `LlamaForCausalLMEagle3`
/ `Eagle3LlamaForCausalLM` (the target's low, middle and high layers fused by fc, a draft
vocabulary with its d2t map). Every mismatch is refused naming speculative_config.model and the
field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ladle.model.arch_config import ModelArchConfig
from ladle.model.load_errors import ModelLoadError

EAGLE1_ARCHITECTURES = ("LlamaForCausalLMEagle", "EAGLEModel", "EagleLlamaForCausalLM")
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
# The draft vocabulary of published EAGLE-3 heads (and of the random head benchmarks use).
DEFAULT_DRAFT_VOCAB_SIZE = 32000
FIELD = "speculative_config.model"


@dataclass(frozen=True)
class EagleHeadConfig:
    """What the head module reads: its method, its decoder layer's shape (as a one-layer
    ModelArchConfig with the target's vocabulary) and its draft vocabulary."""

    method: str  # "eagle" or "eagle3"
    arch: ModelArchConfig
    draft_vocab_size: int
    target_hidden_size: int
    # EAGLE-3: the target layers whose inputs (hidden + residual) the head fuses.
    aux_layer_ids: tuple[int, ...] = ()


def eagle_method_of(path: str) -> str | None:
    """"eagle" / "eagle3" when `path` is a folder whose config.json names an EAGLE head."""
    config_path = Path(path).expanduser() / "config.json"
    if not config_path.is_file():
        return None
    try:
        architectures = json.loads(config_path.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    if any(name in EAGLE3_ARCHITECTURES for name in architectures):
        return "eagle3"
    if any(name in EAGLE1_ARCHITECTURES for name in architectures):
        return "eagle"
    return None


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """vLLM's default EAGLE-3 feature layers: low, middle and high (clamped for tiny models)."""
    ids = (2, num_layers // 2, num_layers - 3)
    return tuple(min(max(i, 0), num_layers - 1) for i in ids)


def read_eagle_config(path: str, method: str, target: ModelArchConfig) -> EagleHeadConfig:
    """Read and check `path`/config.json for `method` against the target's shape."""
    config_path = Path(path).expanduser() / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{FIELD}={path!r}: no config.json there (an {method} head folder)")
    try:
        raw = json.loads(config_path.read_text())
    except ValueError as error:
        raise ModelLoadError(f"{FIELD}={path!r}: config.json is not JSON: {error}") from None
    found = eagle_method_of(path)
    if found is not None and found != method:
        raise ModelLoadError(
            f"{FIELD}={path!r} is an {found} head (architectures {raw.get('architectures')}), "
            f"but speculative_config.method is {method!r}"
        )
    return eagle_config_from_dict(raw, method, target, where=repr(path))


def eagle_config_from_dict(
    raw: dict, method: str, target: ModelArchConfig, where: str = "the head"
) -> EagleHeadConfig:
    """The head's config from its config.json dict, checked against the target."""
    layer = dict(raw, architectures=["LlamaForCausalLM"], num_hidden_layers=1)
    layer.setdefault("max_position_embeddings", target.max_position_embeddings)
    layer.setdefault("intermediate_size", target.intermediate_size)
    try:
        arch = ModelArchConfig.from_hf_dict(layer)
    except (KeyError, TypeError, ValueError) as error:
        raise ModelLoadError(f"{FIELD} {where}: its config.json is incomplete: {error}") from None
    # Positions are the target's: the head's rotary table must reach as far.
    arch = dataclasses.replace(
        arch, max_position_embeddings=max(arch.max_position_embeddings,
                                          target.max_position_embeddings)
    )
    for name, head_value, target_value in (
        ("hidden_size", arch.hidden_size, target.hidden_size),
        ("vocab_size", arch.vocab_size, target.vocab_size),
    ):
        if head_value != target_value:
            raise ModelLoadError(
                f"{FIELD} {where}: the head's {name} is {head_value}, the target model's "
                f"{target_value}; a head drafts only for the model it was trained on"
            )
    target_hidden = int(raw.get("target_hidden_size") or arch.hidden_size)
    if target_hidden != target.hidden_size:
        raise ModelLoadError(
            f"{FIELD} {where}: the head's target_hidden_size is {target_hidden}, the target "
            f"model's hidden_size {target.hidden_size}"
        )
    draft_vocab = int(raw.get("draft_vocab_size") or arch.vocab_size)
    if not 1 <= draft_vocab <= arch.vocab_size:
        raise ModelLoadError(
            f"{FIELD} {where}: draft_vocab_size {draft_vocab} is outside 1..vocab_size "
            f"{arch.vocab_size}"
        )
    aux_ids: tuple[int, ...] = ()
    if method == "eagle3":
        layer_ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        aux_ids = (
            tuple(int(i) for i in layer_ids)
            if layer_ids
            else default_aux_layer_ids(target.num_hidden_layers)
        )
        if len(aux_ids) != 3 or not all(0 <= i < target.num_hidden_layers for i in aux_ids):
            raise ModelLoadError(
                f"{FIELD} {where}: eagle_aux_hidden_state_layer_ids {list(aux_ids)} must be "
                f"three layers of the target's {target.num_hidden_layers}"
            )
    return EagleHeadConfig(method, arch, draft_vocab, target_hidden, aux_ids)


def random_eagle3_config(target: ModelArchConfig) -> EagleHeadConfig:
    """An EAGLE-3 head of the target's shape (benchmarks on random weights): the target's
    attention and MLP widths, a draft vocabulary as published heads have."""
    raw = {
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": min(DEFAULT_DRAFT_VOCAB_SIZE, target.vocab_size),
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "rope_scaling": target.rope_scaling,
    }
    return eagle_config_from_dict(raw, "eagle3", target, where="'random'")
