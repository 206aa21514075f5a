"""A separate image service (``--image-backend``) that lacks a CRI version the
proxy serves: that version's ImageService name is NOT_SERVING (its image
calls meet UNIMPLEMENTED there), as a version the runtime lacks is, while
its RuntimeService name and the overall status stay SERVING.

Before: the ImageService names followed the runtime's plan alone, so
``runtime.v1alpha2.ImageService`` said SERVING while every v1alpha2 image
call failed UNIMPLEMENTED."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.app import RunningProxy, build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.readiness import describe

from ..fakes import FakeBackend
from .test_health_versions import NAMES, health, settled
from .test_image_backend_outage import WATCH, NOT_SERVING, SERVING, image_ready, next_status, proxy_with_images

FS_INFO_A2 = "/runtime.v1alpha2.ImageService/ImageFsInfo"


async def _images_up(running: RunningProxy) -> imagewatch.ImageWatch:
    """The proxy ready and its separate image service's watch found it up."""
    await running.proxy.wait_ready(10)
    images = running.proxy.images
    assert images is not None
    came = asyncio.Event()
    images.on_change(lambda up: came.set() if up else None)
    if not images.up:
        await asyncio.wait_for(came.wait(), 10)
    return images

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
    fake: FakeBackend, sock_dir: Path, client: aio.Channel, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its v1alpha2 ImageFsInfo never answers while v1 does: the image side
    is up with v1 alone (v1alpha2's image name NOT_SERVING, a warning with
    the ``version_problem``), and v1alpha2 is asked again, so its answer,
    once it comes, is told (at INFO: a version added, ``was`` and ``versions``).

    Before: v1alpha2's timeout took the whole image side down ("" and
    runtime.v1.ImageService NOT_SERVING) while v1's image calls worked."""
    monkeypatch.setattr(imagewatch, "PROBE_TIMEOUT", 0.3)
    caplog.set_level(logging.INFO, logger=WATCH)
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
    told = {r.getMessage(): r for r in caplog.records if r.name == WATCH and r.levelno >= logging.INFO}
    came, lacks, other = (told[m] for m in (
        "image backend connected", "image backend lacks a CRI version image calls are sent in: they fail there",
        "image backend serves other CRI versions"))
    assert came.version_problem.startswith("ImageFsInfo (v1alpha2): DEADLINE_EXCEEDED")  # type: ignore[attr-defined]
    assert (lacks.levelno, lacks.lacking, lacks.usable) == (logging.WARNING, ["v1alpha2"], True)  # type: ignore[attr-defined]
    assert lacks.version_problem == came.version_problem  # type: ignore[attr-defined]
    assert (other.levelno, other.was, other.versions) == (  # type: ignore[attr-defined]
        logging.INFO, ["v1"], ["v1", "v1alpha2"])


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


async def test_an_image_service_with_none_of_the_versions_image_calls_are_sent_in_is_not_usable(
    sock_dir: Path, client: aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    """The runtime serves v1 alone (``--serve-versions v1``) and the image
    service v1alpha2 alone: every image call fails UNIMPLEMENTED, so "" is
    NOT_SERVING (runtime.v1.RuntimeService stays SERVING), the ready metric
    0, the log warns and systemd's status says so.

    Before: "" SERVING, the metric 1, systemd "serving CRI v1 (native) for ...",
    no warning; only runtime.v1.ImageService said NOT_SERVING."""
    caplog.set_level(logging.INFO, logger=WATCH)
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as runtime, \
            FakeBackend(sock_dir / "images.sock", versions=frozenset({"v1alpha2"})):
        config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=runtime.socket,
                             image_backend=sock_dir / "images.sock", serve_versions="v1")
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            images = await _images_up(running)
            await settled(running.proxy)
            assert images.versions == frozenset({ApiVersion.V1ALPHA2})
            assert await health(client) == dict(zip(NAMES, (NOT_SERVING, SERVING, NOT_SERVING, NOT_SERVING, NOT_SERVING), strict=True))
            assert image_ready(running) == 0.0
            assert describe(running.proxy, 0) == (
                f"serving CRI v1 (native) for fake 1.0, but the image backend at {images.socket} lacks CRI v1; "
                "0 hook servers")
            with pytest.raises(aio.AioRpcError) as refused:
                await client.unary_unary("/runtime.v1.ImageService/ListImages")(b"", timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    [warned] = [r for r in caplog.records if r.name == WATCH and r.getMessage().startswith("image backend lacks")]
    assert warned.levelno == logging.WARNING
    assert (warned.lacking, warned.versions, warned.usable) == (["v1"], ["v1alpha2"], False)  # type: ignore[attr-defined]


async def test_the_ready_metric_follows_a_plan_change_alone(sock_dir: Path) -> None:
    """Guards existing behaviour (app.on_backend): the image service serves
    v1alpha2 alone throughout; the runtime, v1 alone (image calls sent in
    v1: the metric 0), restarts serving v1alpha2 alone, so the proxy's v1 is
    translated to v1alpha2 and its image calls reach a version the image
    service has: the metric is 1, with no change on the image side to tell it."""
    async with FakeBackend(sock_dir / "backend.sock", versions=frozenset({"v1"})) as runtime, \
            FakeBackend(sock_dir / "images.sock", versions=frozenset({"v1alpha2"})):
        config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=runtime.socket,
                             image_backend=sock_dir / "images.sock", serve_versions="v1")
        async with contextlib.AsyncExitStack() as stack:
            running = await build_proxy(config, stack)
            images = await _images_up(running)
            came = asyncio.Event()  # the image side telling a change
            images.on_change(lambda up: came.set() if up else None)
            assert image_ready(running) == 0.0
            replanned = asyncio.Event()
            running.proxy.backend.on_change(lambda info: replanned.set())  # after app's on_backend
            came.clear()
            await runtime.stop()
            runtime.versions = frozenset({"v1alpha2"})
            await runtime.start()
            await asyncio.wait_for(replanned.wait(), 20)
            assert running.proxy.router.plan is not None
            assert running.proxy.router.plan.routes[ApiVersion.V1] == ApiVersion.V1ALPHA2
            assert not came.is_set() and images.versions == frozenset({ApiVersion.V1ALPHA2})  # the image side unchanged
            assert image_ready(running) == 1.0
