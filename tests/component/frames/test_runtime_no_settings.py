"""A runtime that accepts a frames connection and never sends its SETTINGS:
past silent.SETTINGS_WAIT_S the client gets an empty SETTINGS and a GOAWAY
that says no stream was processed (a gRPC client retries its calls on a new
connection), the connection ends, and the proxy's gate is told (frames/silent.py).

Before: the client waited for its calls' deadlines with nothing said, and
hooked calls kept being let through to such a runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from grpc import aio

from runtimeproxy.cripath.unready import Unready
from runtimeproxy.frames import silent
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.listener import FramesListener
from runtimeproxy.frames.path import FramesPath
from tests.frameroutes import Routes
from tests.silences import Told

from .. import rawh2
from .test_listener_stop import _SilentRuntime, runtimes  # noqa: F401 - the fixture

PODS = "/runtime.v1.RuntimeService/ListPodSandbox"


@contextlib.asynccontextmanager
async def _called(sock_dir: Path, runtime: Path, told: Told) -> AsyncIterator[tuple[FramesListener, rawh2.RawPeer]]:
    """A listener to ``runtime`` telling ``told`` of its silence, and a client
    that has sent its SETTINGS and opened a call on it; stopped on leaving."""
    listener = FramesListener(sock_dir / "proxy.sock", runtime, sock_dir / "unused.sock", Routes(), [],
                              Limits(max_message=1 << 20), runtime_silent=told)
    await listener.start()
    try:
        peer = await rawh2.RawPeer.connect(sock_dir / "proxy.sock")
        peer.writer.write(rawh2.frame(rawh2.SETTINGS, 0, 0, b"") + rawh2.open_call(1, PODS))
        yield listener, peer
    finally:
        listener.stop_accepting()
        await listener.drain(0)


async def test_a_runtime_that_sends_no_settings_is_taken_as_unreachable_and_the_client_told_to_go(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setattr(silent, "SETTINGS_WAIT_S", 0.3)
    path, accepted = runtimes
    told = Told()
    async with _called(sock_dir, path, told) as (_, peer):
        await accepted.get()
        frames = await peer.until(rawh2.GOAWAY)
        assert frames[0][0] == rawh2.SETTINGS and frames[0][3] == b""  # an empty server preface
        last, code = struct.unpack(">II", frames[-1][3][:8])
        assert (last, code) == (0, 0)  # no stream processed: the client may retry them all
        assert b"sent no SETTINGS within 0.3 s" in frames[-1][3][8:]
        assert await peer.read() is None  # and the connection is closed
        assert told.told == 1
        await peer.close()


async def test_a_runtime_that_sends_its_settings_late_but_in_time_is_relayed(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]]  # noqa: F811
) -> None:
    """A guard: the bound is on the runtime's silence, not on the connection.
    The runtime speaks only once the client's call has reached it (late), but
    within the bound: the bound's timer is cancelled, so no GOAWAY can come."""
    path, accepted = runtimes
    told = Told()
    async with _called(sock_dir, path, told) as (listener, peer):
        runtime = await accepted.get()
        async with asyncio.timeout(5):
            while PODS.encode() not in runtime.read:  # the call's headers, relayed as they are
                await runtime.arrived.wait()
                runtime.arrived.clear()
        [conn] = listener._connections
        timer = conn.settings_wait
        assert timer is not None and not timer.cancelled()
        runtime.speak()
        assert (await peer.read())[0] == rawh2.SETTINGS  # type: ignore[index]
        assert timer.cancelled() and conn.settings_wait is None and told.told == 0
        await peer.close()


async def test_the_frames_path_tells_the_routers_unready_and_warns_once_per_episode(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """FramesPath wires the listener's silent runtimes to the router's Unready
    (so hooked calls are refused on both paths); each client connection meets
    the bound again: the first silence warns, the next is a debug line until
    the runtime serves again."""
    monkeypatch.setattr(silent, "SETTINGS_WAIT_S", 0.2)
    path, accepted = runtimes
    unready = Unready(path)  # nothing asks this runtime's Status here
    router = SimpleNamespace(unready=unready, plan=SimpleNamespace(routes={}), stages=(), calls=None)
    frames = FramesPath(router, path, None, [], Limits(max_message=1 << 20))  # type: ignore[arg-type]
    server = aio.server()
    caplog.set_level(logging.DEBUG, "runtimeproxy.frames.connection")

    async def a_silent_connection() -> None:
        peer = await rawh2.RawPeer.connect(sock_dir / "proxy.sock")
        peer.writer.write(rawh2.frame(rawh2.SETTINGS, 0, 0, b""))
        await accepted.get()
        await peer.until(rawh2.GOAWAY)
        await peer.close()

    caplog.set_level(logging.DEBUG, "runtimeproxy.cripath.unready")

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "sent no HTTP/2 SETTINGS in time" in r.getMessage()]

    def levels() -> list[int]:
        return [r.levelno for r in lines()]

    def unreadys(start: str) -> list[int]:
        return [r.levelno for r in caplog.records if r.name.endswith("unready") and r.getMessage().startswith(start)]

    await frames.start(server, sock_dir / "proxy.sock")
    try:
        await frames.start_accepting()
        await a_silent_connection()
        assert unready.reason == silent.REASON
        await a_silent_connection()
        assert levels() == [logging.WARNING, logging.DEBUG]
        # Each line names its client, as the connection's other lines do (before: this one did not).
        assert [getattr(r, "client_pid", None) for r in lines()] == [os.getpid()] * 2
        # The warning is the frames path's: Unready's start line is a debug one
        # (before: a second warning), its end an INFO one, the end of what was warned of.
        assert unreadys("the runtime does not serve") == [logging.DEBUG]
        unready.ready()  # it answered a Status: a new silence is news again
        assert unreadys("the runtime serves calls") == [logging.INFO]
        await a_silent_connection()
        assert levels() == [logging.WARNING, logging.DEBUG, logging.WARNING]
    finally:
        frames.stop_accepting()
        await frames.drain(0)
        await server.stop(0)


