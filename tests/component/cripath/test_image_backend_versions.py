"""A separate image service (``--image-backend``) that lacks a CRI version the
proxy serves: that version's ImageService name is NOT_SERVING (its image
calls meet UNIMPLEMENTED there), as a version the runtime lacks is, while
its RuntimeService name and the overall status stay SERVING.

Before: the ImageService names followed the runtime's plan alone, so
``runtime.v1alpha2.ImageService`` said SERVING while every v1alpha2 image
call failed UNIMPLEMENTED."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..fakes import FakeBackend
from .test_health_versions import NAMES, health, settled
from .test_image_backend_outage import NOT_SERVING, SERVING, next_status, proxy_with_images


async def test_an_image_service_without_a_version_makes_only_its_image_name_not_serving(
    fake: FakeBackend, sock_dir: Path, client: aio.Channel
) -> None:
    async with FakeBackend(sock_dir / "images.sock", versions=frozenset({"v1"})), \
            proxy_with_images(sock_dir, fake) as running:
        watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        await next_status(watch, SERVING)
        watch.cancel()
        await settled(running.proxy)
        assert running.proxy.images is not None and {str(v) for v in running.proxy.images.versions or ()} == {"v1"}
        assert await health(client) == dict(zip(NAMES, (SERVING, SERVING, SERVING, SERVING, NOT_SERVING), strict=True))
        with pytest.raises(aio.AioRpcError) as refused:  # what that name's consumer would meet
            await client.unary_unary("/runtime.v1alpha2.ImageService/ListImages")(b"", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        await client.unary_unary("/runtime.v1.ImageService/ListImages")(b"", timeout=5)
