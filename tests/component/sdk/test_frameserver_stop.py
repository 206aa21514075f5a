"""The SDK's frames transport (hooks.frameserver) as it stops: open calls finish within
the grace and what outlives it is cancelled, a connection accepted meanwhile is closed too,
and a stream opened meanwhile is refused; and as its peer goes away (GOAWAY).

Against grpc.aio clients and hand-driven HTTP/2 peers; the grpc.aio transport where both
are compared.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from grpc import aio

from hooks.frameserver import FrameServer

from ..rawh2 import (
    DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, RST_STREAM, RawPeer, frame, grpc_call, literal_headers, open_call,
    raw_with_settings,
)
from . import scriptedserver
from .scriptedserver import LIMIT, PRE_CREATE, Scripted, call_outcome, hook_request_bytes

frames = scriptedserver.frames  # the fixtures, here for pytest to find
server = scriptedserver.server


async def test_stop_lets_open_calls_finish_within_grace_and_refuses_new_ones(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        call = asyncio.ensure_future(call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("wait")))
        await asyncio.wait_for(server.started.wait(), 5)
        stopping = asyncio.ensure_future(server.stop(5))
        await asyncio.sleep(0)  # stop has begun: the socket is closed to new callers
        server.release.set()
        assert (await call)[0] == "OK"
        await asyncio.wait_for(stopping, 5)
        assert await server.wait_for_termination(0) is False
        assert (await call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("none"), timeout=2))[0] in (
            "UNAVAILABLE", "DEADLINE_EXCEEDED")
    assert not Path(server.socket_path).exists()


async def test_stop_cancels_what_outlives_the_grace(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        call = asyncio.ensure_future(call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("wait")))
        await asyncio.wait_for(server.started.wait(), 5)
        await asyncio.wait_for(server.stop(0.2), 5)
        assert server.cancelled.is_set()
        assert (await call)[0] in ("UNAVAILABLE", "CANCELLED", "INTERNAL")


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_stop_with_no_grace_cancels_at_once(sock_dir: Path, transport: str) -> None:
    hook_server = Scripted(sock_dir / f"n-{transport}.sock", transport)
    hook_server._grace = None  # grpc.aio's meaning: abort every call now
    await hook_server.start()
    async with aio.insecure_channel(hook_server.target) as channel:
        call = asyncio.ensure_future(call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("wait")))
        await asyncio.wait_for(hook_server.started.wait(), 5)
        await asyncio.wait_for(hook_server.stop(), 5)
        assert hook_server.cancelled.is_set()
        assert (await call)[0] != "OK"


async def test_a_connection_accepted_as_the_server_stops_is_closed_too(sock_dir: Path) -> None:
    path = sock_dir / "race.sock"
    server = FrameServer({}, max_receive=LIMIT, max_send=LIMIT)
    stopping: list[asyncio.Task[None]] = []
    accepted = asyncio.Event()
    make = server._connection

    def accept_while_stopping():  # type: ignore[no-untyped-def]
        conn = make()
        stopping.append(asyncio.ensure_future(server.stop(0)))  # before the loop has connected it
        accepted.set()
        return conn

    server._connection = accept_while_stopping  # type: ignore[method-assign]
    await server.start(path)
    peer = RawPeer(*await asyncio.open_unix_connection(str(path)))
    await asyncio.wait_for(accepted.wait(), 5)
    await asyncio.wait_for(stopping[0], 5)
    while (f := await peer.read()) is not None:  # whatever came before, the connection ends
        assert f[0] != HEADERS
    peer.writer.transport.abort()


async def test_late_trailers_of_a_refused_stream_are_ignored(frames: Scripted) -> None:
    # The server is going away: a new stream is refused, and its client's trailers must not end the connection.
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method, hook_request_bytes("wait")))
    await asyncio.wait_for(frames.started.wait(), 5)
    stopping = asyncio.ensure_future(frames.stop(10))
    await peer.until(GOAWAY)
    peer.writer.write(open_call(3, PRE_CREATE.full_method))
    assert (await peer.until(RST_STREAM, 3))[-1][2] == 3
    peer.writer.write(frame(HEADERS, END_HEADERS | END_STREAM, 3, literal_headers([("grpc-status", "0")])))
    frames.release.set()  # stream 1, let finish by the graceful stop, is still answered
    seen = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    blocks = [dict(peer.decoder.decode(f[3])) for f in seen if f[0] == HEADERS]
    assert blocks[-1] == {"grpc-status": "0"}
    await asyncio.wait_for(stopping, 5)


async def test_a_peers_goaway_lets_its_open_call_finish_then_closes(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 0)))
    message = hook_request_bytes("2")
    peer.writer.write(frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(message)) + message))
    answer = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
    assert await peer.read() is None
    await peer.close()
