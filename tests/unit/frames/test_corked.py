"""A hooked call's header block leaves with its request when no hook has to be
asked first: one write to the runtime, not two (frames/inbound.py, Corked)."""

from __future__ import annotations

import asyncio
import struct

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import FrameType
from runtimeproxy.frames.inbound import Corked

from .test_connection import _data, _headers, _Routes, _Transport, _turns

MESSAGE = struct.pack(">BI", 0, 3) + b"abc"


def _frames_by_write(backend: _Transport) -> list[list[tuple[int, int]]]:
    """(type, stream) of the frames of each write after the connection's start."""
    out = []
    for data in backend.written:
        frames, pos = [], 0
        if data.startswith(fr.PREFACE):
            continue
        while (parsed := fr.parse(data, pos, fr.MAX_FRAME_LIMIT))[0] is not None:
            f, pos = parsed
            frames.append((f.type, f.stream_id))
        out.append(frames)
    return out


class _Waiting(_Routes):
    """A stage that waits for ``go`` before it sends the request on (a hook being asked)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    def hooked(self, path: str):  # type: ignore[no-untyped-def]
        async def stage(request, context, send):  # type: ignore[no-untyped-def]
            await self.go.wait()
            return await send(request)

        return (stage,)


def _connection(routes: _Routes) -> tuple[FrameConnection, _Transport]:
    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, routes, None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    backend.written.clear()
    return conn, backend


async def test_a_hooked_calls_header_block_and_request_reach_the_runtime_in_one_write() -> None:
    conn, backend = _connection(_Routes())  # its stage sends the request on at once
    conn.client_data(_headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True))
    assert backend.written == []  # held for the call's first step
    await _turns()
    writes = [w for w in _frames_by_write(backend) if (FrameType.HEADERS, 1) in w]
    assert writes == [[(FrameType.HEADERS, 1), (FrameType.DATA, 1)]]


async def test_a_header_block_is_not_held_while_a_hook_is_asked() -> None:
    routes = _Waiting()
    conn, backend = _connection(routes)
    conn.client_data(_headers(hpack.Encoder(), 1) + _data(1, MESSAGE, end=True))
    await _turns()
    assert _frames_by_write(backend) == [[(FrameType.HEADERS, 1)]]  # went after the first step, alone
    routes.go.set()
    await _turns()
    assert _frames_by_write(backend)[1:] == [[(FrameType.DATA, 1)]]
    assert not conn.closed.done()


async def test_writes_held_when_the_connection_closes_go_nowhere() -> None:
    transport = _Transport()
    corked = Corked(transport)  # type: ignore[arg-type]
    corked.hold()
    corked.write(b"held")
    corked.close()
    await _turns()
    assert transport.written == [] and transport.closed


async def test_writes_are_held_to_the_end_of_the_turn_in_order() -> None:
    transport = _Transport()
    corked = Corked(transport)  # type: ignore[arg-type]
    corked.write(b"a")  # not held: at once
    corked.hold()
    corked.write(b"b")
    corked.hold()  # already holding: one release
    corked.write(memoryview(b"xcx")[1:2])
    assert transport.written == [b"a"]
    await _turns(1)
    assert transport.written == [b"a", b"bc"]


async def test_writes_held_when_the_transport_closed_by_itself_go_nowhere() -> None:
    transport = _Transport()
    corked = Corked(transport)  # type: ignore[arg-type]
    corked.hold()
    corked.write(b"held")
    transport.closed = True  # uvloop closed it on a socket error; the protocol hears a turn later
    await _turns()  # no write to a closed transport (uvloop would raise in the callback)
    assert transport.written == []


async def test_window_given_back_to_the_runtime_rides_with_the_next_write() -> None:
    """The runtime's connection window comes back with a request, not in a write of its own."""
    from runtimeproxy.frames.inbound import CREDIT_URGENT

    transport = _Transport()
    corked = Corked(transport)  # type: ignore[arg-type]
    corked.credit(300_000)
    assert transport.written == []
    corked.write(b"request")
    assert transport.written == [fr.window_update(0, 300_000) + b"request"]
    corked.credit(CREDIT_URGENT - 1)
    corked.credit(1)  # owed too much to wait for a write
    assert transport.written[1:] == [fr.window_update(0, CREDIT_URGENT)]
    corked.write(b"next")
    assert transport.written[2:] == [b"next"]


async def test_a_connection_gives_the_runtime_window_back_with_its_next_request() -> None:
    """Relayed answers free the runtime's window as they leave; the update
    goes with the client's next request (test_connection's relayed call)."""
    from runtimeproxy.frames.connection import CREDIT_BATCH

    client, backend = _Transport(), _Transport()
    conn = FrameConnection(client, backend, _Routes(), None, Limits(max_message=1 << 20))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.credit_backend(CREDIT_BATCH)
    written = len(backend.written)
    assert b"".join(map(bytes, backend.written)).count(fr.window_update(0, CREDIT_BATCH)) == 0
    conn.client_data(fr.serialize(FrameType.PING, 0, 0, b"12345678"))  # a frame the proxy answers: no backend write
    assert len(backend.written) == written
    encoder = hpack.Encoder()
    conn.client_data(_headers(encoder, 1) + _data(1, MESSAGE, end=True))
    await _turns()
    assert fr.window_update(0, CREDIT_BATCH) in b"".join(map(bytes, backend.written[written:]))


async def test_window_owed_during_a_hold_goes_with_the_release_even_with_nothing_held() -> None:
    from runtimeproxy.frames.inbound import CREDIT_URGENT

    transport = _Transport()
    corked = Corked(transport)  # type: ignore[arg-type]
    corked.hold()
    corked.credit(CREDIT_URGENT)  # too much to wait for a write, but the writes are held
    assert transport.written == []
    await _turns(1)
    assert transport.written == [fr.window_update(0, CREDIT_URGENT)]


async def test_window_owed_rides_with_held_writes_and_large_data_is_not_copied_for_it() -> None:
    from runtimeproxy.frames.inbound import CREDIT_BATCH

    transport = _Transport()
    corked = Corked(transport)  # type: ignore[arg-type]
    corked.credit(CREDIT_BATCH - 1)  # too little to cost a frame
    corked.write(b"first")
    assert transport.written == [b"first"]
    corked.hold()
    corked.write(b"block")
    corked.credit(1)
    await _turns(1)
    assert transport.written[1:] == [fr.window_update(0, CREDIT_BATCH) + b"block"]
    corked.credit(CREDIT_BATCH)
    large = b"x" * 70_000
    corked.write(large)
    assert transport.written[2:] == [fr.window_update(0, CREDIT_BATCH), large]
