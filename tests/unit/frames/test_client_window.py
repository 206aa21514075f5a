"""The client's DATA is bounded by the connection window the proxy gave it
(RFC 9113 6.9.1): while the runtime reads slowly, a client that keeps to it
waits, one that sends past it ends its connection (FLOW_CONTROL_ERROR)
instead of filling the proxy's memory."""

from __future__ import annotations

import struct

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType
from runtimeproxy.frames.upstream import CLIENT_WINDOW
from tests.frameroutes import Routes

from .test_connection import _Transport, _written_frames


def _upload() -> tuple[FrameConnection, _Transport]:
    """A client-streaming call to a runtime that gives no window back."""
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, Routes(unary=False), None, Limits(max_message=1 << 30))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/runtime.v1.ImageService/Upload"),
                                    (":authority", "x"), ("content-type", "application/grpc")])
    conn.client_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, block)
                     + fr.serialize(FrameType.DATA, 0, 1, struct.pack(">BI", 0, 1 << 29)))
    return conn, client


def _send(conn: FrameConnection, size: int) -> None:
    for start in range(0, size, 1 << 20):
        conn.client_data(b"".join(fr.data_frames(1, b"x" * min(1 << 20, size - start), 16384, False)))


async def test_a_client_within_its_window_waits_for_the_runtime() -> None:
    conn, _ = _upload()
    _send(conn, CLIENT_WINDOW - 5)  # all it was given (the message prefix took 5)
    assert not conn.closed.done() and conn.inbound.owed > CLIENT_WINDOW - fr.DEFAULT_WINDOW - 5


async def test_a_client_past_its_window_ends_its_connection() -> None:
    conn, client = _upload()
    _send(conn, CLIENT_WINDOW + (1 << 20))
    assert conn.closed.done()
    goaway = [f for f in _written_frames(client) if f.type == FrameType.GOAWAY]
    assert int.from_bytes(goaway[0].payload[4:8], "big") == ErrorCode.FLOW_CONTROL_ERROR
