"""An open health Watch ends at shutdown (UNAVAILABLE, after NOT_SERVING),
as the proxy's other streams do, instead of holding the stop for the whole
grace period."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..fakes import FakeBackend

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_a_watch_open_at_shutdown_ends_and_the_stop_does_not_wait_for_it(
    sock_dir: Path, start_proxy, client: aio.Channel, fake: FakeBackend, data_path: str
) -> None:
    proxy = await start_proxy(fake.socket, data_path=data_path)
    watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=120)
    assert (await watch.read()).status == SERVING
    # A 60 s grace: a stop held by the Watch would take all of it.
    await asyncio.wait_for(proxy.stop(60), 20)
    statuses = []
    with pytest.raises(aio.AioRpcError) as ended:
        while True:
            statuses.append((await watch.read()).status)
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert set(statuses) <= {NOT_SERVING}
