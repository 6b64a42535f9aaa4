"""The model runner: one StepPlan -> device tensors -> model -> sampler -> accepted token ids.

Per-step work only (the Worker, worker.py, loads the model, plans memory, allocates the KV cache
and captures graphs once). Per step: one host-to-device copy of the packed step metadata
(step_inputs.py), one forward over the flattened batch, logits only for the rows that sample,
and one device-to-host copy of the sampled ids.

execute() only launches the step: it returns a LaunchedStep whose result() waits for the sampled
ids, so the engine can schedule and launch the next step first (overlapped scheduling). Each
request holds a slot of the persistent batch while it lives; the sampled ids are also written to
their slots on the device, where the next step reads a decode row's input id before the host has
seen it. What the runner knows of a request it keeps itself (request_states.py), from the plans.

A request that verifies k draft tokens samples k + 1 rows (one after its last known token and one
after each draft); result() accepts the drafts while each equals the token sampled before it and
ends with the first token sampled after the accepted ones: for drafts without a distribution
(n-gram, suffix) that is exact rejection sampling (sample/rejection.py says why). Every row
samples exactly as a one-token step at that output index would (same random stream counter, same
penalties, grammar mask and bad_words over the tokens before it), so a step with drafts gives the
tokens one-token steps give.

execute() is launch_forward() then sample(): the engine calls the two apart when a row's sampling
needs the previous step's tokens on the host (a grammar, bad_words), so that step is read while
the device runs this one's forward pass. Penalty rows need no host tokens: their token ids live on
the device (penalty_history.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from ladle.distributed.pipeline import SINGLE_STAGE, PipelineStage
from ladle.protocol.step import KV_PULL, KVTransferStats, StepPlan, StepResult
from ladle.sample.logprobs import logprobs_to_messages, pack_logprobs, unpack_logprobs
from ladle.sample.metadata import SamplingFlags, build_sampling_metadata
from ladle.sample.output import SamplerOutput
from ladle.sample.rejection import emitted_tokens, synthetic_emitted_tokens
from ladle.sample.sampler import Sampler
from ladle.sampling.params import SamplingParams
from ladle.structured.manager import PendingGrammarBitmask
from ladle.worker.cuda_graphs import DecodeGraphs
from ladle.worker.drafter import DraftBatch, ModelDrafter, TargetOutputs
from ladle.worker.drafts_on_device import DeviceDrafts, Verdict
from ladle.worker.forward_step import ForwardStep
from ladle.worker.kv_copier import KVCopier, KVReport
from ladle.worker.kv_peers import PeerPools
from ladle.worker.last_emitted import write_last_tokens
from ladle.worker.penalty_history import PenaltyHistory
from ladle.worker.persistent_batch import PersistentBatch
from ladle.worker.prompt_logprobs import compute_prompt_logprobs
from ladle.worker.request_states import RequestStates
from ladle.worker.shared_samples import DraftedRows, SharedSample, SharedSamples
from ladle.worker.step_events import record_event
from ladle.worker.step_inputs import StepInputBuilder

# Decode batches above this run eagerly: past it, one step's kernels outlast their launches.
MAX_GRAPH_BATCH_SIZE = 512


@dataclass
class LaunchedStep:
    """A step queued on the device: its sampled ids (and logprobs) are being copied to pinned
    host memory; result() waits for that copy alone, then accepts each request's tokens and
    records them in the runner's request states."""

    plan: StepPlan
    sampling_rows: list[tuple[int, int]]  # (position in the plan, drafts before the row)
    sampled_host: torch.Tensor | None  # [num_rows] int64; None when no request sampled
    logprobs_host: SamplerOutput | None  # host copies, when some request asked for logprobs
    num_logprobs_per_row: list[int | None]
    copied: torch.cuda.Event | None  # None on the CPU (the tensors are final already)
    states: RequestStates
    prompt_logprobs: dict | None = None
    kv_report: KVReport | None = None
    # Benchmarks only: accept each draft with this probability instead of checking it, by
    # the runner's coin.
    synthetic_acceptance: float | None = None
    synthetic_coin: random.Random | None = None
    # The next step's model drafts, being computed (worker/drafter.py); None without.
    draft_batch: DraftBatch | None = None
    # A pipeline stage before the last: the ids the last stage samples, still on their way.
    shared: SharedSample | None = None
    # Drafts on the device (drafts_on_device.py): the verdict, and its accept counts' copy.
    verdict: Verdict | None = None
    accepted_host: torch.Tensor | None = None
    _result: StepResult | None = None

    def is_ready(self) -> bool:
        """Whether result() would not wait for the device (or for the last stage)."""
        if self.shared is not None and not self.shared.is_ready():
            return False
        return self.copied is None or self.copied.query()

    def result(self) -> StepResult:
        if self._result is None:
            self._result = self._read()
        return self._result

    def _read(self) -> StepResult:
        plan = self.plan
        token_ids: list[list[int]] = [[] for _ in plan.scheduled]
        result = StepResult(
            request_ids=plan.request_ids(),
            token_ids=token_ids,
            prompt_logprobs=self.prompt_logprobs,
        )
        if self.kv_report is not None:
            self.kv_report.fill(result)
        if self.shared is not None:
            self.sampled_host = self.shared.host()
        if self.sampled_host is None:
            return result
        if self.copied is not None:
            self.copied.synchronize()
        if self.draft_batch is not None:
            result.draft_token_ids, result.drafting_seconds = self.draft_batch.read()
        sampled = self.sampled_host.tolist()
        drafts = [scheduled.draft_token_ids for scheduled in plan.scheduled]
        if self.verdict is not None:
            accepted = [] if self.accepted_host is None else self.accepted_host.tolist()
            emitted = self.verdict.emitted(len(plan.scheduled), sampled, accepted)
        elif self.synthetic_acceptance is None:
            emitted = emitted_tokens(sampled, self.sampling_rows, drafts)
        else:
            assert self.synthetic_coin is not None
            emitted = synthetic_emitted_tokens(
                sampled, self.sampling_rows, drafts, self.synthetic_acceptance,
                self.synthetic_coin,
            )  # fmt: skip
        result.token_ids = token_ids = emitted
        if self.logprobs_host is not None:
            row_logprobs = logprobs_to_messages(self.logprobs_host, self.num_logprobs_per_row)
            result.logprobs = [None] * len(plan.scheduled)
            for row, (position, offset) in enumerate(self.sampling_rows):
                if offset >= len(emitted[position]) or row_logprobs[row] is None:
                    continue
                entries = result.logprobs[position]
                if entries is None:
                    entries = result.logprobs[position] = []
                entries.append(row_logprobs[row])
        for scheduled, accepted in zip(plan.scheduled, token_ids):
            if accepted:
                self.states.append_tokens(scheduled.request_id, accepted)
        return result


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A non-blocking copy into pinned host memory (the tensor itself on the CPU)."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _logprobs_to_host(output: SamplerOutput, sampled_host: torch.Tensor) -> SamplerOutput:
    """The step's logprob tensors on the host: one packed copy where they need one (three
    copies cost a GPU step at batch 1 two more launches and pinned buffers); the CPU's are
    final already."""
    assert output.logprobs is not None
    if output.logprobs.device.type == "cpu":
        return replace(output, sampled_token_ids=sampled_host)
    packed = _to_host(pack_logprobs(output))
    return unpack_logprobs(packed, sampled_host, output.logprobs.shape[1])


