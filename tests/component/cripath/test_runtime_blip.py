"""A runtime that is down a few seconds and comes back serving the same CRI
versions (a containerd restart): on the frames data path, kubelet's calls on
new connections are served as soon as it listens again, each relayed on its
connection's own fresh runtime connection, although the proxy's own channel
still waits out its reconnect backoff (up to 0.6 s: channelopts.RECONNECT_MAX_S
and grpc's jitter) and has not probed the
runtime again. (Handed to the router meanwhile, they were answered UNAVAILABLE
at once by that channel, for up to its whole backoff.)

The grpc data path sends every call on that channel, so it has no such
promise: the calls there fail UNAVAILABLE until it reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
from grpc import aio

from ..fakes import FakeBackend

V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
# Failed connection attempts of the proxy's channel (initial backoff 0.1 s,
# times 1.6 each, +-20%): after the seventh it waits at least 0.1 * 1.6**6 *
# 0.8 = 1.3 s, a window a dozen 100 ms polls measure.
ATTEMPTS = 7


async def code_of(socket: Path, path: str) -> grpc.StatusCode:
    async with aio.insecure_channel(f"unix://{socket}") as channel:  # a new connection, as after kubelet's redial
        try:
            await channel.unary_unary(path)(b"", timeout=5)
        except aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK


async def refuse_connections(socket: Path, count: int) -> None:
    """Be a runtime socket that drops each connection at once (as a dead
    runtime does, but countable) until ``count`` attempts have come: the
    connecting channel's backoff then has grown that many times."""
    came = 0
    enough = asyncio.Event()

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal came
        writer.close()
        came += 1
        if came >= count:
            enough.set()

    server = await asyncio.start_unix_server(drop, path=str(socket))
    try:
        await asyncio.wait_for(enough.wait(), 15)
    finally:
        server.close()
        await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()  # for the runtime that comes back


async def test_calls_on_new_connections_are_served_while_the_proxys_channel_waits_out_its_reconnect_backoff(
    sock_dir: Path, start_proxy
) -> None:
    socket, proxy_socket = sock_dir / "b.sock", sock_dir / "proxy.sock"
    lost = asyncio.Event()
    async with FakeBackend(socket):
        proxy = await start_proxy(socket, data_path="frames")
        assert await code_of(proxy_socket, V1_LIST) == grpc.StatusCode.OK
        proxy.backend.on_lost(lost.set)
    await asyncio.wait_for(lost.wait(), 10)
    await refuse_connections(socket, ATTEMPTS)
    async with FakeBackend(socket) as new:
        start = time.monotonic()
        polls: list[tuple[float, str, bool]] = []  # (seconds since it listens, code, runtime unprobed then)
        async with asyncio.timeout(15):
            while not polls or polls[-1][2]:  # kubelet's polling, until a call after the proxy's re-probe
                unprobed = proxy.backend.unprobed()
                code = await code_of(proxy_socket, V1_LIST)
                polls.append((round(time.monotonic() - start, 2), code.name, unprobed))
                await asyncio.sleep(0.1)
        assert polls[0][2], f"the first call came after the re-probe: no window measured: {polls}"
        assert all(code == "OK" for _, code, _ in polls), polls
        assert len(new.calls(V1_LIST)) == len(polls)  # each served by the runtime
        assert not proxy.backend.unprobed()
