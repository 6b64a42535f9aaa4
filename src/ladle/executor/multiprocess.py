"""The multi-process executor: one worker process per rank, plans over ZMQ, results from one.

Every rank receives every message (a PUSH socket each, msgspec-encoded: a plan is decoded against
its Structs, never unpickled) and runs the same step; rank 0 sends the StepResult back (the last
pipeline stage's first rank under pipeline parallelism). A worker
keeps a step in flight the way the engine does: after launching step N it takes step N+1's plan
as soon as it arrives (queued behind N on the device) and sends N's result once N's copy is done,
whichever comes first (on a GPU it never blocks on the device while a plan may come), so the
device does not idle while the plan crosses. Under pipeline parallelism the engine keeps
one step per stage in flight: a stage before the last launches each plan as it comes and reads a
step's sampled ids (from the last stage) only once they are there, so it never idles waiting for
the stages after it. A step whose sampling reads host tokens
arrives in two messages: ExecuteStep(split) launches the forward pass, SampleStep (sent once the
engine has read the step before and filled the grammar masks) samples it.

A worker that dies, or fails on something no request explains, ends the engine with an error
(an engine fault: the server's restart policy starts a new engine process).
"""

from __future__ import annotations

import multiprocessing.util
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec
import numpy as np
import torch
import zmq

from ladle.config import EngineConfig
from ladle.distributed.process_group import leave
from ladle.engine.gc_policy import freeze_startup_objects
from ladle.executor.base import Executor, StartGrammarFill, StepFuture
from ladle.executor.fault_isolation import may_be_attributed, run_isolating_faults
from ladle.protocol.step import GrammarMasks, StepPlan, StepResult
from ladle.structured.manager import GrammarBitmask
from ladle.worker.model_runner import LaunchedStep
from ladle.worker.worker import Worker, WorkerInfo

# How long the engine waits for a result between checks that the workers are alive.
POLL_MS = 100
# An idle worker checks this often that the engine process is still there.
PARENT_CHECK_MS = 1000
# While its oldest step runs on a GPU, the result-sending rank checks this often whether the
# step is done or the next plan has come, whichever is first.
DEVICE_POLL_S = 50e-6
# A worker's start-up (loading, memory probe, graph capture) may take this long.
START_TIMEOUT_S = 1800.0


class ExecuteStep(msgspec.Struct, tag="execute"):
    plan: StepPlan
    masks: GrammarMasks | None = None
    split: bool = False  # sample only when the SampleStep message comes
    # Steps whose results the engine had received when it planned this one. The result rank
    # read them before sending; every other rank reads them before this launch, so its request
    # states hold the same tokens (a drafted request's next input ids come from them).
    num_results_read: int = 0


class SampleStep(msgspec.Struct, tag="sample"):
    masks: GrammarMasks | None = None
    # As ExecuteStep's, counted when the engine sent this: it read the step before in between,
    # and a grammar or bad_words row samples from that step's tokens on every rank.
    num_results_read: int = 0


class StopWorker(msgspec.Struct, tag="stop"):
    pass


class StepDone(msgspec.Struct, tag="done"):
    result: StepResult


class WorkerFailed(msgspec.Struct, tag="failed"):
    rank: int
    message: str


_to_worker = msgspec.msgpack.Decoder(ExecuteStep | SampleStep | StopWorker)
_from_worker = msgspec.msgpack.Decoder(StepDone | WorkerFailed)
_encoder = msgspec.msgpack.Encoder()


class _HostMasks:
    """GrammarMasks from the engine, made device tensors when the runner samples."""

    def __init__(self, masks: GrammarMasks, device: torch.device) -> None:
        self._masks = masks
        self._device = device

    def wait(self) -> GrammarBitmask | None:
        masks = self._masks
        if not masks.rows:
            return None
        words = np.frombuffer(masks.bitmask, dtype=np.int32).reshape(len(masks.rows), masks.words)
        return GrammarBitmask(
            bitmask=torch.from_numpy(words.copy()).to(self._device),
            row_indices=torch.tensor(masks.rows, dtype=torch.int32, device=self._device),
        )


def _host_masks(start_grammar_fill: StartGrammarFill | None, plan: StepPlan) -> GrammarMasks | None:
    """The plan's grammar masks as plain data (None: no row has one)."""
    if start_grammar_fill is None:
        return None
    pending = start_grammar_fill(plan)
    if pending is None:
        return None
    masks = pending.wait()
    if masks is None:
        return None
    bitmask = masks.bitmask.cpu().numpy()
    return GrammarMasks(
        bitmask=bitmask.tobytes(), words=bitmask.shape[1], rows=masks.row_indices.tolist()
    )


# ----- the worker process -------------------------------------------------------------------


