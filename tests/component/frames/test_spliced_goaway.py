"""A client connection made while the runtime could not be dialled (containerd
restarting) is answered by the proxy's own grpc.aio server; once the runtime
is back, the client is told to reconnect (GOAWAY), and its calls are relayed
again, not re-issued through grpc.aio for the connection's life. The runtime
is back when probed again, when another connection's dial reaches it, or when
the listener's own re-dial does (a dial that failed while the runtime's
channel stayed READY: no probe comes then).

Before: kubelet's connection, redialled during a containerd restart, stayed on
the proxy's own server until the proxy or kubelet restarted, at several times
a relayed call's CPU, and nothing said so; after a dial failed with the
runtime fine (EMFILE, its socket briefly replaced), it stayed there for good
unless kubelet happened to open another connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy
from runtimeproxy.frames import listener
from tests.loghandling import handled

from ..fakes import FakeBackend

LIST = "/runtime.v1.RuntimeService/ListContainers"
HELD = "/runtime.v1.RuntimeService/ListPodSandbox"
STATUS = "/runtime.v1.RuntimeService/Status"
AGENT = "kubelet-under-test/1.0"
TOLD = "connections made while the runtime could not be reached are told to reconnect"
STILL_AWAY = "the runtime still cannot be dialled"


def relayed(fake: FakeBackend) -> list[bool]:
    """For each ListContainers the runtime got: whether it came as the client sent it (its user agent kept)."""
    return [AGENT in str(r.metadata.get("user-agent", "")) for r in fake.calls(LIST)]


class Said:
    """The frames listener's log lines, each message's first as an event."""

    def __init__(self) -> None:
        self.records: list[logging.LogRecord] = []
        self._events: dict[str, asyncio.Event] = {}

    def event(self, start: str) -> asyncio.Event:
        """Set once a line starting with ``start`` is logged (or was already)."""
        if start not in self._events:
            self._events[start] = asyncio.Event()
            if any(r.getMessage().startswith(start) for r in self.records):
                self._events[start].set()
        return self._events[start]

    def told(self) -> list[int]:
        return [r.connections for r in self.records if r.getMessage().startswith(TOLD)]  # type: ignore[attr-defined]


@contextlib.contextmanager
def said() -> Iterator[Said]:
    lines = Said()

    def emit(record: logging.LogRecord) -> None:
        lines.records.append(record)
        for start, event in lines._events.items():  # noqa: SLF001
            if record.getMessage().startswith(start):
                event.set()

    with handled(listener.__name__, logging.DEBUG, emit):
        yield lines


@contextlib.contextmanager
def socket_away(path: Path) -> Iterator[None]:
    """The runtime's socket out of its place: a dial fails, its connected channel stays READY."""
    away = path.with_name(path.name + ".away")
    path.rename(away)
    try:
        yield
    finally:
        away.rename(path)


async def relayed_again(channel: aio.Channel, fake: FakeBackend) -> None:
    """Calls sent before the client read the GOAWAY still go on the old connection; then they are relayed."""
    for _ in range(50):
        await channel.unary_unary(LIST)(b"", timeout=5)
        if relayed(fake)[-1]:
            break
    assert relayed(fake)[-1], relayed(fake)
    await channel.unary_unary(LIST)(b"", timeout=5)
    assert relayed(fake)[-1]


def channel_to(sock_dir: Path) -> aio.Channel:
    return aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=[("grpc.primary_user_agent", AGENT)])


