"""A hooked call no stage may change (``Routes.sends_unchanged``) goes to the
runtime as it is read; its stages run beside the runtime's work and still
hold its answer until they are done (frames/hooked.py, upstream.py)."""

from __future__ import annotations

import asyncio
import struct

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import Flag, FrameType

from .test_connection import _data, _headers, _Routes, _Transport, _turns
from .test_hooked_answer import _writes_on

MESSAGE = struct.pack(">BI", 0, 3) + b"abc"


class _Beside(_Routes):
    """Stages that may not change the request: each records what it was told
    and how its call ended, and waits for ``go`` before it sends on (a
    decode, a record being built)."""

    def __init__(self, change: bool = False) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.told: list[bool] = []
        self.seen: list[bytes] = []
        self.ended: list[str] = []
        self.change = change

    def sends_unchanged(self, path: str) -> bool:
        return True

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            self.told.append(context.request_sent)
            self.seen.append(request)
            try:
                await self.go.wait()
                reply = await send(request + b"!" if self.change else request)
            except asyncio.CancelledError:
                self.ended.append("cancelled")
                raise
            except Exception as err:
                self.ended.append(type(err).__name__)
                raise
            self.ended.append("answered")
            return reply

        return (stage,)


def _connection(routes: _Routes, backend_window: int | None = None) -> tuple[FrameConnection, _Transport, _Transport]:
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, routes, None, Limits(max_message=1 << 20))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    settings = b"" if backend_window is None else struct.pack(">HI", 4, backend_window)
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0, settings))
    conn.client_data(fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))  # the runtime's stream window is in force
    backend.written.clear()
    return conn, client, backend


def _answer(sid: int) -> bytes:
    encoder = hpack.Encoder()
    return (
        fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, encoder.encode([(":status", "200")]))
        + _data(sid, MESSAGE)
        + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, encoder.encode([("grpc-status", "0")]))
    )


def _sent(backend: _Transport) -> bytes:
    """What the runtime was sent, but the proxy's own frames (SETTINGS ACKs, window updates)."""
    data, out, pos = b"".join(map(bytes, backend.written)), [], 0
    while (parsed := fr.parse(data, pos, fr.MAX_FRAME_LIMIT))[0] is not None:
        f, end = parsed
        if f.type in (FrameType.HEADERS, FrameType.DATA):
            out.append(data[pos:end])
        pos = end
    return b"".join(out)


async def test_the_request_reaches_the_runtime_as_read_before_the_stages_ran() -> None:
    routes = _Beside()
    conn, client, backend = _connection(routes)
    request = _headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True)
    conn.client_data(request)
    assert _sent(backend) == request  # in this read's write, no loop turn taken
    await _turns()
    assert routes.told == [True]  # the stage knows the runtime has it
    conn.backend_data(_answer(1))
    await _turns()
    assert _writes_on(client, 1) == []  # still held: the stage is not done
    routes.go.set()
    await _turns()
    assert _writes_on(client, 1) == [[FrameType.HEADERS, FrameType.DATA, FrameType.HEADERS]]
    assert _sent(backend) == request  # sent once
    assert conn.hooked == {} and conn.is_idle


async def test_a_request_over_the_runtimes_stream_window_is_sent_by_its_stages() -> None:
    routes = _Beside()
    conn, client, backend = _connection(routes, backend_window=4)
    headers = _headers(hpack.Encoder(), 1)
    conn.client_data(headers + _data(1, MESSAGE, end=True))
    assert _sent(backend) == headers  # the request waits for the stage, then for window
    await _turns()
    assert routes.told == [False]
    routes.go.set()
    await _turns()
    conn.backend_data(fr.window_update(1, 100))
    await _turns()
    assert _sent(backend).endswith(MESSAGE[4:])  # re-framed at the window, all of it sent
    conn.backend_data(_answer(1))
    await _turns()
    assert _writes_on(client, 1) == [[FrameType.HEADERS, FrameType.DATA, FrameType.HEADERS]]


