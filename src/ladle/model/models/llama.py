"""The Llama-family decoder: Llama 2/3/3.1/3.2, SmolLM2, Mistral (no sliding window), Qwen2
(q/k/v bias) and Qwen3 (per-head q/k RMSNorm), told apart only by ModelArchConfig switches.

Module names mirror Hugging Face's (model.layers.N.self_attn...), so loading a checkpoint is a
rename of q/k/v -> qkv_proj and gate/up -> gate_up_proj and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from ladle.attention.base import AttentionBackend
from ladle.attention.metadata import AttentionMetadata
from ladle.distributed.pipeline import SINGLE_STAGE, PipelineStage
from ladle.distributed.tensor_parallel import SINGLE, TensorParallel
from ladle.kernels.cpu_native.decode_ops import rotate_and_cache
from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.arch_config import ModelArchConfig
from ladle.model.layers.activation import SiluAndMul
from ladle.model.layers.attention import Attention
from ladle.model.layers.embedding import LMHead, VocabEmbedding
from ladle.model.layers.kv_scales import load_kv_scale
from ladle.model.layers.linear import MergedLinear, QKVLinear
from ladle.model.layers.norm import RMSNorm
from ladle.model.layers.parallel_linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from ladle.model.layers.rotary import RotaryEmbedding, rotate_with_tables
from ladle.model.layers.weight_loading import default_weight_loader
from ladle.model.load_errors import ModelLoadError
from ladle.model.models.llama_decode_stack import cpu_decode_stack

# Checkpoint name fragment -> (our merged parameter's fragment, shard of it).
_MERGED_WEIGHTS = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
)
# Checkpoint tensors that are not weights: cached rotary frequencies some exporters saved.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
# Which part of a parameter one checkpoint tensor fills: None (all of it), a merged linear's
# shard ("q"/"k"/"v" or an index), or a stacked expert's (expert index, "gate"/"up"/"down").
ShardId = str | int | tuple[int, str] | None


class LlamaAttention(nn.Module):
    """Self-attention block: merged qkv projection, optional q/k norm, rotary, paged attention.
    Under tensor parallelism each rank attends with its own heads (num_heads, num_kv_heads are
    this rank's) and the output projection sums the ranks' parts."""

    def __init__(
        self,
        config: ModelArchConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TensorParallel = SINGLE,
        input_size: int | None = None,
    ) -> None:
        """input_size: the width of the layer's input when it is not hidden_size (an EAGLE-3
        head attends over the token embedding and the hidden state side by side)."""
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            input_size or config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            tp,
            bias=config.attention_bias,
        )
        self.num_heads = self.qkv_proj.q_size // self.head_dim
        self.num_kv_heads = self.qkv_proj.kv_size // self.head_dim
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            tp,
            bias=config.has_o_proj_bias,
        )
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        # Not a submodule of this layer: one rotary table is shared by every layer (nn.Module
        # attribute assignment would register it, hence the tuple wrapper).
        self._rotary = (rotary,)
        self.attn = Attention(
            self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, backend
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rotary_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """rotary_tables: this step's `RotaryEmbedding.step_tables` where the rotary runs as
        plain torch ops (not the fused CUDA kernel), else None."""
        num_tokens = hidden_states.shape[0]
        qkv = self.qkv_proj(hidden_states)
        if rotary_tables is not None and self.q_norm is None:
            # On the CPU in float32: one C call rotates the query and key heads in place and
            # writes keys and values to the cache (kernels/cpu_native/rotary_cache.c).
            if self.attn.can_attend_cached(kv_cache) and rotate_and_cache(
                qkv,
                rotary_tables,
                kv_cache,
                attn_metadata.slot_mapping,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
            ):
                query = qkv[:, : self.qkv_proj.q_size].view(num_tokens, self.num_heads, -1)
                return self.o_proj(self.attn.attend_cached(query, kv_cache, attn_metadata))
            # Query and key heads sit side by side in qkv: rotated together, four ops.
            query_key = qkv[:, : self.qkv_proj.q_size + self.qkv_proj.kv_size]
            query_key = rotate_with_tables(
                query_key.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim),
                rotary_tables,
            )
            query, key = query_key.split([self.num_heads, self.num_kv_heads], dim=1)
            value = qkv[:, self.qkv_proj.q_size + self.qkv_proj.kv_size :]
            return self.o_proj(self.attn(query, key, value, kv_cache, attn_metadata))
        query, key, value = self.qkv_proj.split(qkv)
        query = query.view(num_tokens, self.num_heads, self.head_dim)
        key = key.view(num_tokens, self.num_kv_heads, self.head_dim)
        rotary = self._rotary[0]
        qk_norm = None
        if self.q_norm is not None:
            # Qwen3 normalises each head before rotary: on CUDA in the rotary's own launch.
            qk_norm = rotary.may_norm_heads(query, key, self.q_norm, self.k_norm)
            if qk_norm is None:
                query = self.q_norm(query)
                key = self.k_norm(key)
        # On CUDA one launch rotates and writes the cache; elsewhere the backend writes it.
        cache_written = self.attn.rotate_and_cache_(
            rotary, positions, query, key, value, kv_cache, attn_metadata, qk_norm
        )
        if not cache_written:
            query, key = rotary(positions, query, key, qk_norm)
        output = self.attn(query, key, value, kv_cache, attn_metadata, cache_written)
        return self.o_proj(output)


class LlamaMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up merged into one matmul; under tensor
    parallelism each rank computes a slice of the intermediate features."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], tp
        )
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # At batch 1 on CUDA the projection and SiLU-and-mul are one launch.
        activated = self.gate_up_proj.gate_up_silu(x)
        if activated is None:
            activated = self.act_fn(self.gate_up_proj(x))
        return self.down_proj(activated)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block. The residual stream is carried between layers and added inside the next
    norm (RMSNorm's fused add), so each layer returns (hidden_states, residual).

    `mlp` is any module hidden -> hidden (default the dense LlamaMLP): mixtures of experts put
    a SparseMoeBlock there (models/sparse_moe.py)."""

    def __init__(
        self,
        config: ModelArchConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        mlp: nn.Module | None = None,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary, backend, tp)
        if mlp is None:
            mlp = LlamaMLP(config.hidden_size, config.intermediate_size, tp)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def quantized_input_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """(producer, its only consumer): a producer may quantize for an fp8 consumer (SiLU-and-mul
        does from 64 rows, kernels/activation.py)."""
        pairs: list[tuple[nn.Module, nn.Module]] = [(self.input_layernorm, self.self_attn.qkv_proj)]
        if isinstance(self.mlp, LlamaMLP):  # a MoE block's experts are not Linear layers
            pairs += [
                (self.post_attention_layernorm, self.mlp.gate_up_proj),
                (self.mlp.act_fn, self.mlp.down_proj),
            ]
        return pairs

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        rotary_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Each norm feeds one projection, which may run it in its own batch-1 GEMV launch
        # (layers/deferred_norm.py); a MoE block's router and experts share theirs.
        qkv_proj = self.self_attn.qkv_proj
        gate_up_proj = self.mlp.gate_up_proj if isinstance(self.mlp, LlamaMLP) else None
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states, into=qkv_proj)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual, into=qkv_proj)
        hidden_states = self.self_attn(
            positions, hidden_states, kv_cache, attn_metadata, rotary_tables
        )
        hidden_states, residual = self.post_attention_layernorm(
            hidden_states, residual, into=gate_up_proj
        )
        return self.mlp(hidden_states), residual


