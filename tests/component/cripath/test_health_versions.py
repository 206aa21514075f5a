"""Health by service name follows the routing plan: a CRI version the proxy
does not serve (``--serve-versions v1`` in front of a runtime that serves
v1alpha2 too) is NOT_SERVING, as its calls are refused UNIMPLEMENTED.

Before: every version's RuntimeService and ImageService said SERVING while
the runtime was up, so a v1alpha2 consumer's health check passed and its
first call failed."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.cripath.server import Proxy
from runtimeproxy.supervisor import TaskName

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
NAMES = (
    "",
    "runtime.v1.RuntimeService",
    "runtime.v1.ImageService",
    "runtime.v1alpha2.RuntimeService",
    "runtime.v1alpha2.ImageService",
)


async def health(client: aio.Channel) -> dict[str, int]:
    stub = health_pb2_grpc.HealthStub(client)
    return {
        name: (await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)).status for name in NAMES
    }


async def settled(proxy: Proxy) -> None:
    """Until the health updates the probe started are set."""
    for task in proxy.tasks.running(TaskName.HEALTH):
        await task


async def test_a_version_not_served_is_not_serving(fake, start_proxy, client) -> None:
    proxy = await start_proxy(fake.socket, serve_versions="v1")
    assert proxy.router.plan is not None and {str(v) for v in proxy.router.plan.served} == {"v1"}
    await settled(proxy)
    assert await health(client) == {
        "": SERVING,
        "runtime.v1.RuntimeService": SERVING,
        "runtime.v1.ImageService": SERVING,
        "runtime.v1alpha2.RuntimeService": NOT_SERVING,
        "runtime.v1alpha2.ImageService": NOT_SERVING,
    }
    for path in ("/runtime.v1alpha2.RuntimeService/Version", "/runtime.v1alpha2.ImageService/ListImages"):
        with pytest.raises(aio.AioRpcError) as refused:  # what the health answer stands for
            await client.unary_unary(path)(b"", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_every_version_served_is_serving(fake, start_proxy, client) -> None:
    """Guards existing behaviour: both versions served, all names SERVING."""
    proxy = await start_proxy(fake.socket, serve_versions="v1,v1alpha2")
    await settled(proxy)
    assert set((await health(client)).values()) == {SERVING}
