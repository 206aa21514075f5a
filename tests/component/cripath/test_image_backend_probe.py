"""A separate image service (``--image-backend``) is judged by a probe, not
by its connection alone (cripath/imagewatch.py): one that takes the
connection but does not serve keeps health NOT_SERVING; an idle reconnect of
one that serves changes nothing; a watch that keeps failing is restarted,
never stopping the proxy."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.app import RunningProxy, build_proxy
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath import server as server_module
from runtimeproxy.cripath.channelopts import channel_options

from ..fakes import FakeBackend
from .test_image_backend_outage import NOT_SERVING, SERVING, WATCH, image_ready, next_status, statuses

FS_INFO = "/runtime.v1.ImageService/ImageFsInfo"
FS_INFO_A2 = "/runtime.v1alpha2.ImageService/ImageFsInfo"
LIST_IMAGES = "/runtime.v1.ImageService/ListImages"
NOT_INITIALISED = {"code": grpc.StatusCode.UNKNOWN, "details": "server is not initialized yet"}


@contextlib.asynccontextmanager
async def proxy_with(sock_dir: Path, fake: FakeBackend, images: Path) -> AsyncIterator[RunningProxy]:
    config = ProxyConfig(listen=sock_dir / "proxy.sock", backend=fake.socket, image_backend=images)
    async with contextlib.AsyncExitStack() as stack:
        running = await build_proxy(config, stack)
        await running.proxy.wait_ready(10)
        yield running


async def test_an_image_service_not_initialised_is_down_until_its_probe_answers(
    fake: FakeBackend, sock_dir: Path, client: aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    """containerd loading its state takes the connection and answers every
    call 'not initialized yet': the image side stays down, and the probe is
    asked again until it answers.

    Before: the connection's READY alone was taken for up: SERVING while
    every image call failed."""
    caplog.set_level(logging.DEBUG, logger=WATCH)
    async with FakeBackend(sock_dir / "images.sock") as images:
        for path in (FS_INFO, FS_INFO_A2):  # containerd loading its state answers so in every version
            images.script(path, **NOT_INITIALISED)
        async with proxy_with(sock_dir, fake, images.socket) as running:
            await images.wait_calls(FS_INFO, 3, timeout=10)  # asked again, after a backoff
            assert await statuses(client) == (NOT_SERVING, SERVING, NOT_SERVING)
            assert image_ready(running) == 0.0
            assert running.proxy.images is not None  # what `status` shows (admin.py): why it does not serve
            assert running.proxy.images.reason == "ImageFsInfo (v1, v1alpha2): UNKNOWN: server is not initialized yet"
            watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            assert (await watch.read()).status == NOT_SERVING
            del images.scripts[FS_INFO], images.scripts[FS_INFO_A2]  # its state loaded
            await next_status(watch, SERVING)
            assert image_ready(running) == 1.0
            assert running.proxy.images.reason is None
            watch.cancel()
    told = [r for r in caplog.records if r.name == WATCH and r.levelno >= logging.INFO]
    assert [(r.levelno, r.getMessage().split(" after ")[0]) for r in told] == [
        (logging.WARNING, "image backend not reachable yet"), (logging.INFO, "image backend ready")]
    assert told[0].reason == "ImageFsInfo (v1, v1alpha2): UNKNOWN: server is not initialized yet"  # type: ignore[attr-defined]
    assert told[1].image_backend_failures >= 3  # type: ignore[attr-defined]  # each failed probe


async def test_a_hung_image_service_is_down(
    fake: FakeBackend, sock_dir: Path, client: aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service that takes the connection and never answers: the probe's
    timeout (the runtime's PROBE_TIMEOUT, here cut short) is a failure.
    Before: up at the connection's READY."""
    monkeypatch.setattr(imagewatch, "PROBE_TIMEOUT", 0.2)
    async with FakeBackend(sock_dir / "images.sock") as images:
        for path in (FS_INFO, FS_INFO_A2):
            images.script(path, hang=True)
        async with proxy_with(sock_dir, fake, images.socket) as running:
            await images.wait_calls(FS_INFO, 2, timeout=10)  # the first timed out, asked again
            assert await statuses(client) == (NOT_SERVING, SERVING, NOT_SERVING)
            assert running.proxy.images is not None and not running.proxy.images.up
            for path in (FS_INFO, FS_INFO_A2):
                images.scripts.pop(path).release.set()
            watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
            await next_status(watch, SERVING)
            watch.cancel()


