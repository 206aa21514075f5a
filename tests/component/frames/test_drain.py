"""Shutdown on the frames data path: unary calls in flight get the grace period,
whatever happens to their connection meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc import aio

from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy
from runtimeproxy.frames.listener import FramesListener

from ..fakes import FakeBackend
from ..rawh2 import SlowReader

HANG = "/runtime.v1.RuntimeService/ContainerStatus"
GRACE = 10.0


@pytest.fixture
def draining(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once the frames listener begins to drain (shutdown, step 2)."""
    began = asyncio.Event()
    drain = FramesListener.drain

    async def noted(self: FramesListener, grace: float) -> None:
        began.set()
        await drain(self, grace)

    monkeypatch.setattr(FramesListener, "drain", noted)
    return began


@contextlib.asynccontextmanager
async def frames_proxy(fake: FakeBackend, listen: Path, listen_socket: socket.socket | None = None) -> AsyncIterator[Proxy]:
    proxy = Proxy(ProxyConfig(listen=listen, backend=fake.socket, data_path="frames"), listen_socket=listen_socket)
    try:
        await proxy.start()
        await proxy.wait_ready(10)
        yield proxy
    finally:
        await proxy.stop(0)


async def test_a_call_in_flight_is_answered_through_the_socket_from_systemd(
    fake: FakeBackend, sock_dir: Path, draining: asyncio.Event
) -> None:
    """The frames listener serves systemd's socket itself (no activation relay
    in front): its drain gives the call its grace there too."""
    public = sock_dir / "proxy.sock"
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.bind(str(public))
    held.listen()
    held.setblocking(False)
    fake.script(HANG, hang=True)
    async with frames_proxy(fake, public, held) as proxy, aio.insecure_channel(f"unix://{public}") as client:
        pending = asyncio.ensure_future(client.unary_unary(HANG)(b"", timeout=30))
        await fake.wait_calls(HANG)
        stopping = asyncio.ensure_future(proxy.stop(GRACE))
        await asyncio.wait_for(draining.wait(), GRACE)
        fake.scripts[HANG].release.set()
        assert await pending == b""
        await stopping
    held.close()


async def test_a_connection_closed_while_draining_ends_the_wait(
    fake: FakeBackend, sock_dir: Path, draining: asyncio.Event
) -> None:
    """Its calls can no longer be answered: shutdown goes on at once, not after the grace."""
    fake.script(HANG, hang=True)
    async with frames_proxy(fake, sock_dir / "proxy.sock") as proxy:
        slow = await SlowReader.connect(sock_dir / "proxy.sock")
        await slow.open_calls(HANG, 1)
        await fake.wait_calls(HANG)
        stopping = asyncio.ensure_future(proxy.stop(GRACE))
        await asyncio.wait_for(draining.wait(), GRACE)
        await slow.close()
        await asyncio.wait_for(stopping, GRACE / 2)
        fake.scripts[HANG].release.set()
