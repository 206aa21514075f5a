"""A hooked call's answer is held from its first header block until the
stages are done, and then reaches the client whole, in one write
(frames/downstream.py, _header_block; hooked.py)."""

from __future__ import annotations

import asyncio
import struct

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import Flag, FrameType

from .test_connection import _data, _headers, _Routes, _Transport, _turns

MESSAGE = struct.pack(">BI", 0, 3) + b"abc"


class _Recording(_Routes):
    """A stage that, once the runtime answered, waits for ``go`` (recording the call, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            reply = await send(request)
            await self.go.wait()
            return reply

        return (stage,)


def _writes_on(client: _Transport, sid: int) -> list[list[int]]:
    """The frame types of each write to the client that carries frames of ``sid``."""
    out = []
    for data in client.written:
        kinds, pos = [], 0
        while (parsed := fr.parse(data, pos, fr.MAX_FRAME_LIMIT))[0] is not None:
            f, pos = parsed
            if f.stream_id == sid:
                kinds.append(f.type)
        if kinds:
            out.append(kinds)
    return out


async def test_a_hooked_answer_reaches_the_client_whole_once_the_stages_are_done() -> None:
    routes = _Recording()
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, routes, None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.client_data(_headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True))
    await _turns()
    encoder = hpack.Encoder()
    conn.backend_data(  # the runtime's answer, as grpc-go writes a unary one: all at once
        fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, encoder.encode([(":status", "200")]))
        + _data(1, MESSAGE)
        + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encoder.encode([("grpc-status", "0")]))
    )
    await _turns()
    assert _writes_on(client, 1) == []  # nothing of it before the stage is done
    routes.go.set()
    await _turns()
    assert _writes_on(client, 1) == [[FrameType.HEADERS, FrameType.DATA, FrameType.HEADERS]]
    assert conn.hooked == {} and conn.is_idle


def _settings(**values: int) -> bytes:
    ids = {"initial_window": fr.Setting.INITIAL_WINDOW_SIZE}
    return fr.serialize(FrameType.SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


async def test_a_held_answer_goes_once_the_client_lowers_its_window_below_what_is_held() -> None:
    """The runtime may send a stream no more than the client's window: lowered
    below what the proxy holds of an unfinished answer, the runtime stops,
    and the stages would wait for the rest until the gate's time limit."""
    routes = _Recording()
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, routes, None, Limits(max_message=1 << 20))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + _settings(initial_window=65_535))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.client_data(_headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True))
    await _turns()
    part = struct.pack(">BI", 0, 100_000) + b"x" * (40_000 - 5)  # 40,000 bytes of a 100,005-byte answer
    encoder = hpack.Encoder()
    conn.backend_data(
        fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, encoder.encode([(":status", "200")]))
        + b"".join(_data(1, part[i : i + 16_384]) for i in range(0, len(part), 16_384))
    )
    await _turns()
    assert _writes_on(client, 1) == []  # held: under the window, the runtime may send on
    conn.client_data(_settings(initial_window=16_384))
    await _turns()
    assert _writes_on(client, 1) == [[FrameType.HEADERS, FrameType.DATA, FrameType.DATA, FrameType.DATA]]
    routes.go.set()  # the stages finish recording beside it
    await _turns()
