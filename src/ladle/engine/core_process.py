"""The engine-core process: EngineCore.step() in a loop, fed and drained over ZMQ.

The loop never waits on the API process while it has work: it takes whatever add / abort
messages have arrived (without blocking), steps, and pushes the step's outputs (with fresh
stats after an input, a request's end or going idle, else every BUSY_STATS_INTERVAL_S). Aborts are
applied before the next step, so a request whose client went away stops within one step and
its KV blocks are freed. Idle, it blocks on its input for a short while, then sends a heartbeat
with fresh stats.

It exits when told to (Shutdown), when its parent (the API process) is gone however it died
(its parent pid changes when it is re-parented), and after reporting a failure (EngineFailed).
SIGINT and SIGTERM sent to the server's process group are the API process's to handle.
"""

from __future__ import annotations

import json
import logging
import multiprocessing.util
import os
import signal
import sys
import time
import traceback

import zmq

from ladle.engine.token_gap_meter import TokenGapMeter
from ladle.protocol import wire
from ladle.protocol.messages import EngineCoreOutput, RequestRejectedError

logger = logging.getLogger(__name__)

# Idle: how long one wait for input lasts, which bounds how late a dead parent is noticed.
IDLE_POLL_MS = 200
# Idle: how often fresh stats go out when nothing else does.
HEARTBEAT_INTERVAL_S = 1.0
# How long one blocked send waits before checking that the parent is still there.
SEND_TIMEOUT_MS = 1000
# Busy, fresh stats ride on a step's frame at most this often, unless the step took inputs or
# ended a request, or the engine went idle: gathering and encoding them took ~30-65 us of the
# engine's host time a step on this project's CPU, where a batch-1 decode step of the 0.6B
# shape has ~0.9 ms (issue 33). The API process keeps only the latest stats, and /metrics
# scrapes are seconds apart.
BUSY_STATS_INTERVAL_S = 0.01


def run_engine_core(
    engine_options_json: str, input_address: str, output_address: str, parent_pid: int
) -> None:
    """Process entry point (multiprocessing spawn target). Arguments are plain strings, so the
    process start carries no objects; engine_options_json is EngineConfig.from_kwargs' input."""
    # Ctrl-C reaches the whole process group, and so does the SIGTERM of a supervisor or a
    # shell stopping the server (kill -TERM -- -PGID): the API process drains its requests,
    # then stops us (Shutdown). Dying at once would fail those requests and look like a crash
    # to the restart policy.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: _on_sigterm(parent_pid))
    context = zmq.Context()
    input_socket = context.socket(zmq.PULL)
    input_socket.connect(input_address)
    output_socket = context.socket(zmq.PUSH)
    output_socket.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    output_socket.setsockopt(zmq.LINGER, 1000)
    output_socket.connect(output_address)
    exit_code = 0
    try:
        loop = _start(engine_options_json, input_socket, output_socket, parent_pid)
    except ValueError as error:
        # Bad configuration (missing model, unsupported architecture, no memory for the KV
        # cache): the message says it all, a traceback would only bury it.
        loop, exit_code = None, 1
        _try_send(output_socket, wire.EngineFailed(str(error)), parent_pid)
    except Exception as error:  # noqa: BLE001 - any failure must reach the API as a message
        loop, exit_code = None, 1
        _report_failure(output_socket, error, parent_pid)
    if loop is not None:
        try:
            loop.run()
        except Exception as error:  # noqa: BLE001
            exit_code = 1
            _report_failure(output_socket, error, parent_pid)
    # Closing with linger lets a last message (EngineFailed) leave before the process ends.
    input_socket.close(linger=0)
    output_socket.close(linger=1000)
    context.term()
    _exit_now(exit_code)


