"""AsyncEngineClient: the API process's handle on the engine-core process.

It starts the engine core in a process of its own (multiprocessing spawn), talks to it over two
ZMQ sockets with the typed messages of wire.py, and owns the OutputProcessor, so tokenization's
other half (detokenization, stop strings, n > 1 fan-in) runs here and never in the engine loop.

    API process                                   engine-core process
    add_request() --AddRequests/AbortRequests-->  EngineCoreLoop: inputs, step(), outputs
    _read_outputs() <--EngineStep (+ stats)-----

Each request gets a RequestStream: an async iterator of RequestOutputs whose *_delta fields
hold what arrived since the previous item (several steps are merged when the reader falls
behind, so a slow client costs one item, not one per step). Closing an unfinished stream aborts
the request in the engine. If the engine process dies, every open stream raises EngineDeadError
at once and so does every add_request until a new engine is ready: nothing waits forever. The
dead process is reaped, and a new one is started under the RestartPolicy (restart_policy.py);
once the policy is spent, on_fatal is called (the server then exits non-zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import zmq
import zmq.asyncio

from ladle.config import EngineConfig
from ladle.engine.core_process import run_engine_core
from ladle.engine.gc_policy import freeze_startup_objects
from ladle.frontend.admission import AdmissionController
from ladle.frontend.metrics import ServerMetrics
from ladle.frontend.output_processor import OutputProcessor
from ladle.frontend.restart_policy import RestartBudget, RestartPolicy
from ladle.frontend.tokenizer_preload import TokenizerPreload
from ladle.frontend.tokenizer_required import no_tokenizer_reason
from ladle.kv_transfer.shm import remove_exported_pools
from ladle.model.tokenizer import TextTokenizer
from ladle.outputs import RequestOutput
from ladle.protocol import wire
from ladle.protocol.messages import RequestRejectedError, SchedulerStats
from ladle.sampling.params import SamplingParams

if TYPE_CHECKING:
    from ladle.frontend.external_handoffs import ExternalHandoffs

STARTUP_POLL_MS = 200
T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine-core process is gone (crashed, killed, or shut down)."""


class RequestFailedError(RuntimeError):
    """The engine ended this request with an error (it broke a step); others were unaffected."""


