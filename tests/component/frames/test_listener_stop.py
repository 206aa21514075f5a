"""A connection accepted as the shutdown begins, before the runtime's SETTINGS
reached its client: the client still gets them as its server preface, then
the GOAWAY, and the drain waits for both (the flake of stop 30: kubelet saw
"connection closed before server preface received" and failed its calls)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import Limits
from runtimeproxy.frames.frame import FrameType
from runtimeproxy.frames.listener import FramesListener
from tests.frameroutes import Routes

from .. import rawh2


class _SilentRuntime(asyncio.Protocol):
    """A runtime that sends its SETTINGS only when told (``speak``)."""

    def __init__(self, accepted: Callable[[_SilentRuntime], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.read = bytearray()
        self.arrived = asyncio.Event()  # set as bytes are read
        self._accepted = accepted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._accepted(self)

    def data_received(self, data: bytes) -> None:
        self.read += data
        self.arrived.set()

    async def has_read(self, prefix: bytes) -> None:
        """Until what it has read starts with ``prefix``: woken by each arrival, not polled."""
        while not self.read.startswith(prefix):
            self.arrived.clear()  # (no await since the check: nothing arrived in between)
            await self.arrived.wait()

    def speak(self) -> None:
        assert self.transport is not None
        self.transport.write(fr.serialize(FrameType.SETTINGS, 0, 0))


@pytest.fixture
async def runtimes(sock_dir: Path) -> AsyncIterator[tuple[Path, asyncio.Queue[_SilentRuntime]]]:
    accepted: asyncio.Queue[_SilentRuntime] = asyncio.Queue()
    path = sock_dir / "runtime.sock"
    server = await asyncio.get_running_loop().create_unix_server(
        lambda: _SilentRuntime(accepted.put_nowait), path=str(path))
    yield path, accepted
    server.close()


def _listener(sock_dir: Path, runtime: Path) -> FramesListener:
    return FramesListener(sock_dir / "proxy.sock", runtime, sock_dir / "unused.sock", Routes(), [],
                          Limits(max_message=1 << 20))


@pytest.mark.parametrize("stop_when", ["connected", "runtime dialled"])
async def test_the_goaway_waits_for_the_runtimes_settings_and_the_drain_for_the_goaway(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]], stop_when: str
) -> None:
    path, accepted = runtimes
    listener = _listener(sock_dir, path)
    await listener.start()
    peer = await rawh2.RawPeer.connect(sock_dir / "proxy.sock")
    peer.writer.write(rawh2.frame(rawh2.SETTINGS, 0, 0, b""))
    if stop_when == "runtime dialled":
        # The runtime's accept runs before the listener has its connection:
        # the listener learns of the shutdown only once it has (listener._relay).
        runtime = await accepted.get()
        listener.stop_accepting()
    else:
        runtime = await accepted.get()
        # The client's preface went through: the relay is set up.
        await asyncio.wait_for(runtime.has_read(fr.PREFACE), 5)
        listener.stop_accepting()
    draining = asyncio.ensure_future(listener.drain(10))
    first = asyncio.ensure_future(peer.read())
    done, _ = await asyncio.wait([draining, first], timeout=0.3, return_when=asyncio.FIRST_COMPLETED)
    assert not done, "the client got a frame, or the drain ended, before the runtime's SETTINGS"
    runtime.speak()
    kinds = [(await first)[0]] + [f[0] for f in await peer.until(rawh2.GOAWAY)]  # type: ignore[index]
    assert kinds[0] == rawh2.SETTINGS and kinds[-1] == rawh2.GOAWAY
    await asyncio.wait_for(draining, 5)
    assert await peer.read() is None  # and then the connection is closed
    await peer.close()


async def test_a_runtime_that_never_speaks_is_bounded_by_the_grace(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]]
) -> None:
    path, accepted = runtimes
    listener = _listener(sock_dir, path)
    await listener.start()
    peer = await rawh2.RawPeer.connect(sock_dir / "proxy.sock")
    await accepted.get()
    listener.stop_accepting()
    await asyncio.wait_for(listener.drain(0.2), 5)
    assert await peer.read() is None  # closed at the grace's end, never sent a GOAWAY before SETTINGS
    await peer.close()


async def test_a_connection_accepted_in_the_turn_the_stop_comes_is_still_served(
    sock_dir: Path, runtimes: tuple[Path, asyncio.Queue[_SilentRuntime]]
) -> None:
    """asyncio's own server made an accepted connection's transport a turn
    after the accept, and not at all once closed meanwhile: the client was
    dropped unanswered, and, out of systemd's backlog, lost to the next
    instance too. The stop here runs in the very turn of the accept."""
    path, accepted = runtimes
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # systemd's copy
    held.bind(str(sock_dir / "proxy.sock"))
    held.listen(16)
    listener = _listener(sock_dir, path)
    await listener.start(socket.socket(fileno=os.dup(held.fileno())))
    await listener.start_accepting()
    loop = asyncio.get_running_loop()
    wake, woken = os.pipe()

    def stop_now() -> None:  # ready after the listening socket in the same poll: runs right after the accept
        loop.remove_reader(wake)
        listener.stop_accepting()

    loop.add_reader(wake, stop_now)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(sock_dir / "proxy.sock"))  # in the backlog at once: no turn of the loop in between
    client.sendall(fr.PREFACE + rawh2.frame(rawh2.SETTINGS, 0, 0, b""))
    os.write(woken, b"x")
    peer = rawh2.RawPeer(*await asyncio.open_unix_connection(sock=client))
    runtime = await asyncio.wait_for(accepted.get(), 5)
    draining = asyncio.ensure_future(listener.drain(10))
    runtime.speak()
    kinds = [f[0] for f in await peer.until(rawh2.GOAWAY)]
    assert kinds[0] == rawh2.SETTINGS
    await asyncio.wait_for(draining, 5)
    await peer.close()
    os.close(wake)
    os.close(woken)
    assert stat.S_ISSOCK(os.lstat(sock_dir / "proxy.sock").st_mode)  # systemd's path stays
    held.close()
