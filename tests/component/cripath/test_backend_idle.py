"""An idle backend channel that reconnects is the same runtime, not a lost one."""

from __future__ import annotations

import asyncio

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.cripath import server as server_module
from runtimeproxy.cripath.channelopts import channel_options

from ..fakes import FakeBackend

VERSION = "/runtime.v1.RuntimeService/Version"


@pytest.fixture
def idle_after_one_second(monkeypatch: pytest.MonkeyPatch) -> None:
    # grpc closes a client connection unused this long (its default is 30
    # minutes); the backend monitor reconnects at once.
    def options(max_recv: int, max_send: int) -> list[tuple[str, int | str]]:
        return [*channel_options(max_recv, max_send), ("grpc.client_idle_timeout_ms", 1000)]

    monkeypatch.setattr(server_module, "channel_options", options)


async def test_an_idle_reconnect_keeps_health_routing_and_state(
    idle_after_one_second, fake, start_proxy, client
) -> None:
    proxy = await start_proxy(fake.socket)
    lost: list[str] = []
    probed: list[object] = []
    reconnects: asyncio.Queue[bool] = asyncio.Queue()
    proxy.backend.on_lost(lambda: lost.append("lost"))
    proxy.backend.on_change(probed.append)  # a store rebuild hangs on this
    proxy.backend.on_reconnect(reconnects.put_nowait)
    health = health_pb2_grpc.HealthStub(client)
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    # About a second after the start-up probe, the channel goes idle and the
    # monitor reconnects it.
    assert await asyncio.wait_for(reconnects.get(), 15) is False
    assert lost == [] and probed == []
    assert proxy.backend.connected
    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()
    assert await client.unary_unary(VERSION)(b"", timeout=5)


async def test_a_restart_behind_an_idle_channel_is_still_a_loss(idle_after_one_second, sock_dir, start_proxy) -> None:
    socket = sock_dir / "b.sock"
    first = FakeBackend(socket, versions=frozenset({"v1"}))
    await first.start()
    proxy = await start_proxy(socket)
    lost, changed = asyncio.Event(), asyncio.Event()
    proxy.backend.on_lost(lost.set)
    proxy.backend.on_change(lambda info: changed.set())
    await first.stop()
    async with FakeBackend(socket, versions=frozenset({"v1"})):
        await asyncio.wait_for(changed.wait(), 15)
    assert lost.is_set()

