"""The engine client's send to the engine core: a socket with no engine on the other end (the
engine died and its process sentinel has not fired yet) ends as EngineDeadError with the client
marked dead, not as zmq's EAGAIN surfacing as a 500 (which Ray Serve's ingress would relay
instead of trying another replica)."""

from __future__ import annotations

import pytest
import zmq

from ladle.frontend.admission import AdmissionController
from ladle.frontend.client import AsyncEngineClient, EngineDeadError
from ladle.frontend.metrics import ServerMetrics
from ladle.protocol import wire


def client_with_socket(address: str, context: zmq.Context) -> AsyncEngineClient:
    client = AsyncEngineClient({}, ServerMetrics("m"), AdmissionController(None, None))
    socket = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(address)
    client._input_socket = socket
    client.info = object()  # as after the engine's ready handshake
    return client


def test_send_with_no_engine_marks_the_client_dead(tmp_path):
    context = zmq.Context()
    try:
        client = client_with_socket(f"ipc://{tmp_path}/in", context)
        assert client.is_alive
        with pytest.raises(EngineDeadError, match="stopped taking requests"):
            client._send(wire.Shutdown())
        assert not client.is_alive
        # A second request is refused up front, with the same reason.
        with pytest.raises(EngineDeadError, match="stopped taking requests"):
            client._send(wire.Shutdown())
        client._input_socket.close()
    finally:
        context.term()


def test_send_with_an_engine_connected_is_delivered(tmp_path):
    context = zmq.Context()
    try:
        address = f"ipc://{tmp_path}/in"
        client = client_with_socket(address, context)
        engine = context.socket(zmq.PULL)
        engine.setsockopt(zmq.LINGER, 0)
        engine.connect(address)
        # The connection completes asynchronously: retry until the pipe exists.
        for _ in range(200):
            try:
                client._input_socket.send(b"", zmq.NOBLOCK)
                break
            except zmq.Again:
                engine.poll(10)
        assert engine.recv() == b""
        client._send(wire.Shutdown())
        assert engine.poll(2000)
        assert isinstance(wire.decode_input(engine.recv()), wire.Shutdown)
        assert client.is_alive
        engine.close()
        client._input_socket.close()
    finally:
        context.term()
