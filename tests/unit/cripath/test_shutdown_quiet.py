"""A shutdown's quiet period (Proxy._stop_accepting): it waits for calls,
and with socket activation for the relayed connections too, so that a
client accepted just before the shutdown does not lose its first calls."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from runtimeproxy.cripath.activation import ActivatedListener
from runtimeproxy.cripath.router import HeldCalls


async def test_quiet_waits_while_the_activity_changes() -> None:
    marks = 0
    done = asyncio.Event()

    async def busy() -> None:
        nonlocal marks
        for _ in range(15):
            marks += 1
            await asyncio.sleep(0.01)
        done.set()

    task = asyncio.ensure_future(busy())
    await HeldCalls().until_quiet(0.05, 5.0, lambda: marks)
    assert done.is_set()
    await task


async def test_quiet_waits_while_the_activity_is_not_settled() -> None:
    settled = False

    def mark() -> int | None:
        return 0 if settled else None

    waiting = asyncio.ensure_future(HeldCalls().until_quiet(0.02, 5.0, mark))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # None is never quiet
    settled = True
    await asyncio.wait_for(waiting, 5.0)


async def test_quiet_is_bounded_by_its_limit() -> None:
    await asyncio.wait_for(HeldCalls().until_quiet(0.02, 0.1, lambda: None), 5.0)


@pytest.fixture
async def sockets() -> AsyncIterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory(prefix="q") as directory:  # short: unix socket paths
        yield Path(directory) / "public.sock", Path(directory) / "grpc.sock"


@contextlib.asynccontextmanager
async def relayed(sockets: tuple[Path, Path], grpc_side: Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                  Awaitable[None]]) -> AsyncIterator[ActivatedListener]:
    """An activation relay accepting on the public socket, in front of ``grpc_side`` on the private one."""
    public, private = sockets
    server = await asyncio.start_unix_server(grpc_side, str(private))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(public))
    sock.listen()
    listener = ActivatedListener(sock, private, hand_over=False)  # the fake grpc side speaks no HTTP/2
    await listener.start_accepting()
    try:
        yield listener
    finally:
        listener.stop_accepting()
        await listener.close()
        server.close()
        await server.wait_closed()


async def test_a_connection_is_unsettled_until_grpc_speaks(sockets: tuple[Path, Path]) -> None:
    public = sockets[0]
    speak = asyncio.Event()
    upstream_seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def grpc_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await upstream_seen.put(await reader.read(100))
        await speak.wait()
        writer.write(b"SETTINGS")
        await writer.drain()
        while data := await reader.read(100):  # until the client leaves
            await upstream_seen.put(data)
        writer.close()

    async with relayed(sockets, grpc_side) as listener:
        assert listener.traffic.mark() == 0  # nothing accepted: settled
        reader, writer = await asyncio.open_unix_connection(str(public))
        writer.write(b"PREFACE")
        assert await asyncio.wait_for(upstream_seen.get(), 5.0) == b"PREFACE"
        assert listener.traffic.mark() is None  # the client waits for grpc's first bytes
        speak.set()
        assert await asyncio.wait_for(reader.readexactly(8), 5.0) == b"SETTINGS"
        first = listener.traffic.mark()
        assert first is not None
        writer.write(b"HEADERS")
        assert await asyncio.wait_for(upstream_seen.get(), 5.0) == b"HEADERS"
        assert listener.traffic.mark() not in (None, first)  # a read: not quiet since
        writer.close()
        await writer.wait_closed()


async def test_a_connection_ended_both_ways_is_closed_and_settled(sockets: tuple[Path, Path]) -> None:
    public = sockets[0]
    reached = asyncio.Event()
    left = asyncio.Event()

    async def grpc_side(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.set()
        await reader.read()  # never speaks; until the relay closes
        writer.close()
        left.set()

    async with relayed(sockets, grpc_side) as listener:
        reader, writer = await asyncio.open_unix_connection(str(public))
        await asyncio.wait_for(reached.wait(), 5.0)
        assert listener.traffic.mark() is None
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # the relay closed the connection
        assert left.is_set()
        assert listener.traffic.mark() is not None  # both ways ended: the relay closed both sockets
        writer.close()
