"""Health says SERVING only once the runtime serves CRI calls, not when it
merely answers Version (containerd 1.6 answers the rest UNKNOWN "server is
not initialized yet" for a while after it starts)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..fakes import FakeBackend

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
NOT_INITIALISED = {"code": grpc.StatusCode.UNKNOWN, "details": "server is not initialized yet"}


async def _until_initialised(fake: FakeBackend, status_path: str, client: aio.Channel) -> None:
    """Let ``fake`` refuse Status three times while answering Version, health
    NOT_SERVING all along; then it initialises and health must turn SERVING."""
    await fake.wait_calls(status_path, 3, timeout=20)
    assert fake.calls(f"{status_path.rsplit('/', 1)[0]}/Version"), "Version was answered"
    stub = health_pb2_grpc.HealthStub(client)
    assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == NOT_SERVING
    watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)
    del fake.scripts[status_path]
    statuses = [(await asyncio.wait_for(watch.read(), 15)).status]
    if statuses[0] != SERVING:
        statuses.append((await asyncio.wait_for(watch.read(), 15)).status)
    assert statuses[-1] == SERVING
    watch.cancel()


@pytest.mark.parametrize(
    ("versions", "package"), [({"v1", "v1alpha2"}, "runtime.v1"), ({"v1alpha2"}, "runtime.v1alpha2")]
)
async def test_health_waits_for_the_runtime_to_initialise_at_start(
    sock_dir: Path, start_proxy, client, versions, package, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe's failures have their own line ('backend not ready, retrying'):
    Unready's lines are debug ones, and its end does not say 'again' of a
    runtime that never served (before: a second warning, and 'serves calls
    again')."""
    caplog.set_level(logging.DEBUG, "runtimeproxy.cripath.unready")
    status_path = f"/{package}.RuntimeService/Status"
    async with FakeBackend(sock_dir / "b.sock", versions=frozenset(versions)) as fake:
        fake.script(status_path, **NOT_INITIALISED)
        proxy = await start_proxy(fake.socket, wait=False)
        await _until_initialised(fake, status_path, client)
        assert proxy.router.plan is not None
    unready = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "runtimeproxy.cripath.unready"]
    assert unready == [
        (logging.DEBUG, "the runtime does not serve calls yet: hooked calls are refused before their hooks until it does"),
        (logging.DEBUG, "the runtime serves calls now: hooked calls go on"),
    ]


async def test_health_waits_for_a_restarted_runtime_to_initialise(sock_dir: Path, start_proxy, client) -> None:
    socket = sock_dir / "b.sock"
    status_path = "/runtime.v1.RuntimeService/Status"
    first = FakeBackend(socket)
    await first.start()
    await start_proxy(socket)
    health = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert (await health.read()).status == SERVING
    await first.stop()
    assert (await asyncio.wait_for(health.read(), 15)).status == NOT_SERVING
    async with FakeBackend(socket) as second:
        second.script(status_path, **NOT_INITIALISED)
        await _until_initialised(second, status_path, client)
    health.cancel()