def main() -> None:
    """`python -m ladle.executor.multiprocess RANK INPUT OUTPUT READY RENDEZVOUS`, the engine's
    pickled EngineConfig on standard input (from the engine process itself, which started this
    one). RENDEZVOUS is where the ranks' torch.distributed group meets."""
    rank, input_address, output_address, ready_address, rendezvous = sys.argv[1:6]
    config = pickle.load(sys.stdin.buffer)
    run_worker(config, int(rank), input_address, output_address, ready_address, rendezvous)


def run_worker(
    config: EngineConfig,
    rank: int,
    input_address: str,
    output_address: str,
    ready_address: str,
    rendezvous: str | None = None,
    device_index: int | None = None,
    watch_parent: bool = True,
) -> None:
    """Build the Worker, report its WorkerInfo (or why it could not start), then run plans.
    watch_parent: leave once the process that started this one is gone (a subprocess of the
    engine; a Ray actor is stopped by Ray with its owner instead)."""
    # Ctrl-C and a supervisor's SIGTERM reach the whole process group; the engine decides how
    # its workers stop (StopWorker, else SIGKILL), and a worker whose engine is gone leaves.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent_pid = os.getppid() if watch_parent else None
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    inputs.connect(input_address)
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.LINGER, 1000)
    outputs.connect(output_address)
    ready = context.socket(zmq.PUSH)
    ready.setsockopt(zmq.LINGER, 1000)
    ready.connect(ready_address)
    try:
        worker = Worker(config, rank, rendezvous, device_index)
    except Exception as error:
        ready.send_pyobj(("error", rank, f"{type(error).__name__}: {error}"))
        ready.close()
        return
    # A worker process serves one engine for life: its start-up objects (the model, the graphs)
    # leave the collector's scans. A full collection in one rank stalls every rank at its next
    # collective.
    freeze_startup_objects()
    ready.send_pyobj(("ready", rank, worker.info))
    ready.close()
    try:
        _WorkerLoop(worker, inputs, outputs, parent_pid).run()
    except Exception as error:  # nothing a request explains: the engine ends
        outputs.send(_encoder.encode(WorkerFailed(rank, f"{type(error).__name__}: {error}")))
    finally:
        leave()
        inputs.close(linger=0)
        outputs.close()
        context.term()


