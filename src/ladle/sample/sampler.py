"""The Sampler: logits in, one token per request out, as batched tensor ops on the device.

Order, per row: grammar bitmask (constrained rows only) -> min_tokens bans -> repetition /
frequency / presence penalties -> greedy rows take the argmax of the penalised logits ->
temperature -> min-p -> top-k -> top-p -> sample. Logprobs are those of the raw logits, before
any of it; on CUDA a batch whose requests ask for the sampled token's alone (`logprobs: 0`) gets
it from kernels/sampled_logprob.py, without a log-softmax over the whole vocabulary.

No Python loop over requests or the vocabulary and no host sync: what differs per request is a row
tensor, what the whole batch can skip is a host flag (SamplingFlags). Random rows draw with the
exponential race in log space (argmax of logits + Gumbel noise) from a counter-based stream, so a
request's token depends only on its logits, its seed and its step, never on the batch around it
(see rng.py for why there is no torch.Generator per request).

On CUDA the draw (temperature, noise, argmax) is one Triton pass (kernels/gumbel_sample.py) that
gives the same tokens bit for bit; top-k alone needs no vocabulary sort (truncation.py).
"""

from __future__ import annotations

import torch
from torch import nn

from ladle.kernels.dispatch import use_fused_kernels
from ladle.sample.logit_processing import apply_logit_edits_
from ladle.sample.logprobs import gather_logprobs
from ladle.sample.metadata import SamplingMetadata
from ladle.sample.output import SamplerOutput
from ladle.sample.penalties import apply_bans_, apply_penalties_
from ladle.sample.rejection import rejection_sample
from ladle.sample.rng import counter_gumbels
from ladle.sample.truncation import apply_min_p_, apply_top_k_top_p_
from ladle.sampling.params import GREEDY_TEMPERATURE
from ladle.structured.bitmask import apply_token_bitmask
from ladle.structured.manager import GrammarBitmask


