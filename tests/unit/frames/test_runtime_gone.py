"""The runtime closes its connection while the client's stays (a diverted
call keeps it): calls it had not answered end UNAVAILABLE, one it had
answered whole is released once its stages have recorded it."""

from __future__ import annotations

import asyncio
import struct

import hpack
import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import Flag, FrameType

from .test_connection import PODS, _data, _HeldAnswer, _request, _Routes, _Transport, _turns, _written_frames

MESSAGE = struct.pack(">BI", 0, 3) + b"abc"
STATUS = "/runtime.v1.RuntimeService/Status"  # diverted: answered by the proxy's own server


class _Recording(_Routes):
    """ListPodSandbox is hooked; its stage records until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.outcomes: list[str] = []

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        if path != PODS:
            return None

        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            try:
                reply = await send(request)
                await self.go.wait()
            except BaseException as exc:
                self.outcomes.append(type(exc).__name__)
                raise
            self.outcomes.append("recorded")
            return reply

        return (stage,)


def _endings(client: _Transport) -> dict[int, list[bytes]]:
    """Per stream, the grpc-status of each block that ended it."""
    decoder, ends = hpack.Decoder(), {}
    for f in _written_frames(client):
        if f.type == FrameType.HEADERS:
            headers = dict(decoder.decode(bytes(f.payload), raw=True))
            if f.has(Flag.END_STREAM):
                ends.setdefault(f.stream_id, []).append(headers.get(b"grpc-status"))
    return ends


async def _connection(routes: _Recording) -> tuple[FrameConnection, _Transport, hpack.Encoder, hpack.Encoder]:
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, routes, _HeldAnswer(), Limits(max_message=1 << 20))
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    return conn, client, hpack.Encoder(), hpack.Encoder()


def _whole_answer(encoder: hpack.Encoder, sid: int) -> bytes:
    return (fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, encoder.encode([(":status", "200")]))
            + _data(sid, MESSAGE)
            + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid,
                           encoder.encode([("grpc-status", "0")])))


@pytest.mark.parametrize("diverted", [True, False])
async def test_an_answer_the_runtime_gave_whole_is_recorded_and_goes_once(diverted: bool) -> None:
    routes = _Recording()
    conn, client, cenc, benc = await _connection(routes)
    hooked = _request(cenc, 1, PODS)[:-14] + _data(1, MESSAGE, end=True)
    conn.client_data(hooked + (_request(cenc, 3, STATUS) if diverted else b""))  # (encoded in the order sent)
    await _turns()
    conn.backend_data(_whole_answer(benc, 1))
    await _turns()

    conn.backend_gone()
    await _turns()
    assert routes.outcomes == []  # still recording: not cancelled
    assert 1 not in _endings(client)  # held until it is recorded, not ended in its place
    assert not conn.closed.done()
    routes.go.set()
    await _turns(20)
    assert routes.outcomes == ["recorded"]
    assert _endings(client)[1] == [b"0"]  # the runtime's answer, once
    assert conn.closed.done() is not diverted  # closed once nothing is left to answer


async def test_a_call_the_runtime_had_not_answered_ends_unavailable() -> None:
    routes = _Recording()
    conn, client, cenc, _ = await _connection(routes)
    conn.client_data(_request(cenc, 1, PODS)[:-14] + _data(1, MESSAGE, end=True) + _request(cenc, 3, STATUS))
    await _turns()
    conn.backend_gone()
    await _turns(20)
    assert routes.outcomes == ["CancelledError"]
    assert _endings(client)[1] == [b"14"]
