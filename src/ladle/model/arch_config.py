"""ModelArchConfig: the shape of a decoder-only transformer, read from a Hugging Face config.json
dict (or built from a GGUF header or a named preset). The model code reads only this."""

from __future__ import annotations

from dataclasses import dataclass, field

# Architectures ladle runs, and the per-architecture switches that tell them apart.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": {"attention_bias": False, "qk_norm": False},
    "MistralForCausalLM": {"attention_bias": False, "qk_norm": False},
    "Qwen2ForCausalLM": {"attention_bias": True, "qk_norm": False},
    "Qwen3ForCausalLM": {"attention_bias": False, "qk_norm": True},
    # Mixtures of experts: the Llama-family attention, with MoE blocks in place of the MLP
    # (models/sparse_moe.py).
    "Qwen3MoeForCausalLM": {"attention_bias": False, "qk_norm": True},
    "MixtralForCausalLM": {"attention_bias": False, "qk_norm": False},
}


# The mixtures of experts among them (models/sparse_moe.py).
MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "MixtralForCausalLM")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture (or a feature of it) is one ladle cannot run."""


@dataclass(frozen=True)
class ModelArchConfig:
    """The shape and switches of one decoder-only model; everything the model code reads."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    # None, or {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # Mixture of experts (0 experts: a dense model). A sparse layer routes each token to
    # num_experts_per_token of num_experts SiLU-gated MLPs of width moe_intermediate_size; the
    # other layers (mlp_only_layers, and those decoder_sparse_step skips) keep a dense MLP of
    # width intermediate_size. norm_topk_prob renormalises the chosen experts' probabilities.
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    @classmethod
    def from_hf_dict(cls, config: dict) -> ModelArchConfig:
        architectures = config.get("architectures") or []
        architecture = architectures[0] if architectures else None
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {architecture!r}; ladle runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if config.get("sliding_window") and config.get("use_sliding_window", True) and (
            architecture in ("MistralForCausalLM", "MixtralForCausalLM")
        ):
            raise UnsupportedModelError(
                f"{architecture} with sliding-window attention is not supported"
            )
        if config.get("use_sliding_window") and config.get("sliding_window"):
            raise UnsupportedModelError(
                f"{architecture} with sliding-window attention is not supported"
            )
        if config.get("mlp_bias"):
            raise UnsupportedModelError("MLP projections with bias (mlp_bias) are not supported")
        switches = SUPPORTED_ARCHITECTURES[architecture]
        num_heads = int(config["num_attention_heads"])
        hidden_size = int(config["hidden_size"])
        head_dim = config.get("head_dim") or hidden_size // num_heads
        # transformers 5 writes rope settings as rope_parameters; older files use
        # rope_theta + rope_scaling. Accept both.
        rope_parameters = dict(config.get("rope_parameters") or {})
        rope_scaling = config.get("rope_scaling") or None
        rope_theta = config.get("rope_theta", rope_parameters.get("rope_theta", 10000.0))
        if rope_scaling is None and rope_parameters.get("rope_type", "default") != "default":
            rope_scaling = rope_parameters
        if rope_scaling is not None:
            rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
            if rope_type in (None, "default"):
                rope_scaling = None
            elif rope_type != "llama3":
                raise UnsupportedModelError(f"rope scaling type {rope_type!r} is not supported")
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            architecture=architecture,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", switches["attention_bias"])),
            qk_norm=switches["qk_norm"],
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **_moe_fields(architecture, config),
        )

    def is_sparse_layer(self, layer_index: int) -> bool:
        """Whether layer `layer_index` holds a mixture of experts (else a dense MLP), by Qwen3-MoE's
        rule: not listed in mlp_only_layers, and every decoder_sparse_step-th layer (1-based)."""
        return (
            self.num_experts > 0
            and layer_index not in self.mlp_only_layers
            and (layer_index + 1) % self.decoder_sparse_step == 0
        )

    @property
    def has_o_proj_bias(self) -> bool:
        """attention_bias covers o_proj too (HF Llama, Qwen3), except in Qwen2, which puts
        bias on q/k/v only."""
        return self.attention_bias and self.architecture != "Qwen2ForCausalLM"

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V for one token over all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


def _moe_fields(architecture: str, config: dict) -> dict:
    """The MoE fields of a Qwen3-MoE or Mixtral config.json; {} for a dense architecture.
    transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (Mixtral's name), so both
    are read."""
    if architecture not in MOE_ARCHITECTURES:
        return {}
    num_experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    top_k = int(config.get("num_experts_per_tok") or 0)
    if num_experts < 1 or not 1 <= top_k <= num_experts:
        raise ValueError(
            f"{architecture} needs 1 <= num_experts_per_tok <= num_experts; the config has "
            f"num_experts={num_experts}, num_experts_per_tok={top_k}"
        )
    if architecture == "MixtralForCausalLM":
        # Every Mixtral layer is sparse, its experts are intermediate_size wide, and the top-k
        # probabilities are always renormalised.
        return {
            "num_experts": num_experts,
            "num_experts_per_token": top_k,
            "moe_intermediate_size": int(config["intermediate_size"]),
            "norm_topk_prob": True,
        }
    sparse_step = int(config.get("decoder_sparse_step") or 1)
    if sparse_step < 1:
        raise ValueError(f"decoder_sparse_step must be >= 1, got {sparse_step}")
    return {
        "num_experts": num_experts,
        "num_experts_per_token": top_k,
        "moe_intermediate_size": int(config["moe_intermediate_size"]),
        "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
        "decoder_sparse_step": sparse_step,
        "mlp_only_layers": tuple(int(i) for i in config.get("mlp_only_layers") or ()),
    }
