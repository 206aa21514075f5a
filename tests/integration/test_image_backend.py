"""A separate image service (``--image-backend``) that is a real containerd of
its own, beside the runtime's: image calls land there alone, runtime calls
stay with the runtime, and the image side's outage is told by health while
the runtime side stays SERVING. Each of the two is Debian's containerd 1.6
or the shared 1.7.13, every pairing.

The component tests (tests/component/cripath/test_image_backend_outage.py)
stand in a fake for the image service; this guards the same behaviour
against two real containerds (no fix came with it). Both builds serve both
CRI versions, so an image service that lacks one is a case of the component
tests' alone (test_image_backend_versions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtimeproxy.host.containerd import LocalContainerd

from ..prerequisites import fail_or_skip
from .conftest import CONTAINERD_BUILDS, registry_missing, require_local_containerd
from .containerd17 import containerd17_bin_dir
from .crihelpers import V1, V1ALPHA2, CriApi
from .proxyfixtures import ProxyLauncher
from .registry import LoopbackRegistry

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
IMAGES = "runtime.v1.ImageService"
IMAGES_A2 = "runtime.v1alpha2.ImageService"
RUNTIME = "runtime.v1.RuntimeService"
pb = V1.pb


class HealthWatch:
    """One health service name as a client sees it, through grpc.health.v1 Watch."""

    def __init__(self, channel: aio.Channel, service: str) -> None:
        self.seen: list[int] = []
        self._changed = asyncio.Event()
        self._stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service))
        self.following: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        async for answer in self._stream:
            self.seen.append(answer.status)
            self._changed.set()

    async def until(self, status: int, timeout: float = 60) -> None:
        """Until the name says ``status``; the stream's end or error is raised
        at once, not waited out."""
        assert self.following is not None
        async with asyncio.timeout(timeout):
            while not self.seen or self.seen[-1] != status:
                self._changed.clear()
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait((changed, self.following), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if self.following.done() and not (self.seen and self.seen[-1] == status):
                    self.following.result()  # its error, if it failed
                    raise AssertionError(f"the health Watch ended before {status}: {self.seen}")


@contextlib.asynccontextmanager
async def watching(channel: aio.Channel, service: str) -> AsyncIterator[HealthWatch]:
    watch = HealthWatch(channel, service)
    task = watch.following = asyncio.create_task(watch.follow())
    try:
        yield watch
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def of_build(build: str, base: Path, registries: tuple[str, ...] = ()) -> LocalContainerd:
    """A private containerd, not started, of one of CONTAINERD_BUILDS. NRI stays
    off on 1.7 too: its default, and nothing here is an NRI plugin."""
    require_local_containerd()
    return LocalContainerd(base, plain_http_registries=registries,
                           bin_dir=containerd17_bin_dir() if build == "1.7" else None)


def build_of(containerd: LocalContainerd) -> str:
    return "1.6" if containerd.bin_dir is None else "1.7"


@pytest_asyncio.fixture(params=CONTAINERD_BUILDS, ids=lambda build: f"runtime{build}")
async def runtime_containerd(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalContainerd]:
    """The runtime's containerd, the test's own, not started (stopped at teardown: stop() is idempotent)."""
    runtime = of_build(request.param, tmp_path / "containerd")
    yield runtime
    await runtime.stop()


@pytest_asyncio.fixture(params=CONTAINERD_BUILDS, ids=lambda build: f"images{build}")
async def image_containerd(request: pytest.FixtureRequest, tmp_path: Path,
                           _registry_if_installed: LoopbackRegistry | None
                           ) -> AsyncIterator[tuple[LocalContainerd, LoopbackRegistry]]:
    """A second private containerd, not started, that pulls from the loopback registry."""
    require_local_containerd()
    if _registry_if_installed is None:
        fail_or_skip("pull tests need " + ", ".join(registry_missing()))
    images = of_build(request.param, tmp_path / "img", (_registry_if_installed.host,))
    yield images, _registry_if_installed
    await images.stop()


async def version_of(socket: Path) -> str:
    """The containerd's own version (v1 Version, asked directly): "1.6.20~ds1", "v1.7.13"."""
    async with aio.insecure_channel(f"unix://{socket}") as channel:
        answer = await V1.runtime(channel).Version(pb.VersionRequest(), timeout=10)
        return answer.runtime_version