class ModelRunner:
    """Runs steps over a loaded model and its KV cache (both owned by the Worker)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        block_size: int,
        max_blocks_per_seq: int,
        initial_slots: int,
        stage: PipelineStage = SINGLE_STAGE,
        activation_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model
        self.device = device
        # A pipeline stage before the last hands its hidden states (in activation_dtype) on and
        # samples nothing: it takes the last stage's sampled ids (PipelineStage.share_sampled),
        # applied to its device copies when a later step needs them (shared_samples.py).
        self.stage = stage
        self.shared_samples = SharedSamples(device)
        self.activation_dtype = activation_dtype
        self.block_size = block_size
        self.sampler = Sampler()
        self.input_builder = StepInputBuilder(device, block_size)
        self.states = RequestStates()
        self.batch = PersistentBatch(
            max_blocks_per_seq=max_blocks_per_seq, device=device, initial_slots=initial_slots
        )
        # Steps replayed from a CUDA graph and steps run eagerly (/metrics): an eager step of a
        # small model costs the host tens of ms of launches while every stream waits.
        self.num_graph_steps = 0
        self.num_eager_steps = 0
        # Penalty requests' token ids on the device, made at the first step that samples.
        self.penalty_history: PenaltyHistory | None = None
        self.kv_caches: list[torch.Tensor] = []  # set by the Worker once the pool is sized
        # The graphs' buckets (CUDA only), set by the Worker; captured unless eager.
        self.graph_buckets: DecodeGraphs | None = None
        # Copies to and from the KV cache's host tier, set by the Worker when it has one.
        self.kv_copier: KVCopier | None = None
        # Pulls from producer instances (disaggregation); None unless this is a consumer.
        self.kv_peers: PeerPools | None = None
        # Benchmarks of speculative decoding on random weights: each draft is accepted with
        # this probability, whatever the model says (the outputs are then not the model's).
        self.synthetic_acceptance: float | None = None
        self.synthetic_coin = random.Random(0)
        # The draft network (draft model, EAGLE head), set by the Worker; None: drafts are
        # model-free (proposed on the host) or speculation is off.
        self.drafter: ModelDrafter | None = None
        # Drafted steps planned in flight (drafts_on_device.py), set by the Worker; None: off.
        self.device_drafts: DeviceDrafts | None = None
        # The last step's sampling rows' params and their flags (_sampling_flags).
        self._last_sampling_flags: tuple[list[SamplingParams], SamplingFlags] = (
            [],
            SamplingFlags.from_params([]),
        )

    @property
    def _appends_aux_hidden(self) -> bool:
        inner = getattr(self.model, "model", None)
        return bool(getattr(inner, "aux_hidden_layers", ()))

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The captured graphs; None in eager mode, on the CPU and before the capture."""
        buckets = self.graph_buckets
        return buckets if buckets is not None and buckets.captured else None

    def forget(self, request_ids: list[str]) -> None:
        """Drop what the runner keeps of requests that ended or were preempted: their state,
        persistent-batch slots and penalty rows (unknown ids are ignored)."""
        if not request_ids:
            return
        self.states.forget(request_ids)
        self.batch.release(request_ids)
        if self.penalty_history is not None:
            self.penalty_history.release(request_ids)

    def _take_plan(self, plan: StepPlan) -> None:
        """The plan's bookkeeping: forget ended and preempted requests, take new ones."""
        self.forget(plan.finished_request_ids)
        self.forget(plan.preempted_request_ids)
        self.states.add(plan.new_requests)

    # ----- the step ------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(
        self, plan: StepPlan, grammar_bitmask: PendingGrammarBitmask | None = None
    ) -> LaunchedStep:
        """Launch the step; the LaunchedStep's result() gives the accepted tokens.

        grammar_bitmask: the masks of the step's grammar rows being filled on another thread
        (started just before this call, so on the CPU it overlaps the forward pass computed in
        this thread), waited for once the logits and the sampling metadata exist."""
        # The undecorated halves: each inference_mode entry costs the host a few us a step.
        forward = self._launch_forward(plan)
        return self._sample(forward, grammar_bitmask)

    @torch.inference_mode()
    def launch_forward(self, plan: StepPlan) -> ForwardStep:
        """The first half of execute: inputs, forward pass and logits, queued on the device."""
        return self._launch_forward(plan)

    def _launch_forward(self, plan: StepPlan) -> ForwardStep:
        kv_report = self._run_kv_operations(plan)
        self._take_plan(plan)
        if not plan.scheduled:
            return ForwardStep(plan, [], [], None, None, None, None, None, kv_report)
        if not self.stage.is_last:  # earlier steps' ids this plan reads from the device
            self.shared_samples.apply_before(plan.request_ids(), self.batch.last_sampled)
        states = self.states
        scheduled = plan.scheduled
        sampling_rows = plan.sampling_rows()
        row_output_index = [
            scheduled[position].output_index + offset for position, offset in sampling_rows
        ]
        graphs = self.graphs
        device_drafts = self.device_drafts
        draft_shape = extra_parts = None
        graph_words = graphs
        if device_drafts is not None:
            draft_shape = device_drafts.shape(plan, sampling_rows)
            extra_parts = device_drafts.extra_parts(draft_shape)
            if draft_shape.any_shifted:
                # Its inputs are moved on the device: a graph replay copies them from there,
                # not from words the host wrote into the graph's buffers.
                graph_words = None
        inputs = self.input_builder.build(
            plan, states, sampling_rows, row_output_index, self.batch, graph_words, extra_parts
        )
        input_ids = inputs.input_ids
        if inputs.token_slots is not None:
            # Decode rows whose last token the previous step sampled: read it on the device.
            # These ids are int64 (last_sampled's); a graph's int32 buffer converts on its copy.
            # index_select, not indexing: the same gather with less host work per launch.
            from_device = torch.index_select(self.batch.last_sampled, 0, inputs.token_slots)
            if inputs.reads_only_device_ids:
                input_ids = from_device
            else:
                input_ids = torch.where(input_ids < 0, from_device, input_ids)
        if device_drafts is not None:
            assert draft_shape is not None
            input_ids = device_drafts.prepare(
                plan, draft_shape, inputs, input_ids, self.batch, states
            )
        attn_metadata = inputs.attn_metadata
        if graphs is not None and graphs.can_run(
            attn_metadata.num_reqs,
            input_ids.shape[0],
            attn_metadata.max_query_len,
            attn_metadata.block_tables.shape[1],
        ):
            self.num_graph_steps += 1
            if not self.stage.is_first:
                self.stage.receive_forward_into(graphs.stage_input_buffers(attn_metadata.num_reqs))
            output = graphs.run(
                input_ids, inputs.positions, attn_metadata, inputs.graph_inputs_written
            )
            # A graph's outputs are overwritten by its next replay, which a send still in
            # flight may not see: the next stage gets copies.
            hidden = self._hand_on(output, owned=False)
        else:
            self.num_eager_steps += 1
            if self.graph_buckets is not None:
                attn_metadata = self.graph_buckets.eager_metadata(attn_metadata, input_ids.shape[0])
            hidden = self._run_stage(input_ids.to(torch.int32), inputs.positions, attn_metadata)
        target_outputs = None
        features = None
        if hidden is not None and self.stage.is_last and self._appends_aux_hidden:
            # The forward appended the EAGLE-3 layers' inputs to the final hidden states (also
            # while a benchmark's baseline runs set the drafter aside).
            width = self.model.config.hidden_size
            hidden, features = hidden[:, :width], hidden[:, width:]
        if self.drafter is not None and hidden is not None:
            target_outputs = TargetOutputs(input_ids, hidden, features)
        prompt_logprobs = None
        # Only a step with prompt tokens can owe prompt logprobs: decode-only steps skip the scan.
        if hidden is not None and plan.num_prefill_tokens and any(
            states[s.request_id].sampling_params.prompt_logprobs is not None for s in scheduled
        ):
            # Rare, and read on the host at once: such steps give up their overlap.
            prompt_logprobs = compute_prompt_logprobs(
                self.model.compute_logits, hidden, plan, states
            )
        logits = None
        penalty_rows = None
        flags = None
        row_states = [states[scheduled[position].request_id] for position, _ in sampling_rows]
        if sampling_rows and hidden is not None:
            if len(sampling_rows) < hidden.shape[0]:
                hidden = torch.index_select(hidden, 0, inputs.logits_indices)
            # else every row samples its one token: the rows are hidden's own, in order.
            # In the model's dtype: the sampler widens to float32 only where it must.
            logits = self.model.compute_logits(hidden, float32=False)
            flags = self._sampling_flags([state.sampling_params for state in row_states])
            if not flags.no_penalties:
                # Rows taken now, while every request of the step is live (see ForwardStep).
                history = self._penalty_history(logits.shape[-1])
                penalty_rows = history.rows_for(row_states, row_output_index)
                for position, offset in sampling_rows:
                    request = scheduled[position]
                    if offset == 0 and request.draft_token_ids:
                        history.write_drafts(
                            request.request_id, request.output_index, request.draft_token_ids
                        )
        return ForwardStep(
            plan=plan,
            sampling_rows=sampling_rows,
            row_output_index=row_output_index,
            inputs=inputs,
            logits=logits,
            prompt_logprobs=prompt_logprobs,
            penalty_rows=penalty_rows,
            sampling_flags=flags,
            kv_report=kv_report,
            target_outputs=target_outputs,
            input_ids=input_ids,
            draft_shape=draft_shape,
        )

    def _run_stage(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata
    ) -> torch.Tensor | None:
        """The forward pass of this rank's layers, eager: the final hidden states, or None on a
        pipeline stage before the last, which hands (hidden states, residual) to the next."""
        stage = self.stage
        intermediate = None
        if not stage.is_first:
            shape = (input_ids.shape[0], self.model.config.hidden_size)
            intermediate = tuple(
                stage.receive_forward([shape, shape], self.activation_dtype, self.device)
            )
        output = self.model(input_ids, positions, self.kv_caches, attn_metadata, intermediate)
        return self._hand_on(output, owned=True)

    def _hand_on(self, output, owned: bool) -> torch.Tensor | None:
        """The last stage's final hidden states; a stage before the last sends its (hidden
        states, residual) on to the next and returns None. owned: the tensors are this step's
        alone (else copies are sent)."""
        if self.stage.is_last:
            return output
        self.stage.send_forward([part if owned else part.clone() for part in output])
        return None

    def _run_kv_operations(self, plan: StepPlan) -> KVReport | None:
        """Issue the plan's copies to and from the host tier, after making this step's forward
        wait (on the device) for the copies earlier steps issued (kv_copier.py); then its
        pulls from producer instances (worker/kv_peers.py), on the compute stream, so
        this step's forward reads them."""
        if not plan.kv_operations and (self.kv_copier is None or self.kv_copier.is_idle):
            return None  # most steps: nothing to copy, wait for or report
        pulls = [op for op in plan.kv_operations if op.kind == KV_PULL]
        copies = [op for op in plan.kv_operations if op.kind != KV_PULL]
        copier = self.kv_copier
        if copier is None:
            # A plan that copies with no host tier here: each copy fails, nothing else does.
            report = KVReport(failed={op.op_id: "this worker has no host KV tier" for op in copies})
        else:
            copier.wait_for_earlier_copies()
            done, failed = copier.run(copies, self.kv_caches)
            report = KVReport(done, failed, copier.take_stats())
        if pulls:
            if self.kv_peers is None:
                report.failed.update({op.op_id: "this worker is no KV consumer" for op in pulls})
            else:
                done, failed = self.kv_peers.run(pulls, self.kv_caches)
                report.done += done
                report.failed.update(failed)
                num_pulls, num_bytes, seconds = self.kv_peers.take_stats()
                stats = report.stats if report.stats is not None else KVTransferStats()
                stats.num_pulls += num_pulls
                stats.bytes_pulled += num_bytes
                stats.pull_seconds += seconds
                report.stats = stats
        return report

    def _sampling_flags(self, params: list[SamplingParams]) -> SamplingFlags:
        """The sampling rows' flags. A decode batch samples the same requests step after step,
        so the last step's flags are reused while the rows' params are the same objects (or
        equal ones): SamplingParams do not change once a request runs (its sampling row in
        the persistent batch is written once, too)."""
        last_params, last_flags = self._last_sampling_flags
        if params != last_params:
            last_flags = SamplingFlags.from_params(params)
            self._last_sampling_flags = (params, last_flags)
        return last_flags

    def _penalty_history(self, vocab_size: int) -> PenaltyHistory:
        if self.penalty_history is None:
            self.penalty_history = PenaltyHistory(vocab_size, self.device)
        return self.penalty_history

    @torch.inference_mode()
    def sample(
        self, forward: ForwardStep, grammar_bitmask: PendingGrammarBitmask | None = None
    ) -> LaunchedStep:
        """The second half of execute: sample the launched forward's logits and start the copy
        of the sampled ids. grammar_bitmask: the step's grammar masks, waited for here."""
        return self._sample(forward, grammar_bitmask)

    def _sample(
        self, forward: ForwardStep, grammar_bitmask: PendingGrammarBitmask | None = None
    ) -> LaunchedStep:
        plan = forward.plan
        scheduled = plan.scheduled
        states = self.states
        row_states = [states[scheduled[p].request_id] for p, _ in forward.sampling_rows]
        num_logprobs = [state.sampling_params.logprobs for state in row_states]
        if forward.logits is None:
            if forward.sampling_rows and not self.stage.is_last:
                return self._take_shared_sample(forward, num_logprobs)
            self._draft(forward, None)  # prompt chunks: the draft network's KV for them
            return LaunchedStep(
                plan,
                [],
                None,
                None,
                num_logprobs,
                None,
                states,
                forward.prompt_logprobs,
                forward.kv_report,
            )
        logits = forward.logits
        penalty_rows = forward.penalty_rows
        penalty_token_ids = None
        if penalty_rows is not None:
            assert self.penalty_history is not None
            penalty_token_ids = self.penalty_history.token_ids(penalty_rows)
        # bad_words reads the host's output ids: with overlap on, a step with such rows is
        # sampled only once the step before is read (engine/split_launch.py). A row after j
        # drafts sees them as outputs. Nothing else reads them (penalties read the device's
        # copy): a row after drafts would copy its request's whole output for nothing.
        flags = forward.sampling_flags
        output_token_ids = None
        if (
            flags is None
            or not flags.no_logit_edits
            or (not flags.no_penalties and penalty_token_ids is None)
        ):
            output_token_ids = [
                state.output_token_ids + scheduled[p].draft_token_ids[:offset]
                if offset
                else state.output_token_ids
                for state, (p, offset) in zip(row_states, forward.sampling_rows)
            ]
        metadata = build_sampling_metadata(
            [state.sampling_params for state in row_states],
            [state.sampling_seed for state in row_states],
            forward.row_output_index,
            vocab_size=logits.shape[-1],
            output_token_ids=output_token_ids,
            eos_token_ids=[state.eos_token_ids for state in row_states],
            device=self.device,
            rows=forward.inputs.sampling_rows,
            penalty_token_ids=penalty_token_ids,
            flags=flags,
        )
        masks = grammar_bitmask.wait() if grammar_bitmask is not None else None
        sampler_output = self.sampler(logits, metadata, masks)
        sampled = sampler_output.sampled_token_ids
        if penalty_rows is not None:
            assert self.penalty_history is not None
            self.penalty_history.record(penalty_rows, sampled)
        if self.stage.shares_sampled:
            # To the earlier pipeline stages; a copy of its own: the broadcast may still be
            # sending it when this buffer is reused.
            self.stage.share_sampled(sampled.clone())
        verdict = accepted_host = None
        if self.device_drafts is not None:
            assert forward.draft_shape is not None
            verdict = self.device_drafts.judge(
                plan,
                forward.draft_shape,
                forward.inputs,
                forward.input_ids,
                sampled,
                self.batch.last_sampled,
            )
            sampled = verdict.row_tokens
        else:
            write_last_tokens(
                self.batch.last_sampled, sampled, forward.inputs.sampling_slots,
                forward.sampling_rows, [scheduled.draft_token_ids for scheduled in plan.scheduled],
            )
        draft_batch = self._draft(forward, sampled)
        # The one device-to-host copy of the step (plus logprobs, only when some row asked):
        # a verdict's accept counts ride with the tokens.
        if verdict is not None and verdict.words is not None:
            words_host = _to_host(verdict.words)
            num_rows = sampled.shape[0]
            sampled_host, accepted_host = words_host[:num_rows], words_host[num_rows:]
        else:
            sampled_host = _to_host(sampled)
        if draft_batch is not None:
            draft_batch.drafts = _to_host(draft_batch.drafts)
        logprobs_host = None
        if metadata.flags.max_num_logprobs is not None:
            logprobs_host = _logprobs_to_host(sampler_output, sampled_host)
        copied = None
        if self.device.type == "cuda":
            copied = torch.cuda.Event()
            record_event(copied, self.device)
        return LaunchedStep(
            plan,
            forward.sampling_rows,
            sampled_host,
            logprobs_host,
            num_logprobs,
            copied,
            states,
            forward.prompt_logprobs,
            forward.kv_report,
            synthetic_acceptance=self.synthetic_acceptance,
            synthetic_coin=self.synthetic_coin,
            draft_batch=draft_batch,
            verdict=verdict,
            accepted_host=accepted_host,
        )

    def _draft(self, forward: ForwardStep, sampled: torch.Tensor | None) -> DraftBatch | None:
        """The draft network's pass over the step and the next step's drafts (drafter.py)."""
        if self.drafter is None or forward.target_outputs is None or forward.inputs is None:
            return None
        return self.drafter.propose(
            forward.plan,
            forward.inputs,
            forward.target_outputs,
            sampled,
            forward.sampling_rows,
            self.states,
        )

    def _take_shared_sample(self, forward: ForwardStep, num_logprobs: list) -> LaunchedStep:
        """A pipeline stage before the last: the last stage's sampled ids for this step's rows,
        kept as if sampled here once they arrive (the first stage's later decode rows read them
        on the device). Nothing waits for them now: the next step may launch first."""
        plan = forward.plan
        buffer = torch.empty(len(forward.sampling_rows), dtype=torch.int64, device=self.device)
        drafts = [scheduled.draft_token_ids for scheduled in plan.scheduled]
        # Host drafts only: ids drafted on the device (-1 here) are not known to this stage.
        drafted = (
            DraftedRows(forward.sampling_rows, drafts)
            if any(drafts) and not any(-1 in ids for ids in drafts)
            and self.synthetic_acceptance is None
            else None
        )
        shared = self.shared_samples.add(
            frozenset(plan.scheduled[p].request_id for p, _ in forward.sampling_rows),
            self.stage.share_sampled(buffer),
            buffer,
            forward.inputs.sampling_slots,
            drafted,
        )
        return LaunchedStep(
            plan,
            forward.sampling_rows,
            None,
            None,
            num_logprobs,
            None,
            self.states,
            forward.prompt_logprobs,
            forward.kv_report,
            synthetic_acceptance=self.synthetic_acceptance,
            synthetic_coin=self.synthetic_coin,
            shared=shared,
        )
