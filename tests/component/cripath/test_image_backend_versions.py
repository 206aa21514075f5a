"""A separate image service (``--image-backend``) that lacks a CRI version the
proxy serves: that version's ImageService name is NOT_SERVING (its image
calls meet UNIMPLEMENTED there), as a version the runtime lacks is, while
its RuntimeService name and the overall status stay SERVING.

Before: the ImageService names followed the runtime's plan alone, so
``runtime.v1alpha2.ImageService`` said SERVING while every v1alpha2 image
call failed UNIMPLEMENTED."""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.app import build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.methods import ApiVersion

from ..fakes import FakeBackend
from .test_health_versions import NAMES, health, settled
from .test_image_backend_outage import NOT_SERVING, SERVING, next_status, proxy_with_images

FS_INFO_A2 = "/runtime.v1alpha2.ImageService/ImageFsInfo"


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


async def test_an_image_service_hung_in_one_version_serves_the_other(
    fake: FakeBackend, sock_dir: Path, client: aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its v1alpha2 ImageFsInfo never answers while v1 does: the image side
    is up with v1 alone (v1alpha2's image name NOT_SERVING), and v1alpha2 is
    asked again, so its answer, once it comes, is told.

    Before: v1alpha2's timeout took the whole image side down ("" and
    runtime.v1.ImageService NOT_SERVING) while v1's image calls worked."""
    monkeypatch.setattr(imagewatch, "PROBE_TIMEOUT", 0.3)
    async with FakeBackend(sock_dir / "images.sock") as images:
        images.script(FS_INFO_A2, hang=True)
        async with proxy_with_images(sock_dir, fake) as running:
            watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            await next_status(watch, SERVING)
            watch.cancel()
            await images.wait_calls(FS_INFO_A2, 2, timeout=10)  # the first timed out, asked again
            await settled(running.proxy)
            assert running.proxy.images is not None and running.proxy.images.up
            assert running.proxy.images.versions == frozenset({ApiVersion.V1})
            assert await health(client) == dict(zip(NAMES, (SERVING, SERVING, SERVING, SERVING, NOT_SERVING), strict=True))
            await client.unary_unary("/runtime.v1.ImageService/ListImages")(b"", timeout=5)
            images.scripts.pop(FS_INFO_A2).release.set()  # v1alpha2 answers now
            a2 = health_pb2_grpc.HealthStub(client).Watch(
                health_pb2.HealthCheckRequest(service="runtime.v1alpha2.ImageService"), timeout=30)
            await next_status(a2, SERVING)
            a2.cancel()
            assert running.proxy.images.versions == frozenset(ApiVersion)


async def test_a_translated_version_needs_the_version_its_image_calls_are_translated_to(
    sock_dir: Path, client: aio.Channel
) -> None:
    """The runtime serves v1 alone and the proxy translates v1alpha2 to it: a
    v1-only image service takes both versions' image calls, so both
    ImageService names are SERVING (health looks at the version a call is
    translated to, not the client's). A guard: this behaviour came with the
    commit before; it fails if health looks at the client's version."""
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as runtime, \
            FakeBackend(sock_dir / "images.sock", versions=frozenset({"v1"})):
        config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=runtime.socket,
                             image_backend=sock_dir / "images.sock", serve_versions="v1,v1alpha2")
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            await running.proxy.wait_ready(10)
            watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            await next_status(watch, SERVING)
            watch.cancel()
            await settled(running.proxy)
            assert set((await health(client)).values()) == {SERVING}
            await client.unary_unary("/runtime.v1alpha2.ImageService/ListImages")(b"", timeout=5)