async def health(channel: aio.Channel, service: str) -> int:
    answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return answer.status


async def tags(channel: aio.Channel, api: CriApi = V1) -> set[str]:
    """The images listed on ``channel`` (the proxy's, or a containerd's own), asked in ``api``'s CRI version."""
    listed = await api.images(channel).ListImages(api.pb.ListImagesRequest(), timeout=10)
    return {tag for image in listed.images for tag in image.repo_tags}


async def tags_of(socket: Path) -> set[str]:
    """The images a containerd lists, asked directly (not through the proxy)."""
    async with aio.insecure_channel(f"unix://{socket}") as channel:
        return await tags(channel)


async def mountpoints(channel: aio.Channel) -> set[str]:
    info = await V1.images(channel).ImageFsInfo(pb.ImageFsInfoRequest(), timeout=10)
    return {fs.fs_id.mountpoint for fs in info.image_filesystems}


async def test_a_separate_image_containerd_serves_the_image_calls_alone(
    runtime_containerd: LocalContainerd, image_containerd: tuple[LocalContainerd, LoopbackRegistry]
) -> None:
    runtime, (images, registry) = runtime_containerd, image_containerd
    await runtime.start(timeout=60, images=False)
    await images.start(timeout=60, images=False)
    # each is the build its parameter names (1.7 from bin_dir, not PATH)
    for containerd in (runtime, images):
        version = await version_of(containerd.socket)
        assert version.removeprefix("v").startswith(build_of(containerd) + "."), version
    ref = registry.ref()
    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(runtime.socket, stack)
        await launcher.start(image_backend=images.socket, probe_max_interval=0.5)
        channel = await stack.enter_async_context(launcher.channel())
        image_health = await stack.enter_async_context(watching(channel, IMAGES))
        await image_health.until(SERVING)
        # Both builds serve both CRI versions (1.7 keeps v1alpha2, deprecated;
        # 2.0 drops it): the probe finds both, on either build.
        assert await health(channel, IMAGES_A2) == SERVING

        # A pull through the proxy lands in the image containerd, not the runtime's.
        await V1.images(channel).PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=60)
        assert ref in await tags_of(images.socket)
        assert ref not in await tags_of(runtime.socket)
        assert ref in await tags(channel)
        assert ref in await tags(channel, V1ALPHA2)  # v1alpha2 image calls reach it too

        # ImageFsInfo is the image containerd's (its filesystem lies below its own directory).
        async with aio.insecure_channel(f"unix://{images.socket}") as direct:
            image_fs = await mountpoints(direct)
        async with aio.insecure_channel(f"unix://{runtime.socket}") as direct:
            runtime_fs = await mountpoints(direct)
        assert image_fs != runtime_fs
        assert await mountpoints(channel) == image_fs
        assert all(path.startswith(str(images.base)) for path in image_fs)

        # The image containerd stops: image calls fail UNAVAILABLE, its health
        # name says NOT_SERVING (and so does ""), the runtime's calls and name go on.
        await images.stop()
        await image_health.until(NOT_SERVING)
        with pytest.raises(aio.AioRpcError) as err:
            await V1.images(channel).ListImages(pb.ListImagesRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await health(channel, RUNTIME) == SERVING
        assert await health(channel, "") == NOT_SERVING
        version = await V1.runtime(channel).Version(pb.VersionRequest(), timeout=10)
        assert version.runtime_name == "containerd"

        # Started again: the image side serves again, with the image it pulled.
        await images.start(timeout=60, images=False)
        await image_health.until(SERVING)
        assert await health(channel, "") == SERVING
        assert await health(channel, IMAGES_A2) == SERVING
        assert ref in await tags(channel)
        assert ref in await tags(channel, V1ALPHA2)
        assert ref not in await tags_of(runtime.socket)