class EngineStartError(RuntimeError):
    """The engine-core process could not start (bad model, out of memory, ...)."""


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What the API process learns about the engine when it is ready."""

    max_model_len: int  # already capped to what the KV pool holds
    memory_budget: str
    vocab_size: int


def _shallow_copy(instance: T) -> T:
    """A field-for-field copy of a plain dataclass instance, without dataclasses.replace's
    re-run of __init__ (it cost ~25 us per request and step, at 256 streams a third of a
    decode step of the API process's time)."""
    copy = object.__new__(type(instance))
    copy.__dict__.update(instance.__dict__)
    return copy


def _snapshot(output: RequestOutput) -> RequestOutput:
    """A copy that later steps cannot change: the OutputProcessor reuses its RequestOutput
    objects and resets their deltas at the next step. Cumulative lists stay shared (copying them
    each step would cost O(length)); they are complete once the output is finished."""
    completions = []
    for completion in output.outputs:
        copy = _shallow_copy(completion)
        copy.token_ids_delta = list(completion.token_ids_delta)
        if completion.logprobs_delta is not None:
            copy.logprobs_delta = list(completion.logprobs_delta)
        completions.append(copy)
    snapshot = _shallow_copy(output)
    snapshot.outputs = completions
    if output.metrics is not None:
        snapshot.metrics = _shallow_copy(output.metrics)
    return snapshot


def _merge(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One output holding both outputs' deltas (later's cumulative state)."""
    for before, after in zip(earlier.outputs, later.outputs, strict=True):
        after.text_delta = before.text_delta + after.text_delta
        after.token_ids_delta = before.token_ids_delta + after.token_ids_delta
        if after.logprobs_delta is not None:
            after.logprobs_delta = (before.logprobs_delta or []) + after.logprobs_delta
    return later


def _join_steps(steps: list[wire.EngineStep]) -> wire.EngineStep:
    """Several consecutive steps as one: outputs and rejections in order, the latest stats."""
    stats = [step.stats for step in steps if step.stats is not None]
    return wire.EngineStep(
        outputs=[output for step in steps for output in step.outputs],
        rejections=[rejection for step in steps for rejection in step.rejections],
        stats=stats[-1] if stats else None,
    )


class _OutputBuffer:
    """Outputs not yet read by a request's consumer, merged into one; or the error that ends it."""

    def __init__(self) -> None:
        self._pending: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.previous_token_time: float | None = None  # for the inter-token latency metric

    def put(self, output: RequestOutput) -> None:
        self._pending = output if self._pending is None else _merge(self._pending, output)
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    async def get(self) -> RequestOutput:
        while True:
            if self._pending is not None:
                output, self._pending = self._pending, None
                return output
            if self._error is not None:
                raise self._error
            self._ready.clear()
            await self._ready.wait()


class RequestStream:
    """One request's outputs, as an async iterator; close() aborts it if it has not finished.

    Always close it (try/finally): that is how a client disconnect reaches the engine.
    """

    def __init__(self, client: AsyncEngineClient, request_id: str, buffer: _OutputBuffer) -> None:
        self.request_id = request_id
        self._client = client
        self._buffer = buffer
        self.finished = False
        # The latest output (token ids accumulate in it): the per-request log line reads it.
        self.last_output: RequestOutput | None = None
        self._closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished or self._closed:
            raise StopAsyncIteration
        output = await self._buffer.get()
        self.last_output = output
        if output.finished:
            self.finished = True
            if output.error is not None:
                # The engine (or output processing) ended this request alone, with a reason.
                raise RequestFailedError(output.error)
        return output

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.finished:
            self._client.abort(self.request_id)


class AsyncEngineClient:
    """Starts and talks to the engine-core process; use from one asyncio event loop."""

    def __init__(
        self,
        engine_options: dict,
        metrics: ServerMetrics,
        admission: AdmissionController,
        startup_timeout_s: float = 1800.0,
        restart_policy: RestartPolicy | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        """engine_options: EngineConfig.from_kwargs keywords (model path resolved already).
        on_fatal(reason): called once the engine is dead for good (restarts spent or off)."""
        self.engine_options = engine_options
        self.metrics = metrics
        self.admission = admission
        self.startup_timeout_s = startup_timeout_s
        self.restart_budget = RestartBudget(restart_policy or RestartPolicy())
        self.on_fatal = on_fatal
        self.num_restarts = 0
        self._restart_task: asyncio.Task | None = None
        self.info: EngineInfo | None = None
        self.tokenizer: TextTokenizer | None = None
        # The model's generation-config sampling defaults, as the engine read them.
        self.sampling_defaults: dict = {}
        self.stats = SchedulerStats()
        self.output_processor: OutputProcessor | None = None
        self.dead_reason: str | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._buffers: dict[str, _OutputBuffer] = {}
        self._parent_of: dict[str, str] = {}
        self._children: dict[str, list[str]] = {}
        self._reader_task: asyncio.Task | None = None
        self._shutting_down = False
        self._is_stopping = False  # begin_shutdown() came: no more restarts
        self._ids = itertools.count()
        self._ipc_dir: str | None = None
        self._sync_context: zmq.Context | None = None
        self._async_context: zmq.asyncio.Context | None = None
        # kv_transfer_params over HTTP, behind an external proxy (external_handoffs.py); set by
        # `ladle serve --kv-transfer-config`.
        self.external_handoffs: ExternalHandoffs | None = None

    # ----- life cycle ------------------------------------------------------------------------

    @property
    def engine_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def is_started(self) -> bool:
        return self.info is not None

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and self.info is not None

    @property
    def health_problem(self) -> str | None:
        """Why /health answers 503 now; None when healthy. A multi-engine client adds its
        degraded state (an engine down while the others serve)."""
        if self.is_alive:
            return None
        return self.dead_reason or "the engine is not ready"

    async def start(self) -> None:
        """Spawn the engine core, wait until it is ready, load the tokenizer (meanwhile, when
        its source is known before the model loads)."""
        preload = TokenizerPreload(EngineConfig.from_kwargs(**self.engine_options).model)
        ready = await self._spawn()
        if ready.tokenizer_source is not None:
            self.tokenizer = await asyncio.to_thread(
                preload.result_for, ready.tokenizer_source, ready.arch
            )
        else:
            preload.cancel()
        self.info = EngineInfo(
            max_model_len=ready.max_model_len,
            memory_budget=ready.memory_budget,
            vocab_size=self._vocab_size(ready.arch),
        )
        self._go_live(ready)

    async def _spawn(self) -> wire.EngineReady:
        """Fresh sockets and a fresh engine process; returns once it reports ready. Fresh
        sockets on every start: nothing meant for a dead engine reaches its successor."""
        self._ipc_dir = tempfile.mkdtemp(prefix="ladle-")
        input_address = f"ipc://{self._ipc_dir}/input"
        output_address = f"ipc://{self._ipc_dir}/output"
        self._sync_context = zmq.Context()
        self._input_socket = self._sync_context.socket(zmq.PUSH)
        # Unbounded: add and abort must never block the event loop or be dropped.
        self._input_socket.setsockopt(zmq.SNDHWM, 0)
        self._input_socket.setsockopt(zmq.LINGER, 0)
        self._input_socket.bind(input_address)
        self._async_context = zmq.asyncio.Context()
        self._output_socket = self._async_context.socket(zmq.PULL)
        self._output_socket.setsockopt(zmq.RCVHWM, 0)
        self._output_socket.setsockopt(zmq.LINGER, 0)
        self._output_socket.bind(output_address)
        spawn = multiprocessing.get_context("spawn")
        self._process = spawn.Process(
            target=run_engine_core,
            args=(json.dumps(self.engine_options), input_address, output_address, os.getpid()),
            name="ladle-engine-core",
            daemon=True,
        )
        self._process.start()
        return await self._wait_for_ready()

    def _go_live(self, ready: wire.EngineReady) -> None:
        """Start serving from the engine process that just reported ready."""
        self.sampling_defaults = dict(ready.sampling_defaults)
        eos_token_ids = (
            self.tokenizer.eos_token_ids
            if self.tokenizer
            else tuple(ready.end_token_ids) or ready.arch.eos_token_ids
        )
        self.output_processor = OutputProcessor(
            self.tokenizer, eos_token_ids, no_tokenizer_reason=self.no_tokenizer_reason
        )
        self.stats = SchedulerStats()
        self.dead_reason = None
        loop = asyncio.get_running_loop()
        # The process sentinel becomes readable the moment the process ends, however it ends.
        loop.add_reader(self._process.sentinel, self._on_engine_exit)
        self._reader_task = asyncio.create_task(self._read_outputs(), name="ladle-engine-reader")
        freeze_startup_objects()  # the tokenizer and the web stack: never rescanned per step

    @property
    def no_tokenizer_reason(self) -> str:
        """Why a request that needs the tokenizer is refused, naming the option if it is set."""
        return no_tokenizer_reason(bool(self.engine_options.get("skip_tokenizer_init")))

    def _vocab_size(self, arch) -> int:
        """The ids a token-id prompt may hold: the tokenizer's, except on random weights,
        whose borrowed tokenizer knows fewer ids than the preset's model takes."""
        if self.tokenizer is None or self.engine_options.get("load_format") == "dummy":
            return arch.vocab_size
        return self.tokenizer.vocab_size

    async def _wait_for_ready(self) -> wire.EngineReady:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if await self._output_socket.poll(STARTUP_POLL_MS):
                message = wire.decode_output(await self._output_socket.recv())
                if isinstance(message, wire.EngineReady):
                    return message
                if isinstance(message, wire.EngineFailed):
                    await self._stop_process(timeout_s=5.0)
                    raise EngineStartError(message.message)
            elif not self._process.is_alive():
                raise EngineStartError(
                    f"the engine process exited during start-up (exit code "
                    f"{self._process.exitcode})"
                )
        await self._stop_process(timeout_s=5.0)
        raise EngineStartError(f"the engine was not ready after {self.startup_timeout_s:.0f}s")

    def begin_shutdown(self) -> None:
        """The server has begun to shut down (a signal came; requests drain before shutdown()
        runs): an engine that dies from now on is not restarted. Safe in a signal handler."""
        self._is_stopping = True

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine process (politely, then by force) and release the sockets.
        Idempotent."""
        if self._shutting_down:
            return
        self._shutting_down = self._is_stopping = True
        if self._restart_task is not None:
            self._restart_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._restart_task
        await self._stop_process(timeout_s)
        if self._process is not None:
            remove_exported_pools(self._process.pid)
        self._mark_dead("the server is shutting down")
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        self._release_transport()

    def _release_transport(self) -> None:
        for context in (self._async_context, self._sync_context):
            if context is not None:
                context.destroy(linger=0)
        self._async_context = self._sync_context = None
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None

    async def _stop_process(self, timeout_s: float) -> None:
        process = self._process
        if process is None or process.exitcode is not None:
            return
        with contextlib.suppress(zmq.ZMQError):
            self._input_socket.send(wire.encode_input(wire.Shutdown()), zmq.NOBLOCK)
        # No SIGTERM step: the engine leaves SIGTERM to its living parent (core_process.py).
        for signal_step in (None, process.kill):
            if signal_step is not None:
                signal_step()
            deadline = time.monotonic() + timeout_s
            while process.exitcode is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if process.exitcode is not None:
                return

    def _on_engine_exit(self) -> None:
        process = self._process
        asyncio.get_running_loop().remove_reader(process.sentinel)
        # A KV producer's exported pool (a /dev/shm file on the CPU): the engine leaves by
        # os._exit, which skips the exit hook that would remove it.
        remove_exported_pools(process.pid)
        if self._shutting_down:
            self._mark_dead("the server is shutting down")
            return
        # Fail everything in flight now; reaping and restarting take longer.
        self._mark_dead("the engine process died")
        self._restart_task = asyncio.create_task(
            self._reap_and_restart(process), name="ladle-engine-restart"
        )

    async def _reap_and_restart(self, process: multiprocessing.process.BaseProcess) -> None:
        # The sentinel fires as the process closes its files, possibly before it is a zombie
        # waitpid can collect: wait for the exit code, so no dead engine is ever left unreaped.
        await asyncio.to_thread(process.join, 30)
        reason = f"the engine process died (exit code {process.exitcode})"
        self.dead_reason = reason
        print(f"[ladle] {reason}", flush=True)
        if self._is_stopping:
            print("[ladle] not restarting it: the server is shutting down", flush=True)
            return
        while not self._is_stopping:
            if not self.restart_budget.may_restart():
                self._give_up(f"{reason}; not restarting it ({self.restart_budget.describe()})")
                return
            self.restart_budget.record_restart()
            self.dead_reason = f"{reason}; a new engine is starting"
            self._release_transport()
            try:
                ready = await self._spawn()
            except EngineStartError as error:
                reason = f"the new engine process failed to start: {error}"
                await asyncio.to_thread(self._process.join, 30)
                continue
            self.num_restarts += 1
            self.metrics.record_engine_restarted()
            self._go_live(ready)
            print(f"[ladle] engine core restarted in process {self._process.pid}", flush=True)
            return

    def _give_up(self, reason: str) -> None:
        self.dead_reason = reason
        print(f"[ladle] {reason}", flush=True)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def _mark_dead(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        self.metrics.record_engine_dead()
        error = EngineDeadError(reason)
        for request_id, buffer in list(self._buffers.items()):
            buffer.fail(error)
            self._forget(request_id)
        self._parent_of.clear()
        self._children.clear()
        if self._reader_task is not None and self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()

    # ----- requests --------------------------------------------------------------------------

    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}-{os.urandom(4).hex()}"

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        admission_checked: bool = False,
        stream: bool = False,
        kv_transfer_params: dict | None = None,
    ) -> RequestStream:
        """Send a request to the engine now. Raises EngineDeadError, or QueueFullError /
        QueueLimitError when the admission bounds refuse it (nothing is sent then).
        admission_checked: the caller already checked a batch this request belongs to.
        stream: the caller reads only each output's *_delta fields (no cumulative logprobs).
        kv_transfer_params: vLLM's proxy protocol, checked by the caller (n == 1): a prefill
        ({"do_remote_decode": true}) or a decode with a prefill server's params."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        assert self.output_processor is not None, "start() first"
        if kv_transfer_params is not None and kv_transfer_params.get("do_remote_decode"):
            # A handoff happens after a first token that did not end the request.
            params = dataclasses.replace(params, max_tokens=max(params.max_tokens or 2, 2))
        self.admission.admit(
            request_id, params.n, len(prompt_token_ids) * params.n, checked=admission_checked
        )
        try:
            core_requests = self.output_processor.add_request(
                request_id, prompt, prompt_token_ids, params, time.monotonic(), priority,
                deltas_only=stream,
            )
            buffer = _OutputBuffer()
            self._buffers[request_id] = buffer
            self._children[request_id] = [r.request_id for r in core_requests]
            for core_request in core_requests:
                self._parent_of[core_request.request_id] = request_id
            if kv_transfer_params is not None:
                core_requests[0].kv_transfer_params = self._engine_kv_params(
                    request_id, kv_transfer_params, params
                )
            self._send(wire.AddRequests(core_requests))
        except BaseException:
            # Nothing reached the engine (an encoding failure, say): undo every trace of the
            # request here, its admission slot first, or the queue would count it forever.
            self.output_processor.abort_request(request_id)
            self._forget(request_id)
            raise
        self.metrics.record_accepted(len(prompt_token_ids), params.n)
        return RequestStream(self, request_id, buffer)

    def _handoff_params(self, output: RequestOutput, handed_off: dict) -> dict | None:
        """A prefill answer's kv_transfer_params; none when a stop string ended the request
        here on its first token (its held KV is freed now: no decode leg will pull it)."""
        params = handed_off.get(output.request_id)
        if params is not None and output.outputs[0].finish_reason != "length":
            held = self.external_handoffs.releasable([output.request_id])
            if held:
                self._send(wire.AbortRequests(held))
            return None
        return params

    def _engine_kv_params(self, request_id: str, kv_params: dict, params: SamplingParams):
        if kv_params.get("do_remote_decode"):
            return {"do_remote_decode": True}
        assert self.external_handoffs is not None and self.output_processor is not None
        return self.external_handoffs.engine_params(
            request_id, kv_params, params, self.output_processor.eos_token_ids
        )

    def abort(self, request_id: str) -> None:
        """Forget a request here and end its sequences in the engine at its next step."""
        if self.output_processor is None or request_id not in self._buffers:
            return
        child_ids = self.output_processor.abort_request(request_id)
        self._forget(request_id)
        if child_ids and self.dead_reason is None:
            try:
                self._send(wire.AbortRequests(child_ids))
            except EngineDeadError:
                return  # a dead engine runs nothing that needs aborting
            self.metrics.record_aborted()

    def _forget(self, request_id: str) -> None:
        self._buffers.pop(request_id, None)
        if self.external_handoffs is not None:
            self.external_handoffs.forget(request_id)
        self.admission.release(request_id)
        for child_id in self._children.pop(request_id, ()):
            self._parent_of.pop(child_id, None)

    def _send(self, message: wire.EngineInput) -> None:
        """Queue message for the engine; EngineDeadError (and the client marked dead) when no
        engine is on the other end of the socket any more."""
        # The socket's queue is unbounded, so this never blocks while the engine is connected.
        # A PUSH socket with no peer refuses at once (EAGAIN): the engine died and its process
        # sentinel has not fired yet. That was a 500 "Again" to the user, and behind Ray Serve
        # the ingress relayed it instead of sending the request to another replica.
        try:
            self._input_socket.send(wire.encode_input(message), zmq.NOBLOCK)
        except zmq.Again:
            self._mark_dead("the engine process stopped taking requests")
            raise EngineDeadError(self.dead_reason) from None

    # ----- outputs ---------------------------------------------------------------------------

    async def _read_outputs(self) -> None:
        try:
            while True:
                messages = [wire.decode_output(await self._output_socket.recv())]
                # Every step already waiting is applied in one pass: a front end that fell
                # behind the engine catches up (one snapshot and one chunk per request for
                # several steps) instead of falling further behind one step at a time.
                while self._output_socket.get(zmq.EVENTS) & zmq.POLLIN:
                    messages.append(wire.decode_output(await self._output_socket.recv()))
                steps = [m for m in messages if isinstance(m, wire.EngineStep)]
                if steps:
                    self._apply_step(steps[0] if len(steps) == 1 else _join_steps(steps))
                failed = [m for m in messages if isinstance(m, wire.EngineFailed)]
                if failed:
                    self._mark_dead(failed[0].message)
                    return
                # Let the streams write this pass's chunks before the next pass: a frame that
                # is already queued completes recv() without yielding to the event loop.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a broken reader must not leave requests hanging
            self._mark_dead(f"lost the engine's output stream ({type(error).__name__}: {error})")

    def _apply_step(self, step: wire.EngineStep) -> None:
        if step.stats is not None:
            self.stats = step.stats
            self.metrics.record_engine_stats(step.stats)
        for rejection in step.rejections:
            parent_id = self._parent_of.get(rejection.request_id)
            buffer = self._buffers.get(parent_id) if parent_id is not None else None
            if buffer is not None:
                self.abort(parent_id)  # its other samples, if any
                buffer.fail(RequestRejectedError(rejection.message))
        if not step.outputs:
            return
        outputs, handed_off = step.outputs, {}
        if self.external_handoffs is not None:
            outputs, handed_off = self.external_handoffs.on_outputs(outputs)
        request_outputs, to_abort = self.output_processor.process_outputs(outputs)
        if to_abort:
            self._send(wire.AbortRequests(to_abort))  # ended here by a stop string
        for output in request_outputs:
            buffer = self._buffers.get(output.request_id)
            if buffer is None:
                continue
            self.admission.release(output.request_id)
            self.metrics.record_step_output(output, buffer.previous_token_time)
            if output.metrics is not None and output.metrics.last_token_time is not None:
                buffer.previous_token_time = output.metrics.last_token_time
            if handed_off:
                output.kv_transfer_params = self._handoff_params(output, handed_off)
            buffer.put(_snapshot(output))
            if output.finished:
                self.metrics.record_finished(output)
                self._forget(output.request_id)
