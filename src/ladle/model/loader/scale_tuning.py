"""`ladle quantize --tune-steps N`: after int4 calibration (or fp8's rounding to nearest), the
scales and every norm's weight tuned end to end so that the quantized model's next-token
distributions on the calibration windows come closer to the float model's (EfficientQAT's
end-to-end step-size training, with the float model as the target instead of the text's tokens).

GPTQ fits each layer to its own inputs; the error that reaches the logits is what is left after
30 layers of such fits compound. Here the codes stay as calibration chose them, so the folder
keeps its format and its size: only the scales (int4: the float16 one of each group of 128
weights; fp8: each output channel's float32 one) and the norms (written as float anyway) move,
by Adam on the divergence between the two models' distributions, through the differentiable
forward of llama_autograd_forward.py. fp8's inputs are rounded per token in that forward as the
engine rounds them, so the scales learn to offset both roundings.

The float model's distributions are taken before calibration changes any weight and kept as
each token's TOP_K most likely tokens plus the mass of all others, so the target costs a few
bytes a token rather than a vocabulary's worth; the divergence is the exact KL between the two
distributions grouped that way (the top-k tokens each alone, the rest as one outcome)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ladle.kernels.per_token_rule import per_token_quant_reference
from ladle.model.layers.norm import RMSNorm
from ladle.model.layers.quant.fp8 import FP8_DTYPE
from ladle.model.layers.quant.int4 import unpack_int4_rows
from ladle.model.models.llama_autograd_forward import sequence_logits

TOP_K = 64
# Adam's, on log(scale) and on the norm weights, by the projections' format (measured on the
# default model, docs/quantization.md). fp8's error is far smaller than int4's: at int4's rate
# its divergence rose over the first steps (0.018 -> 0.03-0.07), at a tenth it fell.
LEARNING_RATES = {"int4": 3e-3, "fp8": 3e-4}
WINDOWS_PER_STEP = 4


@dataclass
class TokenTarget:
    """The float model's distribution over one window's next tokens, grouped: the TOP_K likeliest
    tokens' log-probabilities and ids [T, TOP_K] and the log of every other token's mass [T]."""

    log_probs: torch.Tensor
    token_ids: torch.Tensor
    rest: torch.Tensor


def _grouped(logits: torch.Tensor, token_ids: torch.Tensor | None = None):
    """(log-probabilities of `token_ids` (default: the TOP_K likeliest), their ids, log of the
    rest's mass) from float32 logits [T, V]."""
    log_probs = torch.log_softmax(logits, dim=-1)
    if token_ids is None:
        token_ids = log_probs.topk(TOP_K, dim=-1).indices
    others = log_probs.scatter(1, token_ids, float("-inf"))
    return log_probs.gather(1, token_ids), token_ids, torch.logsumexp(others, dim=-1)


@torch.no_grad()
def teacher_targets(model: nn.Module, windows: list[list[int]]) -> list[TokenTarget]:
    """The float `model`'s grouped distributions on every window (call before quantizing)."""
    device = next(model.parameters()).device
    targets = []
    for window in windows:
        logits = sequence_logits(model, torch.tensor(window, device=device))
        targets.append(TokenTarget(*_grouped(logits)))
    return targets


def grouped_divergence(logits: torch.Tensor, target: TokenTarget) -> torch.Tensor:
    """Mean over tokens of KL(target || softmax(logits)), both grouped as the target is."""
    log_probs, _, rest = _grouped(logits, target.token_ids)
    top = (target.log_probs.exp() * (target.log_probs - log_probs)).sum(-1)
    others = target.rest.exp() * (target.rest - rest)
    return (top + others).mean()


class _GroupScaledMatmul(torch.autograd.Function):
    """x @ W^T with W = levels * scale[:, column_groups], W built again in the backward instead
    of being saved: a layer holds its int8 levels, not a float copy of its weight."""

    @staticmethod
    def forward(ctx, x, levels, scale, column_groups):
        ctx.save_for_backward(x, levels, scale, column_groups)
        return x @ _weight(levels, scale, column_groups, x.dtype).t()

    @staticmethod
    def backward(ctx, grad_output):
        x, levels, scale, column_groups = ctx.saved_tensors
        grad_x = grad_output @ _weight(levels, scale, column_groups, x.dtype)
        grad_weight = grad_output.reshape(-1, levels.shape[0]).t() @ x.reshape(-1, levels.shape[1])
        grad_scale = torch.zeros_like(scale).index_add_(
            1, column_groups, grad_weight.float() * levels.float()
        )
        return grad_x, None, grad_scale, None


def _weight(levels, scale, column_groups, dtype):
    return levels.to(dtype) * scale[:, column_groups].to(dtype)


class _TunedLinear:
    """One quantized projection's levels (int4: codes - zero; fp8: the e4m3 codes), its column ->
    scale-group map, its calibrated scales [N, groups] and the log-offset Adam moves. fp8's input
    is rounded per token as the engine's W8A8 rounds it, the rounding passed straight through in
    the backward (the weights' rounding is fixed: the codes do not move)."""

    def __init__(self, levels, column_groups, scale, format_name: str):
        self.levels, self.column_groups = levels, column_groups
        self.scale = scale.float()
        self.offset = torch.zeros_like(self.scale, requires_grad=True)
        self.format_name = format_name

    @classmethod
    def int4(cls, canonical, input_size: int, group_size: int, device: torch.device):
        codes = unpack_int4_rows(canonical["weight_packed"].to(device), input_size)
        if "g_idx" in canonical:  # act-order: each input column names its group
            column_groups = canonical["g_idx"].to(device).long()
        else:
            column_groups = torch.arange(input_size, device=device) // group_size
        zero = canonical["weight_zero"].to(device).long()[:, column_groups]
        levels = (codes.long() - zero).to(torch.int8)
        return cls(levels, column_groups, canonical["weight_scale"].to(device), "int4")

    @classmethod
    def fp8(cls, canonical, device: torch.device):
        codes = canonical["weight"].to(device)
        column_groups = torch.zeros(codes.shape[1], dtype=torch.long, device=device)
        scale = canonical["weight_scale"].to(device).reshape(-1, 1)
        return cls(codes, column_groups, scale, "fp8")

    def tuned_scale(self) -> torch.Tensor:
        return self.scale * self.offset.exp()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.format_name == "fp8":
            x = _rounded_per_token(x)
        return _GroupScaledMatmul.apply(x, self.levels, self.tuned_scale(), self.column_groups)


def _rounded_per_token(x: torch.Tensor) -> torch.Tensor:
    """x with each token's row quantized to e4m3 and back by the engine's rule; the gradient
    passes as if unrounded (the straight-through estimator)."""
    flat = x.detach().reshape(-1, x.shape[-1])
    codes, scale = per_token_quant_reference(flat, FP8_DTYPE)
    rounded = (codes.float() * scale).to(x.dtype).reshape(x.shape)
    return x + (rounded - x).detach()


def tune_scales_(
    model: nn.Module,
    windows: list[list[int]],
    results: dict[str, dict[str, torch.Tensor]],
    targets: list[TokenTarget],
    steps: int,
    group_size: int | None,
    learning_rate: float | None = None,
    log: Callable[[str], None] | None = None,
) -> None:
    """Tune the int4 or fp8 entries of `results` (calibrate_linears' {module name: canonical
    tensors}) and the model's norms for `steps` Adam steps of WINDOWS_PER_STEP windows each, against
    `targets` (teacher_targets of the same windows). Updates each entry's weight_scale (in its
    dtype), adds every norm to `results` as {"float": weight} and puts the matching weights in
    the model, so the model computes what the written folder will. `learning_rate`: by default
    the projections' format's (LEARNING_RATES)."""
    device = next(model.parameters()).device
    linears = {}
    for name, canonical in results.items():
        if "weight_packed" in canonical:
            input_size = model.get_submodule(name).input_size
            linears[name] = _TunedLinear.int4(canonical, input_size, group_size, device)
        elif "weight" in canonical:
            linears[name] = _TunedLinear.fp8(canonical, device)
    norms = {
        name: module.weight.detach().float().clone().requires_grad_(True)
        for name, module in model.named_modules()
        if isinstance(module, RMSNorm)
    }
    if not linears:
        raise ValueError("--tune-steps: no quantized projection to tune (every layer left float)")
    if learning_rate is None:  # calibration quantizes every projection to one format
        learning_rate = LEARNING_RATES[next(iter(linears.values())).format_name]
    optimizer = torch.optim.Adam(
        [linear.offset for linear in linears.values()] + list(norms.values()), lr=learning_rate
    )
    # Cosine decay to zero: at a constant rate the held-out perplexity swung by +-3 points from
    # one step to the next (docs/quantization.md), so where the tuning stops decided the result.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(0)
    order: list[int] = []
    started = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(WINDOWS_PER_STEP):
            if not order:
                order = torch.randperm(len(windows), generator=generator).tolist()
            index = order.pop()
            overrides = {name: norm.to(dtype) for name, norm in norms.items()} | linears
            logits = sequence_logits(model, torch.tensor(windows[index], device=device), overrides)
            loss = grouped_divergence(logits, targets[index]) / WINDOWS_PER_STEP
            loss.backward()
            total += loss.item()
        optimizer.step()
        schedule.step()
        if log is not None:
            log(
                f"tuning step {step + 1}/{steps}: divergence {total:.4f} "
                f"({time.perf_counter() - started:.0f} s)"
            )
    _install_(model, results, linears, norms)


@torch.no_grad()
def _install_(model, results, linears, norms) -> None:
    for name, linear in linears.items():
        canonical = results[name]
        scale = linear.tuned_scale().to(canonical["weight_scale"].dtype)
        canonical["weight_scale"] = scale.reshape(canonical["weight_scale"].shape).cpu()
        # The float32 weight the written codes, zeros and stored scales stand for.
        weight = _weight(linear.levels, scale, linear.column_groups, torch.float32)
        module = model.get_submodule(name)
        module.weight.data.copy_(weight.to(module.weight.dtype))
    for name, norm in norms.items():
        module = model.get_submodule(name)
        module.weight.data.copy_(norm.to(module.weight.dtype))
        results[name] = {"float": module.weight.data.cpu().clone()}
