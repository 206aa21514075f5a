"""An image service on a socket of its own (``--image-backend``) that goes
away: health says NOT_SERVING (overall and ``runtime.v1.ImageService``, and
its v1alpha2 name; the runtime's own names stay SERVING),
``runtime_proxy_image_backend_ready`` is 0 and the log says so, until it is
back (cripath/imagewatch.py).

Before: nothing watched it; health stayed SERVING and no metric told of it
while every image call (kubelet's pulls) failed UNAVAILABLE."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from runtimeproxy.app import RunningProxy, build_proxy
from runtimeproxy.config import ProxyConfig

from ..fakes import FakeBackend

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LIST_IMAGES = "/runtime.v1.ImageService/ListImages"
LIST_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
WATCH = "runtimeproxy.cripath.imagewatch"


@contextlib.asynccontextmanager
async def proxy_with_images(sock_dir: Path, fake: FakeBackend) -> AsyncIterator[RunningProxy]:
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, image_backend=sock_dir / "images.sock")
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        yield running


def image_ready(running: RunningProxy) -> float | None:
    return running.metrics.registry.get_sample_value("runtime_proxy_image_backend_ready")


def runtime_ready(running: RunningProxy) -> float | None:
    return running.metrics.registry.get_sample_value("runtime_proxy_backend_ready")


async def statuses(client: aio.Channel) -> tuple[int, int, int]:
    """Health overall, the runtime's and the image service's; the v1alpha2
    names (served too: the fake serves both versions) must say what the v1
    ones say."""
    stub = health_pb2_grpc.HealthStub(client)

    async def status(name: str) -> int:
        return (await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)).status

    v1 = [await status(f"runtime.v1.{service}") for service in ("RuntimeService", "ImageService")]
    v1alpha2 = [await status(f"runtime.v1alpha2.{service}") for service in ("RuntimeService", "ImageService")]
    assert v1alpha2 == v1, "the v1alpha2 names must follow the same sides as the v1 ones"
    return (await status(""), *v1)  # type: ignore[return-value]


async def next_status(watch: aio.UnaryStreamCall, wanted: int) -> None:
    """Until the health Watch says ``wanted`` (it sends each change)."""
    async with asyncio.timeout(10):
        while (await watch.read()).status != wanted:
            pass


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == WATCH]


async def test_an_image_service_lost_and_back_is_told_by_health_the_metric_and_the_log(
    fake: FakeBackend, sock_dir: Path, client: aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WATCH)
    async with FakeBackend(sock_dir / "images.sock") as images, proxy_with_images(sock_dir, fake) as running:
        watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        await next_status(watch, SERVING)
        assert (image_ready(running), runtime_ready(running)) == (1.0, 1.0)
        await images.stop()
        await next_status(watch, NOT_SERVING)
        assert (image_ready(running), runtime_ready(running)) == (0.0, 1.0)
        assert await statuses(client) == (NOT_SERVING, SERVING, NOT_SERVING)
        with pytest.raises(aio.AioRpcError) as failed:  # what kubelet's pulls meet meanwhile
            await client.unary_unary(LIST_IMAGES)(b"", timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        await client.unary_unary(LIST_PODS)(b"", timeout=5)  # the runtime's calls go on
        await images.start()
        await next_status(watch, SERVING)
        assert image_ready(running) == 1.0
        assert await statuses(client) == (SERVING, SERVING, SERVING)
        await client.unary_unary(LIST_IMAGES)(b"", timeout=5)
        watch.cancel()
    told = [r for r in lines(caplog) if r.levelno >= logging.INFO]
    assert [(r.levelno, r.getMessage().split(" after ")[0]) for r in told] == [
        (logging.INFO, "image backend connected"),
        (logging.WARNING, "image backend unavailable"),
        (logging.INFO, "image backend ready again"),
    ]
    lost, back = told[1:]
    assert (lost.backend, lost.reason, lost.image_backend_outage) == (  # type: ignore[attr-defined]
        str(images.socket), "connection failed", "started")
    assert (back.backend, back.image_backend_outage) == (str(images.socket), "ended")  # type: ignore[attr-defined]
    # The failures it saw: the connection attempt that failed at the loss (pick_first
    # holds TRANSIENT_FAILURE through its retries), and any probe of a READY that failed.
    assert back.image_backend_failures >= 1  # type: ignore[attr-defined]
    assert back.getMessage().endswith(f" ({back.image_backend_failures} failures)")  # type: ignore[attr-defined]


async def test_an_image_service_not_there_at_start_keeps_health_not_serving_until_it_comes(
    fake: FakeBackend, sock_dir: Path, client: aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WATCH)
    async with proxy_with_images(sock_dir, fake) as running:
        stub = health_pb2_grpc.HealthStub(client)
        watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)
        assert (await watch.read()).status == NOT_SERVING
        images = running.proxy.images
        assert images is not None
        lost = asyncio.Event()
        images.on_change(lambda up: None if up else lost.set())
        if not any(r.getMessage() == "image backend not reachable yet" for r in lines(caplog)):
            await asyncio.wait_for(lost.wait(), 10)  # its first connection attempt fails
        assert await statuses(client) == (NOT_SERVING, SERVING, NOT_SERVING)
        assert (image_ready(running), runtime_ready(running)) == (0.0, 1.0)
        async with FakeBackend(sock_dir / "images.sock"):
            await next_status(watch, SERVING)
            assert image_ready(running) == 1.0
        watch.cancel()
    assert [r.levelno for r in lines(caplog) if r.getMessage() == "image backend not reachable yet"] == [logging.WARNING]
    [came] = [r for r in lines(caplog) if r.getMessage().startswith("image backend ready after ")]
    assert came.image_backend_outage == "ended"  # type: ignore[attr-defined]


async def test_no_image_series_without_a_separate_image_service(running: RunningProxy) -> None:
    """The runtime's socket serves images too (the default): nothing is
    watched apart, the image metric is not there, and the runtime's series
    is unlabelled, as before --image-backend was watched (before this
    commit's fix: ``runtime_proxy_backend_ready{service="runtime"}``, a
    new series that broke queries and alerts on the old one)."""
    assert running.proxy.images is None
    assert image_ready(running) is None and runtime_ready(running) == 1.0
    assert "runtime_proxy_image_backend_ready" not in generate_latest(running.metrics.registry).decode()