async def test_a_request_that_is_not_one_whole_message_is_left_to_the_stages() -> None:
    routes = _Beside()
    conn, client, backend = _connection(routes)
    headers = _headers(hpack.Encoder(), 1)
    conn.client_data(headers + _data(1, MESSAGE + MESSAGE, end=True))  # two messages for a unary call
    assert _sent(backend) == headers
    await _turns()
    refused = [f for f in _client_frames(client) if f.stream_id == 1 and f.type == FrameType.HEADERS]
    assert refused and conn.hooked == {}  # answered INTERNAL by the proxy, as any hooked call


async def test_a_stage_that_changes_a_request_the_runtime_has_fails_the_call() -> None:
    routes = _Beside(change=True)
    conn, client, backend = _connection(routes)
    request = _headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True)
    conn.client_data(request)
    routes.go.set()
    await _turns()
    assert _sent(backend).startswith(request)  # the changed request never went
    assert b"!" not in _sent(backend)
    assert conn.hooked == {}
    assert any(f.stream_id == 1 for f in _client_frames(client))  # the client learns the call failed


async def test_a_call_behind_an_earlier_hooked_call_in_its_stage_is_not_sent_as_read() -> None:
    """The earlier one may be on the same object and take its lock only later: arrival order holds."""
    routes = _Beside()
    conn, _, backend = _connection(routes)
    encoder = hpack.Encoder()
    first = _headers(encoder, 1) + _data(1, MESSAGE, end=True)
    second = _headers(encoder, 3)
    conn.client_data(first + second + _data(3, MESSAGE, end=True))
    await _turns()
    assert _sent(backend) == first + second  # the first as read; the second's request waits for its stage
    assert routes.told == [True, False]
    routes.go.set()
    await _turns()
    assert _sent(backend).count(MESSAGE) == 2


async def test_a_call_sent_as_read_reaches_its_stages_before_a_call_read_after_it() -> None:
    """Its request completed in the same read as the next call's: its stage starts first (and takes
    its object's lock first, as the runtime got it first), although its task was already waiting."""
    routes = _Beside()
    conn, _, _ = _connection(routes)
    encoder = hpack.Encoder()
    conn.client_data(_headers(encoder, 1))
    await _turns()  # its task waits for the request
    later = struct.pack(">BI", 0, 3) + b"xyz"
    conn.client_data(_data(1, MESSAGE, end=True) + _headers(encoder, 3) + _data(3, later, end=True))
    await _turns()
    assert routes.seen == [MESSAGE[5:], later[5:]]
    assert routes.told == [True, False]


async def test_a_client_leaving_after_its_call_went_as_read_is_told_to_the_stages() -> None:
    """The runtime may have acted: the stages learn the call failed (and re-check), they are not cancelled."""
    routes = _Beside()
    conn, _, backend = _connection(routes)
    conn.client_data(_headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True)
                     + fr.rst_stream(1, fr.ErrorCode.CANCEL))
    routes.go.set()
    await _turns()
    assert routes.ended == ["BackendFailed"]
    assert conn.hooked == {} and conn.is_idle
    assert fr.rst_stream(1, fr.ErrorCode.CANCEL) in b"".join(map(bytes, backend.written))


async def test_a_request_over_the_runtimes_connection_window_is_sent_by_its_stages() -> None:
    routes = _Beside()
    conn, _, backend = _connection(routes, backend_window=1 << 20)  # a stream window it fits
    body = struct.pack(">BI", 0, 70_000) + b"x" * 70_000  # over the connection's initial 65,535
    headers = _headers(hpack.Encoder(), 1)
    frames = fr.data_frames(1, body, fr.DEFAULT_MAX_FRAME, True)
    conn.client_data(headers + b"".join(frames))
    assert _sent(backend) == headers
    routes.go.set()
    await _turns()
    conn.backend_data(fr.window_update(0, 1 << 20))
    await _turns()
    assert routes.told == [False]
    sent = _sent(backend)
    data, pos = b"", 0
    while (parsed := fr.parse(sent, pos, fr.MAX_FRAME_LIMIT))[0] is not None:
        f, pos = parsed
        if f.type == FrameType.DATA:
            data += bytes(f.payload)
    assert len(data) == len(body) and data == body, (len(data), len(body))


def _client_frames(client: _Transport) -> list[fr.Frame]:
    data, out, pos = b"".join(map(bytes, client.written)), [], 0
    while (parsed := fr.parse(data, pos, fr.MAX_FRAME_LIMIT))[0] is not None:
        f, pos = parsed
        out.append(f)
    return out