class StageMissingLayer(nn.Module):
    """The place of a decoder layer another pipeline stage runs: no weights, never called."""


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm (HF's `model.` prefix). build_mlp(layer_index),
    when given, makes each layer's MLP (else the dense LlamaMLP).

    A pipeline stage holds only its own layers (the others are StageMissingLayer, so layer
    indices keep the checkpoint's names), the embedding only on the first stage (and the last,
    whose tied LM head reads it) and the final norm only on the last."""

    def __init__(
        self,
        config: ModelArchConfig,
        attention_backend: AttentionBackend,
        build_mlp: Callable[[int], nn.Module | None] | None = None,
        tp: TensorParallel = SINGLE,
        stage: PipelineStage = SINGLE_STAGE,
    ) -> None:
        super().__init__()
        self.stage = stage
        self.layer_range = stage.layer_range(config.num_hidden_layers)
        needs_embedding = stage.is_first or (stage.is_last and config.tie_word_embeddings)
        self.embed_tokens = (
            VocabEmbedding(config.vocab_size, config.hidden_size, tp) if needs_embedding else None
        )
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                config,
                self.rotary_emb,
                attention_backend,
                build_mlp(index) if build_mlp else None,
                tp,
            )
            if index in self.layer_range
            else StageMissingLayer()
            for index in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if stage.is_last else None
        # Layers whose inputs (hidden + residual) an EAGLE-3 draft head reads: when set, the
        # forward returns them after the final hidden states, concatenated on the last axis
        # ([num_tokens, (1 + len) * hidden]); () (the default) changes nothing.
        self.aux_hidden_layers: tuple[int, ...] = ()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
        intermediate: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The final hidden states; on a pipeline stage before the last, (hidden states,
        residual) for the next stage, which passes them back in as `intermediate`. kv_caches
        holds this stage's layers' caches."""
        own_layers = [self.layers[index] for index in self.layer_range]
        if len(kv_caches) != len(own_layers):
            raise ValueError(f"got {len(kv_caches)} kv caches for {len(own_layers)} layers")
        if intermediate is None:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        else:
            hidden_states, residual = intermediate
        # Off the fused CUDA path the rotary tables of this step's positions are gathered once
        # for all layers.
        rotary_tables = None
        if not use_fused_kernels(hidden_states):
            rotary_tables = self.rotary_emb.step_tables(positions)
            # A CPU decode step of 4-bit GGUF weights: every layer in one C call, same result.
            if self.stage.size == 1 and not self.aux_hidden_layers:
                stacked = cpu_decode_stack(
                    self, hidden_states, rotary_tables, kv_caches, attn_metadata
                )
                if stacked is not None:
                    return stacked
        aux_layers = self.aux_hidden_layers
        aux: dict[int, torch.Tensor] = {}
        for index, layer, kv_cache in zip(self.layer_range, own_layers, kv_caches, strict=True):
            if aux_layers and index in aux_layers:
                aux[index] = hidden_states if residual is None else hidden_states + residual
            hidden_states, residual = layer(
                positions, hidden_states, residual, kv_cache, attn_metadata, rotary_tables
            )
        if not self.stage.is_last:
            return hidden_states, residual
        hidden_states, _ = self.norm(hidden_states, residual)
        if aux:
            return torch.cat([hidden_states, *(aux[index] for index in aux_layers)], dim=-1)
        return hidden_states

    def holds(self, checkpoint_name: str) -> bool:
        """Whether this stage loads checkpoint tensor `checkpoint_name` (a tensor of another
        stage's layers, or of a part this stage lacks, is skipped)."""
        if checkpoint_name.startswith("model.layers."):
            index = int(checkpoint_name.split(".", 3)[2])
            # A layer the model does not have is no stage's: loading it fails by name.
            return index in self.layer_range or not 0 <= index < len(self.layers)
        if checkpoint_name.startswith("model.embed_tokens."):
            return self.embed_tokens is not None
        if checkpoint_name.startswith("model.norm."):
            return self.norm is not None
        return True


class LlamaForCausalLM(nn.Module):
    """A decoder-only causal LM over a flattened (varlen) batch and a paged KV cache.

    Build it on the meta device and let the loader materialise it: parameters are created
    uninitialised and only ever filled once, from the checkpoint or the dummy filler.
    """

    # Whether a forward pass can be captured in a CUDA graph (no host reads of device values).
    can_capture_cuda_graphs = True

    def __init__(
        self,
        config: ModelArchConfig,
        attention_backend: AttentionBackend,
        tp: TensorParallel = SINGLE,
        stage: PipelineStage = SINGLE_STAGE,
    ) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        self.stage = stage
        self.model = LlamaModel(config, attention_backend, self.build_mlp, tp, stage)
        # Tied: logits reuse the embedding table instead of a second parameter. Only the last
        # pipeline stage computes logits.
        self.lm_head = (
            None
            if config.tie_word_embeddings or not stage.is_last
            else LMHead(config.vocab_size, config.hidden_size, tp)
        )

    def build_mlp(self, layer_index: int) -> nn.Module | None:
        """Layer `layer_index`'s MLP, or None for the dense LlamaMLP (subclasses override)."""
        return None

    def to_param_name(self, checkpoint_name: str) -> tuple[str, ShardId]:
        """(ladle parameter name, shard id) that checkpoint tensor `checkpoint_name` fills."""
        return to_param_name(checkpoint_name)

    def to_checkpoint_name(self, param_name: str, shard_id: ShardId) -> str:
        """The checkpoint tensor that fills shard `shard_id` of parameter `param_name`."""
        return to_checkpoint_name(param_name, shard_id)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
        intermediate: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions [num_tokens] -> final hidden states [num_tokens, hidden_size]
        (a pipeline stage before the last: its (hidden states, residual), see LlamaModel).
        kv_caches[i] is this stage's layer i's [2, num_blocks, block_size, num_kv_heads,
        head_dim]; this step's keys and values are written into it at slot_mapping."""
        return self.model(input_ids, positions, kv_caches, attn_metadata, intermediate)

    def compute_logits(self, hidden_states: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """[n, hidden_size] -> logits [n, vocab_size], float32 unless float32=False (then in the
        model's dtype: the runner's sampler widens what it must). Callers pass only the rows they
        sample from (usually each request's last token), which keeps this matmul small."""
        if self.lm_head is None:
            return self.model.embed_tokens.logits(hidden_states, float32)
        return self.lm_head(hidden_states, float32)

    def holds(self, checkpoint_name: str) -> bool:
        """Whether this pipeline stage loads checkpoint tensor `checkpoint_name` (the loader
        does not even read the others)."""
        if checkpoint_name.startswith("lm_head."):
            return self.stage.is_last
        return self.model.holds(checkpoint_name)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors (any dtype, any device), merging q/k/v and gate/up.

        Raises ModelLoadError naming the weight when one is unexpected, wrongly shaped, loaded
        twice, or when any parameter (or shard of a merged one) is still missing at the end.
        """
        params = dict(self.named_parameters())
        expected = self._expected_shards()
        loaded: set[tuple[str, ShardId]] = set()
        for checkpoint_name, tensor in weights:
            if checkpoint_name.endswith(_IGNORED_SUFFIXES):
                continue
            if not self.holds(checkpoint_name):
                continue  # another pipeline stage's
            if load_kv_scale(self, checkpoint_name, tensor):  # fp8 KV cache scales
                continue
            if checkpoint_name == "lm_head.weight" and self.lm_head is None:
                # Some tied checkpoints also store the (identical) output matrix.
                continue
            name, shard_id = self.to_param_name(checkpoint_name)
            param = params.get(name)
            if param is None or (name, shard_id) not in expected:
                raise ModelLoadError(f"unexpected weight {checkpoint_name!r} in checkpoint")
            if (name, shard_id) in loaded:
                raise ModelLoadError(f"weight {checkpoint_name!r} appears twice in checkpoint")
            owner = self.get_submodule(name.rsplit(".", 1)[0])
            try:
                if shard_id is not None:
                    owner.weight_loader(param, tensor, shard_id)
                elif hasattr(owner, "weight_loader"):
                    owner.weight_loader(param, tensor)
                else:
                    default_weight_loader(param.data, tensor)
            except ModelLoadError as error:
                raise ModelLoadError(f"weight {checkpoint_name!r}: {error}") from None
            loaded.add((name, shard_id))
        missing = sorted(self.to_checkpoint_name(*key) for key in expected - loaded)
        if missing:
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            shown = ", ".join(missing[:8]) + more
            raise ModelLoadError(f"checkpoint is missing {len(missing)} weight(s): {shown}")

    def _expected_shards(self) -> set[tuple[str, ShardId]]:
        """Every (parameter name, shard id) a complete checkpoint must fill."""
        expected: set[tuple[str, ShardId]] = set()
        for name, param in self.named_parameters():
            module = self.get_submodule(name.rsplit(".", 1)[0])
            if hasattr(module, "expected_shards"):  # stacked experts: (expert, projection)
                expected.update((name, shard) for shard in module.expected_shards(param))
            elif isinstance(module, QKVLinear):
                expected.update((name, shard) for shard in ("q", "k", "v"))
            elif isinstance(module, MergedLinear):
                expected.update((name, index) for index in range(len(module.output_sizes)))
            else:
                expected.add((name, None))
        return expected


def to_param_name(checkpoint_name: str) -> tuple[str, str | int | None]:
    """(ladle parameter name, shard id) that checkpoint tensor `checkpoint_name` fills."""
    for fragment, merged_fragment, shard_id in _MERGED_WEIGHTS:
        if fragment in checkpoint_name:
            return checkpoint_name.replace(fragment, merged_fragment), shard_id
    return checkpoint_name, None


def to_checkpoint_name(param_name: str, shard_id: str | int | None) -> str:
    """The checkpoint tensor that fills shard `shard_id` of parameter `param_name`."""
    for fragment, merged_fragment, merged_shard in _MERGED_WEIGHTS:
        if merged_fragment in param_name and shard_id == merged_shard:
            return param_name.replace(merged_fragment, fragment)
    return param_name