def _exit_now(exit_code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit skips multiprocessing's exit hooks, which unlink the named semaphores made in
    # this process (tqdm's lock, taken while the weights load): run them, or the resource
    # tracker warns of leaked semaphores at shutdown.
    multiprocessing.util._run_finalizers(0)
    # Skip interpreter teardown: torch's thread pools can hang it, and there is nothing to save.
    os._exit(exit_code)


def _on_sigterm(parent_pid: int) -> None:
    """SIGTERM while the API process lives is its to act on (it got the same signal, or will
    stop us); with the API process gone nobody will, so exit as SIGTERM asks."""
    if not _parent_is_alive(parent_pid):
        _exit_now(128 + signal.SIGTERM)


def _report_failure(output_socket: zmq.Socket, error: Exception, parent_pid: int) -> None:
    logger.error("engine core failed:\n%s", traceback.format_exc())
    detail = "".join(traceback.format_exception_only(type(error), error)).strip()
    _try_send(output_socket, wire.EngineFailed(f"engine core failed: {detail}"), parent_pid)


def _start(
    engine_options_json: str, input_socket: zmq.Socket, output_socket: zmq.Socket, parent_pid: int
) -> EngineCoreLoop | None:
    # Imported here: the API process imports this module only to name the spawn target.
    from ladle.config import EngineConfig
    from ladle.engine.engine_core import EngineCore
    from ladle.engine.gc_policy import freeze_startup_objects
    from ladle.frontend.tokenizer_source import resolve_tokenizer_source
    from ladle.model.end_tokens import model_end_token_ids
    from ladle.model.generation_defaults import sampling_defaults_of

    options = json.loads(engine_options_json)
    config = EngineConfig.from_kwargs(**options)
    engine = EngineCore(config)
    freeze_startup_objects()  # the collector must not rescan the model and tables every step
    info = engine.info
    ready = wire.EngineReady(
        max_model_len=engine.max_model_len,
        tokenizer_source=resolve_tokenizer_source(config.model, info.model_path),
        arch=info.arch,
        memory_budget=info.memory_budget.describe(),
        sampling_defaults=sampling_defaults_of(
            info.model_path, config.model.generation_config,
            config.model.override_generation_config,
        ),
        end_token_ids=list(model_end_token_ids(info.arch, info.model_path)),
    )
    if not _try_send(output_socket, ready, parent_pid):
        return None
    return EngineCoreLoop(engine, input_socket, output_socket, parent_pid)


def _parent_is_alive(parent_pid: int) -> bool:
    # A dead parent's children are re-parented (to init or a subreaper), so getppid() changes.
    return os.getppid() == parent_pid


def _try_send(socket: zmq.Socket, message: wire.EngineOutput, parent_pid: int) -> bool:
    """Send, retrying while the API process lives; False once it is gone."""
    frame = wire.encode_output(message)
    while True:
        try:
            socket.send(frame)
            return True
        except zmq.Again:
            if not _parent_is_alive(parent_pid):
                return False


class EngineCoreLoop:
    """Runs one EngineCore against its two sockets until shutdown or the parent's death."""

    def __init__(
        self, engine, input_socket: zmq.Socket, output_socket: zmq.Socket, parent_pid: int
    ) -> None:
        self.engine = engine
        self.input_socket = input_socket
        self.output_socket = output_socket
        self.parent_pid = parent_pid
        self.poller = zmq.Poller()
        self.poller.register(input_socket, zmq.POLLIN)
        self._should_stop = False
        self.token_gaps = TokenGapMeter()  # what a stream waits between frames: /metrics

    def run(self) -> None:
        last_sent = last_stats = time.monotonic()
        while not self._should_stop:
            busy = self.engine.has_unfinished_requests()
            outputs, rejections, num_handled = self._take_inputs(0 if busy else IDLE_POLL_MS)
            if self._should_stop or not _parent_is_alive(self.parent_pid):
                return
            busy = self.engine.has_unfinished_requests()
            if busy:
                outputs += self.engine.step()
                busy = self.engine.has_unfinished_requests()
            else:
                # A step expires them too; an idle engine still owes the hold timeout.
                self.engine.expire_handoffs()
            now = time.monotonic()
            # Send after every step with outputs and after every input; otherwise only a
            # heartbeat now and then. Stats follow an input (an abort) or a request's end at
            # once, and an idle engine's last step; a busy one's come every
            # BUSY_STATS_INTERVAL_S.
            if outputs or rejections or num_handled or now - last_sent >= HEARTBEAT_INTERVAL_S:
                if outputs:
                    self.token_gaps.observe(outputs, now)
                stats = None
                if (
                    rejections
                    or num_handled
                    or not busy
                    or now - last_stats >= BUSY_STATS_INTERVAL_S
                    or any(output.finish_reason is not None for output in outputs)
                ):
                    stats = self.engine.get_stats()
                    stats.engine_itl_counts = tuple(self.token_gaps.bucket_counts)
                    stats.engine_itl_seconds = self.token_gaps.total_seconds
                    last_stats = now
                message = wire.EngineStep(outputs=outputs, rejections=rejections, stats=stats)
                if not _try_send(self.output_socket, message, self.parent_pid):
                    return
                last_sent = now

    def _take_inputs(
        self, timeout_ms: int
    ) -> tuple[list[EngineCoreOutput], list[wire.Rejection], int]:
        """Apply every message that has arrived, waiting up to timeout_ms for the first."""
        outputs: list[EngineCoreOutput] = []
        rejections: list[wire.Rejection] = []
        num_handled = 0
        if not self.poller.poll(timeout_ms):
            return outputs, rejections, num_handled
        while True:
            try:
                frame = self.input_socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return outputs, rejections, num_handled
            num_handled += 1
            message = wire.decode_input(frame)
            if isinstance(message, wire.AddRequests):
                for request in message.requests:
                    try:
                        self.engine.add_request(request)
                    except (RequestRejectedError, ValueError) as error:
                        rejections.append(wire.Rejection(request.request_id, str(error)))
            elif isinstance(message, wire.AbortRequests):
                outputs += self.engine.abort_requests(message.request_ids)
            elif isinstance(message, wire.Shutdown):
                self._should_stop = True
                return outputs, rejections, num_handled