async def test_a_client_back_while_the_runtime_is_known_silent_is_told_at_once_and_relayed_once_it_answers(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    """kubelet retries after the GOAWAY, on a new connection to the same
    runtime: while it is known silent (no Status answered since) that
    connection is told to go away after the short bound (before: held the
    full SETTINGS_WAIT_S again, each time). A runtime that speaks again is
    used at once, Status or not; once it answered a Status, the next
    connection has the full bound again and is relayed."""
    monkeypatch.setattr(silent, "SETTINGS_WAIT_S", 0.2)
    path, accepted = runtimes
    unready = Unready(path)  # nothing asks this runtime's Status here: the test says when it answered
    router = SimpleNamespace(unready=unready, plan=SimpleNamespace(routes={}), stages=(), calls=None)
    frames = FramesPath(router, path, None, [], Limits(max_message=1 << 20))  # type: ignore[arg-type]
    server = aio.server()
    loop = asyncio.get_running_loop()

    async def connect() -> rawh2.RawPeer:
        peer = await rawh2.RawPeer.connect(sock_dir / "proxy.sock")
        peer.writer.write(rawh2.frame(rawh2.SETTINGS, 0, 0, b"") + rawh2.open_call(1, PODS))
        return peer

    async def relayed(runtime: _SilentRuntime) -> None:
        async with asyncio.timeout(5):
            while PODS.encode() not in runtime.read:  # the call's headers, relayed as they are
                await runtime.arrived.wait()
                runtime.arrived.clear()

    def open_connections() -> list[FrameConnection]:
        """The listener's relayed connections not closed (a closed one may be forgotten a turn later)."""
        assert frames.listener is not None
        return [c for c in frames.listener._connections if not c.closed.done()]

    await frames.start(server, sock_dir / "proxy.sock")
    try:
        await frames.start_accepting()
        peer = await connect()
        await accepted.get()
        await peer.until(rawh2.GOAWAY)  # the first silence: the full bound (0.2 s here)
        await peer.close()
        assert unready.reason == silent.REASON

        # From here the full bound is beyond the test's patience: a GOAWAY can only be the short bound's.
        monkeypatch.setattr(silent, "SETTINGS_WAIT_S", 600.0)
        peer = await connect()
        await accepted.get()
        async with asyncio.timeout(10):
            got = await peer.until(rawh2.GOAWAY)
        assert got[0][0] == rawh2.SETTINGS and got[0][3] == b""
        last, code = struct.unpack(">II", got[-1][3][:8])
        assert (last, code) == (0, 0)  # no stream processed: the client may retry them all
        assert f"sent no SETTINGS within {silent.KNOWN_SILENT_WAIT_S:g} s".encode() in got[-1][3][8:]
        assert await peer.read() is None
        await peer.close()
        # Still known silent, the reason the first silence's, naming the full
        # bound (before: '... within 0.5 s', and no longer known silent).
        assert unready.reason == silent.REASON

        # The runtime speaks again, before any Status answered: this connection is relayed at once.
        peer = await connect()
        runtime = await accepted.get()
        runtime.speak()
        assert (await peer.read())[0] == rawh2.SETTINGS  # type: ignore[index]
        await relayed(runtime)
        [conn] = open_connections()
        assert conn.settings_wait is None and not conn.closed.done()
        await peer.close()
        async with asyncio.timeout(5):
            await conn.closed

        # It answered a Status: the next connection has the full bound again.
        unready.ready()
        peer = await connect()
        runtime = await accepted.get()
        await relayed(runtime)
        [conn] = open_connections()
        timer = conn.settings_wait
        assert timer is not None and timer.when() - loop.time() > 500
        runtime.speak()
        assert (await peer.read())[0] == rawh2.SETTINGS  # type: ignore[index]
        assert timer.cancelled()
        await peer.close()
    finally:
        frames.stop_accepting()
        await frames.drain(0)
        await server.stop(0)