class Sampler(nn.Module):
    """Sample one token per request from [num_reqs, vocab] logits (see the module docstring)."""

    def forward(
        self,
        logits: torch.Tensor,
        metadata: SamplingMetadata,
        grammar_bitmask: GrammarBitmask | None = None,
    ) -> SamplerOutput:
        flags = metadata.flags
        raw_logits = logits
        # The fused draw reads the logits without changing them: no copy when nothing else does.
        fused = use_fused_kernels(logits)
        num_logprobs = flags.max_num_logprobs
        # The sampled token's logprob alone (`logprobs: 0`) reads the raw logits after the draw
        # (kernels/sampled_logprob.py): no float32 copy and no full log-softmax for it.
        # (Not with a draft model's probabilities: that draw divides the logits in place.)
        sampled_logprob_only = fused and num_logprobs == 0 and metadata.draft_probs is None
        needs_log_softmax = num_logprobs is not None and not sampled_logprob_only
        only_reads = flags.all_greedy or (
            fused and flags.no_min_p and flags.no_top_k and flags.no_top_p
        )
        may_modify = (
            metadata.banned_token_ids is not None
            or metadata.logit_edits is not None
            or not flags.no_penalties
            or not only_reads
            or grammar_bitmask is not None
        )
        # The fused kernels read any float dtype and work in float32 (widening is exact), so 16-bit
        # logits that are only read need no float32 copy of the whole [num_reqs, vocab] (0.1 ms
        # at 256 rows of a 128k vocabulary on an H100).
        if may_modify or needs_log_softmax or not fused:
            logits = logits.to(torch.float32)
        raw_logprobs = None
        if needs_log_softmax:
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        if may_modify and logits is raw_logits:
            logits = logits.clone()  # every step below works in place; the caller's tensor stays
        if grammar_bitmask is not None:
            # After the logprobs (they report the model's own distribution), before anything
            # that chooses a token.
            apply_token_bitmask(logits, grammar_bitmask.bitmask, grammar_bitmask.row_indices)
        if metadata.banned_token_ids is not None:
            apply_bans_(logits, metadata.banned_token_ids)
        if metadata.logit_edits is not None:
            apply_logit_edits_(logits, metadata.logit_edits)
        if not flags.no_penalties:
            assert metadata.prompt_token_ids is not None and metadata.output_token_ids is not None
            penalize_ = apply_penalties_
            if use_fused_kernels(logits):
                # Imported here: a Triton kernel's file loads only once it runs (a CPU install has
                # no triton; tests/model/test_fused_kernel_dispatch.py).
                from ladle.kernels.penalties import apply_penalties_ as penalize_
            penalize_(
                logits,
                metadata.prompt_token_ids,
                metadata.output_token_ids,
                metadata.presence_penalty,
                metadata.frequency_penalty,
                metadata.repetition_penalty,
            )
        sampled = self._sample(logits, metadata)

        if num_logprobs is None:
            return SamplerOutput(sampled_token_ids=sampled)
        if sampled_logprob_only:
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py). raw_logits is unchanged: every
            # step above that works in place works on a copy.
            from ladle.kernels.sampled_logprob import sampled_logprob_and_rank

            token_ids, logprobs, ranks = sampled_logprob_and_rank(raw_logits, sampled)
        else:
            assert raw_logprobs is not None
            token_ids, logprobs, ranks = gather_logprobs(raw_logprobs, sampled, num_logprobs)
        return SamplerOutput(
            sampled_token_ids=sampled,
            logprob_token_ids=token_ids,
            logprobs=logprobs,
            sampled_ranks=ranks,
        )

    @staticmethod
    def _sample(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """Greedy rows: argmax of the penalised logits. Random rows: temperature, truncation, draw.
        Works on logits in place."""
        flags = metadata.flags
        if flags.all_greedy:
            return _argmax(logits)
        greedy_ids = None if flags.all_random else _argmax(logits)

        # float32 also where the fused draw reads 16-bit logits (a bf16 0.6 would be 0.6016).
        temperature = metadata.temperature.to(torch.float32)
        is_greedy = None
        if not flags.all_random:
            # Greedy rows divide by 1 instead of ~0: their draw is thrown away, but no inf may
            # appear. (With no greedy row this is the temperature itself: two launches saved.)
            is_greedy = temperature < GREEDY_TEMPERATURE
            temperature = torch.where(is_greedy, 1.0, temperature)
        may_truncate = not (flags.no_min_p and flags.no_top_k and flags.no_top_p)
        has_draft_probs = metadata.draft_probs is not None
        if use_fused_kernels(logits) and not may_truncate and not has_draft_probs:
            # One pass: divide, hash the counters, add the noise and take the argmax in registers.
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py).
            from ladle.kernels.gumbel_sample import gumbel_argmax

            random_ids = gumbel_argmax(logits, metadata.seed, metadata.step, temperature)
            if greedy_ids is None:
                return random_ids
            return torch.where(is_greedy, greedy_ids, random_ids)
        logits.div_(temperature[:, None])
        if not flags.no_min_p:
            apply_min_p_(logits, metadata.min_p)
        if not (flags.no_top_k and flags.no_top_p):
            apply_top_k_top_p_(
                logits,
                metadata.top_k,
                metadata.top_p,
                apply_top_k=not flags.no_top_k,
                apply_top_p=not flags.no_top_p,
                max_top_k=flags.max_top_k,
            )
        if has_draft_probs:
            # Drafts from a model: accept each with min(1, p/q), else draw from the residual.
            assert metadata.draft_token_ids is not None
            random_ids = rejection_sample(
                logits, metadata.draft_token_ids, metadata.seed, metadata.step,
                metadata.draft_probs,
            )
        elif use_fused_kernels(logits):
            # A point-mass draft (or none) needs nothing but the row's own race: the host
            # accepts the draft iff the race picked it (sample/rejection.py says why that is
            # exact rejection sampling).
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py).
            from ladle.kernels.gumbel_sample import gumbel_argmax

            random_ids = gumbel_argmax(logits, metadata.seed, metadata.step)
        else:
            gumbels = counter_gumbels(metadata.seed, metadata.step, logits.shape[-1])
            random_ids = logits.add_(gumbels).argmax(dim=-1)
        if greedy_ids is None:
            return random_ids
        return torch.where(is_greedy, greedy_ids, random_ids)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy token ids [num_reqs]; on CUDA the vocabulary split over programs (a few us where
    torch's one-block-per-row reduction took ~30 for a single row)."""
    if use_fused_kernels(logits):
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.gumbel_sample import greedy_argmax

        return greedy_argmax(logits)
    return logits.argmax(dim=-1)