class _WorkerLoop:
    def __init__(
        self, worker: Worker, inputs: zmq.Socket, outputs: zmq.Socket, parent_pid: int | None
    ) -> None:
        self.worker = worker
        self.parent_pid = parent_pid
        self.inputs = inputs
        self.outputs = outputs
        self.sends_results = worker.sends_results
        self.on_cuda = worker.device.type == "cuda"
        # Launched steps whose results are not sent yet: (launched or None, failed requests).
        self.in_flight: deque[tuple[StepPlan, LaunchedStep | None, dict[str, str]]] = deque()
        self.num_finished = 0  # steps taken off in_flight (each plan adds one, in order)
        self.split: tuple[StepPlan, object] | None = None  # a forward waiting for SampleStep

    def run(self) -> None:
        while True:
            if self.in_flight and not self.inputs.poll(0):
                launched = self.in_flight[0][1]
                if launched is None or launched.is_ready():
                    self._finish_oldest()
                elif self.sends_results and self.on_cuda:
                    # Never block on the device while the next plan may come: a 70B decode
                    # step at 256 rows takes ~30 ms and the engine's next plan takes a few ms,
                    # and a rank that blocked would launch that plan only once the device had
                    # gone idle (~2.3 ms a step at TP=4). Whichever comes first is handled.
                    if self._device_or_message(launched):
                        self._finish_oldest()
                elif not self.inputs.poll(1) and self.sends_results:
                    # The CPU runs its steps itself: nothing to overlap, wait and send.
                    self._finish_oldest()
                # A rank that sends nothing (a pipeline stage before the last) never waits
                # for a result while a plan may come: its next micro-batch launches first.
                elif self._engine_gone():
                    return
                continue
            if not self.inputs.poll(PARENT_CHECK_MS):
                if self._engine_gone():
                    return  # the engine is gone (killed): nothing will come
                continue
            message = _to_worker.decode(self.inputs.recv())
            if isinstance(message, StopWorker):
                return
            if isinstance(message, ExecuteStep):
                self._execute(message)
            else:
                self._sample(message)

    def _device_or_message(self, launched: LaunchedStep) -> bool:
        """Wait until `launched` is done (True) or a message has come (False)."""
        checked = time.monotonic()
        while not launched.is_ready():
            if self.inputs.poll(0):
                return False
            if time.monotonic() - checked > PARENT_CHECK_MS / 1000:
                if self._engine_gone():
                    return True  # no plan is coming: read the step, the idle check ends the loop
                checked = time.monotonic()
            time.sleep(DEVICE_POLL_S)
        return True

    def _engine_gone(self) -> bool:
        return self.parent_pid is not None and os.getppid() != self.parent_pid

    def _finish_oldest(self) -> None:
        """Read the oldest step in flight (its request states take its tokens) and send its
        result if this rank sends results."""
        plan, launched, failed = self.in_flight.popleft()
        self.num_finished += 1
        self._send_result(plan, launched, failed)

    def _read_through(self, num_results_read: int) -> None:
        """Read every step the engine had read when it sent the message at hand. A rank that
        sends no results may still hold some (it went on to launch while they ran): without
        them its request states would lack tokens the plan counts as known, and its share of
        the step would read other input ids (or sample other tokens) than rank 0's."""
        while self.in_flight and self.num_finished < num_results_read:
            self._finish_oldest()

    def _execute(self, message: ExecuteStep) -> None:
        self._read_through(message.num_results_read)
        worker, plan = self.worker, message.plan
        if message.split:
            try:
                self.split = (plan, worker.launch_forward(plan))
            except Exception as error:
                if not may_be_attributed(error):
                    raise
                self.split = (plan, None)  # isolated when the sampling message comes
            return
        masks = self._masks(message.masks)
        self._run_isolating(plan, masks)

    def _sample(self, message: SampleStep) -> None:
        assert self.split is not None, "a SampleStep without its ExecuteStep"
        self._read_through(message.num_results_read)
        (plan, forward), self.split = self.split, None
        masks = self._masks(message.masks)
        if forward is not None:
            try:
                self.in_flight.append((plan, self.worker.sample(forward, masks), {}))
                return
            except Exception as error:
                if not may_be_attributed(error):
                    raise
        self._run_isolating(plan, None)

    def _run_isolating(self, plan: StepPlan, masks: _HostMasks | None) -> None:
        # A probe of a part of the step samples without masks: their rows are the whole step's.
        def run(step: StepPlan) -> LaunchedStep:
            return self.worker.execute(step, masks if step is plan else None)

        if self.worker.stage.size > 1:
            # A pipeline stage cannot probe alone: its probes would wait for hand-offs from
            # stages that did not fail and do not probe (a hang until the collective timeout).
            # The failure ends the engine instead, with its message; the server restarts it.
            self.in_flight.append((plan, run(plan), {}))
            return
        launched, ran, failed = run_isolating_faults(run, plan)
        self.in_flight.append((ran, launched, failed))

    def _masks(self, masks: GrammarMasks | None) -> _HostMasks | None:
        return _HostMasks(masks, self.worker.device) if masks is not None else None

    def _send_result(
        self, plan: StepPlan, launched: LaunchedStep | None, failed: dict[str, str]
    ) -> None:
        if launched is None:
            result = StepResult(
                request_ids=plan.request_ids(), token_ids=[[] for _ in plan.scheduled]
            )
        else:
            result = launched.result()  # every rank reads: its request states take the tokens
        if failed:
            result.failed = failed
        if self.sends_results:
            self.outputs.send(_encoder.encode(StepDone(result)))


# ----- the engine side ----------------------------------------------------------------------


class RemoteStepFuture(StepFuture):
    def __init__(self, executor: MultiprocessExecutor, plan: StepPlan, index: int) -> None:
        self._executor = executor
        self.plan = plan
        self._index = index
        self._result: StepResult | None = None

    def result(self) -> StepResult:
        if self._result is None:
            self._result = self._executor._result_of(self._index)
            if self._result.failed:
                self.plan = self.plan.without(set(self._result.failed))
        return self._result


class MultiprocessExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        self.world_size = config.parallel.world_size
        self._folder = tempfile.mkdtemp(prefix="ladle-workers-")
        self._context = zmq.Context()
        self._results = self._context.socket(zmq.PULL)
        output_address = self._bind(self._results, "results")
        self._inputs: list[zmq.Socket] = []
        self._ready = self._context.socket(zmq.PULL)
        ready_address = self._bind(self._ready, "ready")
        self._processes = []
        input_addresses = []
        for rank in range(self.world_size):
            socket = self._context.socket(zmq.PUSH)
            socket.setsockopt(zmq.LINGER, 0)
            input_addresses.append(self._bind(socket, f"rank{rank}"))
            self._inputs.append(socket)
        self._processes = self._start_workers(
            config, input_addresses, output_address, ready_address
        )
        # multiprocessing's finalizer, not weakref's: the engine-core process runs these before
        # its os._exit, so its workers stop and their sockets' folder goes on every exit.
        self._finalizer = multiprocessing.util.Finalize(
            self,
            _stop,
            args=(
                self._processes,
                [*self._inputs, self._ready],
                self._results,
                self._context,
                self._folder,
            ),
            exitpriority=10,
        )
        infos = self._await_ready()
        if self.world_size > 1:  # the engine prints the pool (rank 0's); each rank's own here
            for rank, info in enumerate(infos):
                print(
                    f"[ladle] rank {rank}: {info.memory_budget.describe()}",
                    file=sys.stderr,
                    flush=True,
                )
        self._info: WorkerInfo = infos[0]
        self._rank_infos = infos
        self._num_submitted = 0
        self._received: dict[int, StepResult] = {}
        self._num_received = 0

    def _bind(self, socket: zmq.Socket, name: str) -> str:
        """Bind one of the engine's sockets; the address the workers connect to."""
        address = f"ipc://{self._folder}/{name}"
        socket.bind(address)
        return address

    def _start_workers(
        self,
        config: EngineConfig,
        input_addresses: list[str],
        output_address: str,
        ready_address: str,
    ) -> list:
        """One worker process per rank; each handle has poll(), wait(timeout) and kill()."""
        # Plain subprocesses, not multiprocessing's: the server's engine-core process is a
        # daemonic multiprocessing child, and those may not start children of their own.
        config_bytes = pickle.dumps(config)
        rendezvous = f"file://{self._folder}/rendezvous"
        processes = []
        for rank, address in enumerate(input_addresses):
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ladle.executor.multiprocess",
                    str(rank),
                    address,
                    output_address,
                    ready_address,
                    rendezvous,
                ],
                stdin=subprocess.PIPE,
            )
            assert process.stdin is not None
            process.stdin.write(config_bytes)
            process.stdin.close()
            processes.append(process)
        return processes

    def _await_ready(self) -> list[WorkerInfo]:
        """Every rank's WorkerInfo, in rank order, once each has loaded and planned memory."""
        infos: dict[int, WorkerInfo] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(infos) < self.world_size:
            if not self._ready.poll(200):
                self._check_alive(starting=True)
                if time.monotonic() > deadline:
                    self.shutdown()
                    raise RuntimeError(f"the workers did not start in {START_TIMEOUT_S} s")
                continue
            kind, rank, payload = self._ready.recv_pyobj()
            if kind == "error":
                self.shutdown()
                raise ValueError(payload)  # a configuration error, told as the worker saw it
            infos[rank] = payload
        return [infos[rank] for rank in range(self.world_size)]

    @property
    def info(self) -> WorkerInfo:
        return self._info

    @property
    def rank_infos(self) -> list[WorkerInfo]:
        return list(self._rank_infos)

    def submit(
        self,
        plan: StepPlan,
        start_grammar_fill: StartGrammarFill | None = None,
        between: Callable[[], object] | None = None,
    ) -> StepFuture:
        index = self._num_submitted
        self._num_submitted += 1
        read = self._num_received
        if between is None:
            self._broadcast(ExecuteStep(plan, _host_masks(start_grammar_fill, plan), False, read))
        else:
            self._broadcast(ExecuteStep(plan, split=True, num_results_read=read))
            between()
            self._broadcast(SampleStep(_host_masks(start_grammar_fill, plan), self._num_received))
        return RemoteStepFuture(self, plan, index)

    def _broadcast(self, message: ExecuteStep | SampleStep | StopWorker) -> None:
        frame = _encoder.encode(message)
        for socket in self._inputs:
            # A PUSH to a dead worker would block for ever: wait in slices, checking on them.
            while True:
                try:
                    socket.send(frame, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    self._check_alive()
                    socket.poll(POLL_MS, zmq.POLLOUT)

    def _result_of(self, index: int) -> StepResult:
        """Results come in submission order: receive until step `index`'s is here."""
        while index not in self._received:
            if not self._results.poll(POLL_MS):
                self._check_alive()
                continue
            message = _from_worker.decode(self._results.recv())
            if isinstance(message, WorkerFailed):
                self.shutdown()
                raise RuntimeError(f"worker of rank {message.rank} failed: {message.message}")
            self._received[self._num_received] = message.result
            self._num_received += 1
        return self._received.pop(index)

    def _check_alive(self, starting: bool = False) -> None:
        for rank, process in enumerate(self._processes):
            code = process.poll()
            if code is not None:
                self.shutdown()
                when = " while starting" if starting else ""
                raise RuntimeError(f"worker process of rank {rank} died{when} (exit code {code})")

    def shutdown(self) -> None:
        self._finalizer()


def _stop(processes, sockets, results, context, folder) -> None:
    """Ask the workers to stop, then make sure they have; close the sockets."""
    frame = _encoder.encode(StopWorker())
    for socket, process in zip(sockets, processes):
        if process.poll() is None:
            try:
                socket.send(frame, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    for socket in [*sockets, results]:
        socket.close(linger=0)
    context.term()
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


if __name__ == "__main__":
    main()
