"""A FrameConnection driven frame by frame, with fake transports: the hooked
call's ends the component tests cannot time (frames/connection.py, upstream.py, hooked.py)."""

from __future__ import annotations

import asyncio
import struct

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType

PODS = "/runtime.v1.RuntimeService/ListPodSandbox"


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _pass_on(request, context, send):  # type: ignore[no-untyped-def]
    return await send(request)


class _Routes:
    def fast(self, path: str) -> bool:
        return False

    def unary(self, path: str) -> bool:
        return True

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        return (_pass_on,)

    def measure(self, path: str) -> None:
        return None


def _connection() -> tuple[FrameConnection, _Transport, _Transport, hpack.Encoder]:
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, _Routes(), None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    return conn, client, backend, hpack.Encoder()


def _headers(encoder: hpack.Encoder, sid: int) -> bytes:
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", PODS), (":authority", "x"),
                            ("content-type", "application/grpc"), ("te", "trailers")])
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block)


def _data(sid: int, payload: bytes, end: bool = False) -> bytes:
    return fr.serialize(FrameType.DATA, Flag.END_STREAM if end else 0, sid, payload)


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _client_frames(client: _Transport) -> list[fr.Frame]:
    data, out, pos = b"".join(client.written), [], 0
    while True:
        f, pos = fr.parse(data, pos, fr.MAX_FRAME_LIMIT)
        if f is None:
            return out
        out.append(f)


async def test_a_hooked_call_refused_before_its_task_ran_frees_its_slot() -> None:
    conn, client, _, encoder = _connection()
    # Its header block and an oversized message in one read: refused at once.
    conn.client_data(_headers(encoder, 1) + _data(1, struct.pack(">BI", 0, 1000) + b"x" * 10))
    await _turns()
    assert conn.hooked == {} and conn.idle.is_set()
    assert any(f.type == FrameType.HEADERS and f.stream_id == 1 for f in _client_frames(client))


async def test_a_hooked_request_cut_short_by_the_runtime_ends_its_call() -> None:
    conn, _, _, encoder = _connection()
    conn.client_data(_headers(encoder, 1) + _data(1, struct.pack(">BI", 0, 20) + b"x" * 10))  # half of it
    await _turns()
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0) + fr.rst_stream(1, ErrorCode.REFUSED_STREAM))
    conn.client_data(_data(1, b"y" * 10, end=True))  # the rest, already on its way: goes nowhere
    await _turns()
    assert conn.hooked == {} and conn.idle.is_set() and not conn.closed.done()


async def test_a_unary_request_is_one_message_at_most() -> None:
    conn, client, _, encoder = _connection()
    small = struct.pack(">BI", 0, 60) + b"m" * 60  # under the limit, twice over it together
    conn.client_data(_headers(encoder, 1) + _data(1, small) + _data(1, small))
    await _turns()
    assert conn.hooked == {}
    ending = [f for f in _client_frames(client) if f.type == FrameType.HEADERS and f.stream_id == 1]
    assert ending and b"grpc-status" in b"".join(
        k for k, _ in hpack.Decoder().decode(bytes(ending[-1].payload), raw=True)
    )


async def test_the_streams_the_proxy_ended_are_remembered_within_a_bound() -> None:
    from runtimeproxy.frames import connection

    conn, _, _, _ = _connection()
    for sid in range(1, 2 * connection.ENDED_KEPT + 2, 2):
        conn.mark_ended(sid)
    assert len(conn.ended) <= connection.ENDED_KEPT
    assert 2 * connection.ENDED_KEPT + 1 in conn.ended and 1 not in conn.ended  # the newest kept
