"""`ladle quantize --rotate`: an orthogonal rotation R folded into the residual stream before
calibration (QuaRot's and SpinQuant's R1), so GPTQ quantizes W R instead of W.

The model computes the same function: every vector on the residual stream becomes h R, so

    embedding rows          E -> E R
    q/k/v, gate/up inputs   W -> (W diag(norm weight)) R, the norm's weight set to 1
    o, down outputs         W -> R^T W
    LM head                 E -> (E diag(final norm weight)) R, the final norm's weight set to 1

RMSNorm with unit weight commutes with R (|h R| = |h|). The norm weights must move into the
next projections because an elementwise scale does not commute with R; for the same reason a
tied LM head has to become its own tensor (the embedding and the head differ by the final
norm's weight), so the written folder is untied. No run-time cost: the folder is a plain
checkpoint of the same architecture.

Why: the rotated weights' rows have their outliers spread over all inputs, which GPTQ's groups
of 128 quantize with less output error. On the default model (docs/quantization.md, "Quality")
int4 awq-gptq went from +12.1% to +9.5% perplexity (8k tokens; +10.5% with another seed).
Round to nearest gets worse (it has no compensation and the Q4_1 source's own grid is lost),
and fp8 far worse (+1.2% -> +5.7%), so the CLI offers it for calibrated int4 only.
"""

from __future__ import annotations

import torch
from torch import nn

from ladle.model.layers.embedding import LMHead


def random_orthogonal(size: int, seed: int) -> torch.Tensor:
    """A seeded Haar-random orthogonal matrix [size, size] in float64 (QR of a Gaussian, the
    signs fixed so the distribution is uniform)."""
    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(size, size, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    return q * torch.sign(torch.diagonal(r))[None, :]


@torch.no_grad()
def rotate_residual_stream_(model: nn.Module, seed: int = 0) -> None:
    """Fold a seeded random rotation into `model`'s residual stream in place (see the module
    docstring); a tied LM head becomes `model.lm_head`. The arithmetic runs in float64 and each
    weight is stored back in its own dtype and device."""
    decoder = model.model
    embedding = decoder.embed_tokens
    for layer in decoder.layers:
        if layer.self_attn.o_proj.bias is not None or layer.mlp.down_proj.bias is not None:
            raise ValueError("rotation does not handle a bias on o_proj or down_proj")
    if embedding.quantization is not None:
        raise ValueError("rotation needs the float embedding table (load the model unquantized)")
    device = embedding.weight.device
    rotation = random_orthogonal(embedding.hidden_size, seed).to(device)

    def store(parameter: torch.Tensor, value: torch.Tensor) -> None:
        parameter.copy_(value.to(parameter.dtype))

    table = embedding.weight.double()
    final_norm = decoder.norm.weight.double()
    head_source = table if model.lm_head is None else model.lm_head.weight.double()
    head_weight = (head_source * final_norm[None, :]) @ rotation
    if model.lm_head is None:
        head = LMHead(embedding.vocab_size, embedding.hidden_size)
        head.weight.data = head_weight.to(embedding.weight.dtype)
        model.lm_head = head.to(device)
    else:
        store(model.lm_head.weight, head_weight)
    store(embedding.weight, table @ rotation)
    decoder.norm.weight.fill_(1.0)
    for layer in decoder.layers:
        for norm, consumer in (
            (layer.input_layernorm, layer.self_attn.qkv_proj),
            (layer.post_attention_layernorm, layer.mlp.gate_up_proj),
        ):
            scaled = consumer.weight.double() * norm.weight.double()[None, :]
            store(consumer.weight, scaled @ rotation)
            norm.weight.fill_(1.0)
        for producer in (layer.self_attn.o_proj, layer.mlp.down_proj):
            store(producer.weight, rotation.t() @ producer.weight.double())


def rotated_float_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of a rotated model that is not a projection, by module name: the embedding,
    the (now untied) LM head and every norm, which a writer must take from the model instead of
    the source checkpoint."""
    decoder = model.model
    tensors = {
        "model.embed_tokens": decoder.embed_tokens.weight,
        "lm_head": model.lm_head.weight,
        "model.norm": decoder.norm.weight,
    }
    for index, layer in enumerate(decoder.layers):
        for name in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{index}.{name}"] = getattr(layer, name).weight
    return tensors
