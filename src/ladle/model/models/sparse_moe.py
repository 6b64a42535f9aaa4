"""Mixture-of-experts decoders: Qwen3-MoE and Mixtral. Both are the Llama-family decoder
(llama.py: attention, norms, rotary, the residual stream) with a SparseMoeBlock
(layers/moe.py) in place of the MLP of their sparse layers; they differ only in which layers are
sparse (ModelArchConfig.is_sparse_layer), their router's renormalisation (norm_topk_prob) and
their checkpoint names:

    Qwen3-MoE  model.layers.N.mlp.gate.weight                 router [num_experts, hidden]
               model.layers.N.mlp.experts.E.gate_proj.weight  expert E's gate [intermediate, hidden]
               ...experts.E.up_proj.weight, ...experts.E.down_proj.weight
    Mixtral    model.layers.N.block_sparse_moe.gate.weight    router
               ...block_sparse_moe.experts.E.w1.weight (gate), w3 (up), w2 (down)

Both load into ladle's names model.layers.N.mlp.gate.weight and
model.layers.N.mlp.experts.{gate_up_proj, down_proj} (stacked), shard (E, "gate"/"up"/"down");
an fp8 checkpoint's expert scales (ladle's canonical ...experts.E.gate_proj.weight_scale, made
from weight_scale_inv by the checkpoint reader) into ...mlp.experts.{gate_up_scale, down_scale}
by the same shards (layers/moe_fp8.py).
"""

from __future__ import annotations

import re

from torch import nn

from ladle.attention.base import AttentionBackend
from ladle.distributed.pipeline import SINGLE_STAGE, PipelineStage
from ladle.distributed.tensor_parallel import SINGLE, TensorParallel
from ladle.model.arch_config import ModelArchConfig
from ladle.model.layers.moe import SparseMoeBlock
from ladle.model.load_errors import ModelLoadError
from ladle.model.models.llama import LlamaForCausalLM, LlamaMLP, ShardId


class SparseMoeForCausalLM(LlamaForCausalLM):
    """A Llama-family causal LM whose sparse layers hold a SparseMoeBlock. Subclasses name the
    checkpoint's MoE block (`checkpoint_block`) and expert projections (`checkpoint_projections`,
    checkpoint name -> "gate" / "up" / "down")."""

    checkpoint_block = "mlp"
    checkpoint_projections = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}

    def __init__(
        self,
        config: ModelArchConfig,
        attention_backend: AttentionBackend,
        tp: TensorParallel = SINGLE,
        stage: PipelineStage = SINGLE_STAGE,
    ) -> None:
        super().__init__(config, attention_backend, tp, stage)
        projections = "|".join(map(re.escape, self.checkpoint_projections))
        block = re.escape(self.checkpoint_block)
        self._expert_pattern = re.compile(
            rf"^(?P<layer>.+)\.{block}\.experts\.(?P<expert>\d+)\.(?P<projection>{projections})"
            r"\.(?P<tensor>weight|weight_scale)$"
        )
        self._router_pattern = re.compile(rf"^(?P<layer>.+)\.{block}\.gate\.weight$")
        self._projection_names = {v: k for k, v in self.checkpoint_projections.items()}

    @property
    def can_capture_cuda_graphs(self) -> bool:
        """True when every MoE layer runs the fused path (layers/moe.py,
        StackedExperts.can_run_fused: CUDA, fused kernels on, Triton installed): the torch path
        reads per-expert counts on the host, which a CUDA graph cannot capture, so then the
        Worker runs the model eagerly."""
        return all(
            module.experts.can_run_fused()
            for module in self.modules()
            if isinstance(module, SparseMoeBlock)
        )

    def build_mlp(self, layer_index: int) -> nn.Module:
        config = self.config
        if not config.is_sparse_layer(layer_index):
            return LlamaMLP(config.hidden_size, config.intermediate_size, self.tp)
        return SparseMoeBlock(
            config.hidden_size,
            config.num_experts,
            config.num_experts_per_token,
            config.moe_intermediate_size,
            config.norm_topk_prob,
            self.tp,
        )

    def holds(self, checkpoint_name: str) -> bool:
        """Besides the pipeline stage's parts: an expert-parallel rank loads (and reads) only
        its own experts."""
        if not super().holds(checkpoint_name):
            return False
        expert_match = self._expert_pattern.match(checkpoint_name)
        if expert_match is None or not (self.tp.size > 1 and self.tp.expert_parallel):
            return True
        expert = int(expert_match["expert"])
        if expert >= self.config.num_experts:
            return True  # to_param_name names the error
        return expert // (self.config.num_experts // self.tp.size) == self.tp.rank

    def to_param_name(self, checkpoint_name: str) -> tuple[str, ShardId]:
        expert_match = self._expert_pattern.match(checkpoint_name)
        if expert_match is not None:
            expert = int(expert_match["expert"])
            if expert >= self.config.num_experts:
                raise ModelLoadError(
                    f"checkpoint tensor {checkpoint_name!r} is for expert {expert}, but the "
                    f"config has num_experts={self.config.num_experts}"
                )
            projection = self.checkpoint_projections[expert_match["projection"]]
            stacked = "down" if projection == "down" else "gate_up"
            kind = "scale" if expert_match["tensor"] == "weight_scale" else "proj"
            return f"{expert_match['layer']}.mlp.experts.{stacked}_{kind}", (expert, projection)
        router_match = self._router_pattern.match(checkpoint_name)
        if router_match is not None:
            return f"{router_match['layer']}.mlp.gate.weight", None
        return super().to_param_name(checkpoint_name)

    def to_checkpoint_name(self, param_name: str, shard_id: ShardId) -> str:
        if isinstance(shard_id, tuple):
            layer = param_name.rsplit(".mlp.experts.", 1)[0]
            expert, projection = shard_id
            checkpoint_projection = self._projection_names[projection]
            tensor = "weight_scale" if param_name.endswith("_scale") else "weight"
            return (
                f"{layer}.{self.checkpoint_block}.experts.{expert}.{checkpoint_projection}.{tensor}"
            )
        if param_name.endswith(".mlp.gate.weight"):
            return param_name.replace(".mlp.", f".{self.checkpoint_block}.")
        return super().to_checkpoint_name(param_name, shard_id)


class Qwen3MoeForCausalLM(SparseMoeForCausalLM):
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with per-head q/k norms;
    sparse layers by decoder_sparse_step and mlp_only_layers, dense MLPs elsewhere; top-k
    renormalised when the config's norm_topk_prob says so."""


class MixtralForCausalLM(SparseMoeForCausalLM):
    """Mixtral (8x7B, 8x22B): Mistral's attention (no sliding window), every layer sparse, top-k
    always renormalised."""

    checkpoint_block = "block_sparse_moe"
    checkpoint_projections = {"w1": "gate", "w3": "up", "w2": "down"}