async def test_a_connection_made_while_the_runtime_was_away_is_relayed_once_it_is_probed(
    sock_dir: Path, start_proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call in flight on the spliced connection when it is told to go away ends OK (no stream refused)."""
    monkeypatch.setattr(listener, "REDIAL_FIRST_S", 3600.0)  # the probe alone tells it
    socket = sock_dir / "b.sock"
    lost = asyncio.Event()
    async with FakeBackend(socket):
        proxy = await start_proxy(socket, data_path="frames")
        proxy.backend.on_lost(lost.set)
    await asyncio.wait_for(lost.wait(), 10)
    with said() as lines:
        async with channel_to(sock_dir) as channel:
            with pytest.raises(aio.AioRpcError) as away:  # a connection made now: nothing to dial
                await channel.unary_unary(LIST)(b"", timeout=5)
            assert away.value.code() == grpc.StatusCode.UNAVAILABLE
            async with FakeBackend(socket) as fake:
                fake.script(STATUS, hang=True)  # the probe waits: a call goes in meanwhile
                fake.script(HELD, hang=True)
                await fake.wait_calls(STATUS, timeout=10)
                held = asyncio.ensure_future(channel.unary_unary(HELD)(b"", timeout=30))
                await fake.wait_calls(HELD)
                assert not lines.told()
                fake.scripts[STATUS].release.set()
                await asyncio.wait_for(lines.event(TOLD).wait(), 10)
                fake.scripts[HELD].release.set()
                assert await held == b""  # its stream kept: answered on the old connection
                await relayed_again(channel, fake)
    assert lines.told() == [1]
    # Which client was spliced, then told: this process, the same socket (peerid.py).
    starts = ("frames: client connection spliced", "frames: spliced client connection told")
    spliced = [(r.getMessage(), r.client_pid, r.client_fd) for r in lines.records  # type: ignore[attr-defined]
               if r.getMessage().startswith(starts)]
    assert [(pid, fd) for _, pid, fd in spliced] == [(os.getpid(), spliced[0][2])] * 2 and spliced[0][2] >= 0


async def test_a_connection_spliced_after_a_failed_dial_is_told_once_another_dial_reaches_the_runtime(
    fake: FakeBackend, sock_dir: Path, start_proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener, "REDIAL_FIRST_S", 3600.0)  # the other connection's dial alone tells it
    await start_proxy(fake.socket, data_path="frames")
    with said() as lines:
        async with channel_to(sock_dir) as channel:
            with socket_away(fake.socket):
                await channel.unary_unary(LIST)(b"", timeout=5)  # the proxy's own server answers it
            assert relayed(fake) == [False]
            assert not lines.told()
            # A connection of its own (grpc would share the first one's subchannel): dialled, relayed.
            async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}",
                                            options=[("grpc.use_local_subchannel_pool", 1)]) as other:
                await other.unary_unary(LIST)(b"", timeout=5)
            await asyncio.wait_for(lines.event(TOLD).wait(), 10)
            await relayed_again(channel, fake)
    assert lines.told() == [1]


async def test_a_connection_spliced_after_a_failed_dial_is_told_once_the_listeners_redial_reaches_the_runtime(
    fake: FakeBackend, sock_dir: Path, start_proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No probe comes (the runtime's channel stays READY), no other connection: the listener re-dials."""
    monkeypatch.setattr(listener, "REDIAL_FIRST_S", 0.01)
    monkeypatch.setattr(listener, "REDIAL_MAX_S", 0.02)
    await start_proxy(fake.socket, data_path="frames")
    with said() as lines:
        async with channel_to(sock_dir) as channel:
            with socket_away(fake.socket):
                await channel.unary_unary(LIST)(b"", timeout=5)
                await asyncio.wait_for(lines.event(STILL_AWAY).wait(), 10)  # a re-dial failed: tried again
                assert not lines.told()
            await asyncio.wait_for(lines.event(TOLD).wait(), 10)
            await relayed_again(channel, fake)
    assert lines.told() == [1]


async def test_the_redial_ends_with_the_last_such_connection_and_at_shutdown(
    fake: FakeBackend, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener, "REDIAL_FIRST_S", 3600.0)
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, data_path="frames"))
    stopped = False
    try:
        await proxy.start()
        await proxy.wait_ready(10)
        frames = proxy._frames.listener  # noqa: SLF001 - the task it owns
        with socket_away(fake.socket):
            async with channel_to(sock_dir) as channel:
                await channel.unary_unary(LIST)(b"", timeout=5)
                redial = frames._redial  # noqa: SLF001
                assert redial is not None and not redial.done()
            await asyncio.wait([redial], timeout=10)  # the connection closed: nothing left to tell
            assert redial.cancelled()
            async with channel_to(sock_dir) as channel:
                await channel.unary_unary(LIST)(b"", timeout=5)
                redial = frames._redial  # noqa: SLF001
                assert redial is not None and not redial.done()
                frames.stop_accepting()  # shutdown, step 1: no connection is told to go away from here on
                await asyncio.wait([redial], timeout=10)
                assert redial.cancelled()
                assert frames._undialled  # noqa: SLF001 - its connection still open: the step cancelled it
                stopped = True
                await proxy.stop(0)
    finally:
        if not stopped:
            await proxy.stop(0)
