"""The background work that keeps routing and health current survives faults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.backend import BackendInfo
from runtimeproxy.cripath.server import Proxy

from ..fakes import FakeBackend

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def unstarted_proxy(sock_dir: Path) -> AsyncIterator[Proxy]:
    proxy = Proxy(ProxyConfig(listen=sock_dir / "proxy.sock", backend=sock_dir / "b.sock"))
    yield proxy
    await proxy.stop(0)


async def test_a_listener_failing_in_a_probe_does_not_stop_the_monitor(unstarted_proxy, sock_dir, client) -> None:
    proxy = unstarted_proxy
    calls: list[BackendInfo] = []

    def broken(info: BackendInfo) -> None:
        calls.append(info)
        raise RuntimeError("listener bug")

    proxy.backend.on_change(broken)
    first = FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1alpha2"}))
    await first.start()
    await proxy.start()
    await proxy.wait_ready(10)
    watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert (await watch.read()).status == SERVING
    # The runtime is replaced: the monitor must still be there to notice.
    await first.stop()
    assert (await asyncio.wait_for(watch.read(), 15)).status == NOT_SERVING
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset({"v1"})):
        assert (await asyncio.wait_for(watch.read(), 15)).status == SERVING
        assert proxy.router.plan is not None and set(proxy.router.plan.served) == {"v1"}
    watch.cancel()
    assert len(calls) == 2  # it heard both probes, and failed both times


async def test_a_dead_monitor_is_restarted_and_routing_and_health_follow(
    sock_dir, start_proxy, client, caplog
) -> None:
    socket = sock_dir / "b.sock"
    first = FakeBackend(socket, versions=frozenset({"v1alpha2"}))
    await first.start()
    proxy = await start_proxy(socket)
    channel = proxy.backend.runtime_channel
    real_wait = channel.wait_for_state_change
    killed = asyncio.Event()

    async def wait_once_then_die(state):  # type: ignore[no-untyped-def]
        # The monitor is already waiting (on the real method); this is its
        # next wait, after the runtime went away.
        killed.set()
        channel.wait_for_state_change = real_wait  # type: ignore[method-assign]
        raise RuntimeError("injected monitor fault")

    channel.wait_for_state_change = wait_once_then_die  # type: ignore[method-assign]
    watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert (await watch.read()).status == SERVING
    await first.stop()
    await asyncio.wait_for(killed.wait(), 15)
    assert (await asyncio.wait_for(watch.read(), 15)).status == NOT_SERVING
    async with FakeBackend(socket, versions=frozenset({"v1"})):
        assert (await asyncio.wait_for(watch.read(), 15)).status == SERVING
        assert proxy.router.plan is not None and set(proxy.router.plan.served) == {"v1"}
    watch.cancel()
    assert any(
        r.getMessage() == "restarting background task" and getattr(r, "task", None) == "backend-monitor"
        for r in caplog.records
    )
