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
from runtimeproxy.cripath.server import DRAIN_FLOOR_S, HOLD_LIMIT_S, Proxy
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


async def test_one_grace_bounds_the_whole_drain(sock_dir: Path) -> None:
    """A call the proxy's grpc server carries (translated) and one relayed
    share the grace: the frames drain gets what is left of it, not a grace
    of its own (before, a stop could take both, past systemd's TimeoutStopSec)."""
    grace = 3.0
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as fake:
        fake.script(HANG, hang=True)
        proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames",
                                  serve_versions="v1,v1alpha2"))
        await proxy.start()
        await proxy.wait_ready(10)
        async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as client:
            calls = [asyncio.ensure_future(client.unary_unary(path)(b"", timeout=30))
                     for path in (HANG, HANG.replace("runtime.v1.", "runtime.v1alpha2."))]
            await fake.wait_calls(HANG, 2)
            loop = asyncio.get_running_loop()
            began = loop.time()
            await proxy.stop(grace)
            took = loop.time() - began
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            fake.scripts[HANG].release.set()
    assert all(isinstance(o, aio.AioRpcError) for o in outcomes), outcomes  # neither was answered in time
    assert grace <= took < grace + HOLD_LIMIT_S + DRAIN_FLOOR_S + 0.5, took  # one grace, not two