@pytest.fixture
def idle_after_one_second(monkeypatch: pytest.MonkeyPatch) -> None:
    # grpc closes a client connection unused this long (its default is 30
    # minutes); the image watch reconnects at once.
    def options(max_recv: int, max_send: int) -> list[tuple[str, int | str]]:
        return [*channel_options(max_recv, max_send), ("grpc.client_idle_timeout_ms", 1000)]

    monkeypatch.setattr(server_module, "channel_options", options)


async def test_an_idle_reconnect_of_a_serving_image_service_changes_nothing(
    idle_after_one_second: None, fake: FakeBackend, sock_dir: Path, client: aio.Channel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A guard (not broken at this commit): grpc's idle timeout closes the
    image connection and the watch reconnects it and probes it again: no
    down transition, no line, health unchanged."""
    caplog.set_level(logging.INFO, logger=WATCH)
    async with FakeBackend(sock_dir / "images.sock") as images, proxy_with(sock_dir, fake, images.socket) as running:
        watch = running.proxy.images
        assert watch is not None
        changes: list[bool] = []
        watch.on_change(changes.append)
        health = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        await next_status(health, SERVING)
        await client.unary_unary(LIST_IMAGES)(b"", timeout=5)
        probes = len(images.calls(FS_INFO))
        # The watch probes only at a READY that follows a change of state: a
        # probe more says the connection went idle and was made again (its
        # states flip too fast for a second observer to see each one).
        await images.wait_calls(FS_INFO, probes + 1, timeout=15)  # the reconnect's probe answered...
        await client.unary_unary(LIST_IMAGES)(b"", timeout=5)  # ...and its outcome was told (or not) before this
        assert changes == [] and watch.up
        assert await statuses(client) == (SERVING, SERVING, SERVING)
        assert image_ready(running) == 1.0
        health.cancel()
    assert [r.getMessage() for r in caplog.records if r.name == WATCH] == ["image backend connected"]


async def test_an_image_watch_that_keeps_failing_is_restarted_and_the_proxy_serves_on(
    fake: FakeBackend, sock_dir: Path, client: aio.Channel, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The image watch dies six times in a row (a supervisor's default gives
    up after five): it is restarted each time, the image side is down
    meanwhile, and the runtime's calls are served on.

    Before: the sixth failure failed the supervisor, and ``serve`` stopped
    the proxy (exit 1) for want of the image service's watch."""
    caplog.set_level(logging.INFO)
    real = imagewatch.image_probe
    failures = 6

    async def failing(channel: aio.Channel, timeout: float) -> imagewatch.Probed:
        nonlocal failures
        if failures:
            failures -= 1
            raise RuntimeError("probe broke")
        return await real(channel, timeout)

    monkeypatch.setattr(imagewatch, "image_probe", failing)
    async with FakeBackend(sock_dir / "images.sock"), proxy_with(sock_dir, fake, sock_dir / "images.sock") as running:
        watch = health_pb2_grpc.HealthStub(client).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        await next_status(watch, SERVING)
        watch.cancel()
        assert not running.proxy.tasks.failed.is_set()
    restarts = [r for r in caplog.records
                if r.getMessage() == "restarting background task" and r.task == "image-backend-monitor"]  # type: ignore[attr-defined]
    assert [r.attempt for r in restarts] == [1, 2, 3, 4, 5, 6]  # type: ignore[attr-defined]
    [down] = [r for r in caplog.records if r.name == WATCH and r.levelno == logging.WARNING]
    assert (down.getMessage(), down.reason) == (  # type: ignore[attr-defined]
        "image backend not reachable yet", "the image backend's watch failed: RuntimeError('probe broke')")
