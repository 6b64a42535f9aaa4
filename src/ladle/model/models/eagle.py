"""EAGLE-1 and EAGLE-3 draft heads: one Llama decoder layer over the target's hidden states,
in the checkpoint layout vLLM and SGLang load (read to learn it; written here from scratch).

Both heads take, at position i, the token x_{i+1} and a feature of the target at i, and predict
x_{i+2}; a chained draft step feeds the head's own output hidden state back as the feature.

- EAGLE-1: feature = the target's final hidden state (after its norm). fc(concat(embedding,
  feature)) -> a decoder layer without input norm -> hidden + residual, then the target's LM
  head (as vLLM: no final norm).
- EAGLE-3: feature = fc(concat of the target's three aux hidden states) on the first pass, the
  head's pre-norm output in chained steps. The layer attends over concat(input_layernorm(
  embedding), hidden_norm(feature)) (a 2h-wide qkv), then its own norm and LM head over a draft
  vocabulary, mapped to target ids by d2t (target id = draft id + d2t[draft id]).

Checkpoint keys: `fc.weight` (and `fc.bias` for some EAGLE-1 heads), the layer as
`midlayer.*` (EAGLE-3) or `layers.0.*` (EAGLE-1, optionally under `model.`), `norm.weight`,
`lm_head.weight`, `d2t`, `t2d` (unused), optional `embed_tokens.weight` (else the target's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ladle.attention.base import AttentionBackend
from ladle.attention.metadata import AttentionMetadata
from ladle.model.layers.norm import RMSNorm
from ladle.model.layers.rotary import RotaryEmbedding
from ladle.model.layers.weight_loading import default_weight_loader
from ladle.model.load_errors import ModelLoadError
from ladle.model.models.eagle_config import FIELD, EagleHeadConfig
from ladle.model.models.llama import LlamaAttention, LlamaMLP, to_param_name

# Token ids -> [n, hidden] embeddings; hidden [n, hidden] -> target-vocabulary logits.
EmbedFn = Callable[[torch.Tensor], torch.Tensor]
LogitsFn = Callable[[torch.Tensor], torch.Tensor]


class EagleHead(nn.Module):
    """One EAGLE head. forward() runs the decoder layer over a flattened batch (writing the
    head's own paged KV cache); draft_ids() turns its output rows into target token ids."""

    def __init__(self, config: EagleHeadConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        arch = config.arch
        hidden = arch.hidden_size
        self.is_eagle3 = config.method == "eagle3"
        fc_inputs = 3 * config.target_hidden_size if self.is_eagle3 else 2 * hidden
        self.fc = nn.Linear(fc_inputs, hidden, bias=False)
        self.fc_bias: nn.Parameter | None = None  # some EAGLE-1 heads carry one
        self.rotary_emb = RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling
        )
        self.self_attn = LlamaAttention(
            arch, self.rotary_emb, backend, input_size=2 * hidden if self.is_eagle3 else None
        )
        self.mlp = LlamaMLP(hidden, arch.intermediate_size)
        self.post_attention_layernorm = RMSNorm(hidden, arch.rms_norm_eps)
        if self.is_eagle3:
            self.input_layernorm = RMSNorm(hidden, arch.rms_norm_eps)
            self.hidden_norm = RMSNorm(hidden, arch.rms_norm_eps)
            self.norm = RMSNorm(hidden, arch.rms_norm_eps)
            self.register_buffer(
                "d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long), persistent=False
            )
        # Set by the loader when the checkpoint brings its own (else the target's are used).
        self.embed_weight: nn.Parameter | None = None
        self.lm_head_weight: nn.Parameter | None = None
        # The target's embedding and logits, set by the drafter (shared, not copied).
        self._target: tuple[EmbedFn, LogitsFn] | None = None

    def share_target(self, embed: EmbedFn, logits: LogitsFn) -> None:
        self._target = (embed, logits)

    def combine_features(self, features: torch.Tensor) -> torch.Tensor:
        """The first pass's feature from the target's: EAGLE-3 fuses its three layers with fc;
        EAGLE-1 takes the final hidden state as it is (its fc runs in forward)."""
        if not self.is_eagle3:
            return features
        return self.fc(features.to(self.fc.weight.dtype))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_weight is not None:
            return F.embedding(input_ids.long(), self.embed_weight)
        assert self._target is not None, "share_target first"
        return self._target[0](input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        features: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids[i], features[i]) at positions[i] -> (output for the logits, the feature
        a chained step feeds back), both [n, hidden]."""
        embeds = self.embed(input_ids).to(features.dtype)
        if self.is_eagle3:
            residual = features
            hidden = torch.cat([self.input_layernorm(embeds), self.hidden_norm(features)], -1)
        else:
            hidden = F.linear(torch.cat([embeds, features], -1), self.fc.weight, self.fc_bias)
            residual = hidden  # EAGLE-1's layer has no input norm
        hidden = self.self_attn(positions, hidden, kv_cache, attn_metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        hidden = self.mlp(hidden)
        if self.is_eagle3:
            normed, prenorm = self.norm(hidden, residual)
            return normed, prenorm
        summed = hidden + residual
        return summed, summed

    def draft_ids(self, output: torch.Tensor) -> torch.Tensor:
        """Greedy drafts: the argmax token (a target id) of each output row, int64 [n]."""
        if self.lm_head_weight is None:
            assert self._target is not None, "share_target first"
            return self._target[1](output).argmax(-1)
        draft = F.linear(output.to(self.lm_head_weight.dtype), self.lm_head_weight).argmax(-1)
        if self.is_eagle3:
            return draft + self.d2t[draft]
        return draft

    # ----- loading ------------------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill the head from checkpoint tensors (vLLM's names); names the tensor on error."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        hidden = self.config.arch.hidden_size
        for raw_name, tensor in weights:
            name = raw_name.removeprefix("model.")
            if name == "t2d":
                continue  # target -> draft ids: only training needs it
            if name == "d2t":
                if not self.is_eagle3 or tuple(tensor.shape) != tuple(self.d2t.shape):
                    raise ModelLoadError(
                        f"{FIELD}: tensor 'd2t' has shape {tuple(tensor.shape)}, expected "
                        f"({self.config.draft_vocab_size},)"
                    )
                self.d2t.copy_(tensor.long())
                loaded.add(name)
                continue
            if name == "fc.bias" and not self.is_eagle3:
                self.fc_bias = nn.Parameter(tensor.to(self.fc.weight), requires_grad=False)
                continue
            if name in ("embed_tokens.weight", "lm_head.weight"):
                rows = self.config.arch.vocab_size
                if name == "lm_head.weight" and self.is_eagle3:
                    rows = self.config.draft_vocab_size
                if tuple(tensor.shape) != (rows, hidden):
                    raise ModelLoadError(
                        f"{FIELD}: tensor {raw_name!r} has shape {tuple(tensor.shape)}, expected "
                        f"{(rows, hidden)}"
                    )
                weight = nn.Parameter(tensor.to(self.fc.weight), requires_grad=False)
                if name == "embed_tokens.weight":
                    self.embed_weight = weight
                else:
                    self.lm_head_weight = weight
                continue
            for prefix in ("midlayer.", "layers.0."):
                if name.startswith(prefix):
                    name = name[len(prefix):]
            if name == "input_layernorm.weight" and not self.is_eagle3:
                continue  # EAGLE-1's first layer runs without its input norm
            param_name, shard_id = to_param_name(name)
            param = params.get(param_name)
            if param is None:
                raise ModelLoadError(f"{FIELD}: unexpected tensor {raw_name!r} in the head")
            owner = self.get_submodule(param_name.rsplit(".", 1)[0])
            try:
                if shard_id is not None:
                    owner.weight_loader(param, tensor, shard_id)
                else:
                    default_weight_loader(param.data, tensor)
            except ModelLoadError as error:
                raise ModelLoadError(f"{FIELD}: tensor {raw_name!r}: {error}") from None
            loaded.add(f"{param_name}:{shard_id}")
        self._check_complete(loaded)

    def _check_complete(self, loaded: set[str]) -> None:
        expected = {"fc.weight:None", "post_attention_layernorm.weight:None",
                    "self_attn.o_proj.weight:None", "mlp.down_proj.weight:None"}
        expected |= {f"self_attn.qkv_proj.weight:{s}" for s in ("q", "k", "v")}
        expected |= {f"mlp.gate_up_proj.weight:{s}" for s in (0, 1)}
        if self.is_eagle3:
            expected |= {"input_layernorm.weight:None", "hidden_norm.weight:None",
                         "norm.weight:None"}
            if self.config.draft_vocab_size < self.config.arch.vocab_size:
                expected.add("d2t")
        missing = sorted(expected - loaded)
        if self.is_eagle3 and self.lm_head_weight is None and (
            self.config.draft_vocab_size != self.config.arch.vocab_size
        ):
            missing.append("lm_head.weight")
        if missing:
            raise ModelLoadError(f"{FIELD}: the head's checkpoint lacks {', '.join(missing)}")

    @torch.no_grad()
    def randomize_(self, seed: int) -> None:
        """Random weights (a benchmark head on dummy weights): small normal values, unit norms,
        its own LM head over the draft vocabulary, d2t spreading draft ids over the vocab."""
        generator = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                values = torch.randn(param.shape, generator=generator) * 0.02
                param.copy_(values.to(param.dtype))
        if self.is_eagle3:
            weight = torch.randn(
                (self.config.draft_vocab_size, self.config.arch.hidden_size), generator=generator
            )
            self.lm_head_weight = nn.Parameter(
                (weight * 0.02).to(self.fc.weight), requires_grad=False
            )
            vocab, draft = self.config.arch.vocab_size, self.config.draft_vocab_size
            stride = vocab // draft
            ids = torch.arange(draft, device=self.d2t.device)
            self.d2t.copy_(ids * stride - ids)
