"""The proxy in front of containerd 1.7.13 (the runtime, and a second one as
a separate image service) with a v1-only client records no
``io.containerd.deprecation/cri-api-v1alpha2`` on either: operators read
``ctr deprecations list`` to check a node is ready for containerd 2.0. Its
probes still find v1alpha2 in both (health SERVING); a v1alpha2 client's
calls still go through, and then the entry is recorded (the check can see
it). On both data paths (grpcpath/test_deprecations_grpc.py). Both
containerds are fully ready when the proxy starts, so the probes' fallbacks
(a v1 call not initialised yet, a question or a v1 answer not in time) are
left to the component tests (cripath/test_probe_no_v1alpha2_call.py).

Before: the proxy's own probes asked Version and ImageFsInfo in v1alpha2,
so the entry was there on every 1.7 node (cripath/registered.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from runtimeproxy.host.containerd import LocalContainerd

from .conftest import require_local_containerd
from .containerd17 import containerd17_bin_dir
from .crihelpers import V1, V1ALPHA2
from .proxyfixtures import ProxyLauncher
from .test_image_backend import IMAGES_A2, SERVING, health, tags, version_of, watching

CRI_V1ALPHA2 = "io.containerd.deprecation/cri-api-v1alpha2"
RUNTIME_A2 = "runtime.v1alpha2.RuntimeService"


async def deprecations(containerd: LocalContainerd) -> str:
    """What ``ctr deprecations list`` says of ``containerd`` (empty: nothing recorded)."""
    assert containerd.bin_dir is not None
    process = await asyncio.create_subprocess_exec(
        str(containerd.bin_dir / "ctr"), "--address", str(containerd.socket), "deprecations", "list",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err
    return out.decode()


@pytest_asyncio.fixture
async def two_containerds(tmp_path: Path) -> AsyncIterator[tuple[LocalContainerd, LocalContainerd]]:
    """The runtime's and the image service's containerd 1.7.13, the test's own, started."""
    require_local_containerd()
    bin_dir = containerd17_bin_dir()
    runtime = LocalContainerd(tmp_path / "containerd", bin_dir=bin_dir)
    images = LocalContainerd(tmp_path / "img", bin_dir=bin_dir)
    try:
        await runtime.start(timeout=60, images=False)
        await images.start(timeout=60, images=False)
        yield runtime, images
    finally:
        await images.stop()
        await runtime.stop()


async def test_v1_clients_leave_no_v1alpha2_deprecation(two_containerds: tuple[LocalContainerd, LocalContainerd]) -> None:
    runtime, images = two_containerds
    for containerd in (runtime, images):
        assert (await version_of(containerd.socket)) == "v1.7.13"
        assert CRI_V1ALPHA2 not in await deprecations(containerd)  # nothing recorded before the proxy
    async with contextlib.AsyncExitStack() as stack:
        launcher = ProxyLauncher(runtime.socket, stack)
        running, _ = await launcher.start(image_backend=images.socket, probe_max_interval=0.5)
        channel = await stack.enter_async_context(launcher.channel())
        image_health = await stack.enter_async_context(watching(channel, IMAGES_A2))
        await image_health.until(SERVING)  # the image service probed: v1alpha2 found there
        info = running.proxy.backend.info
        assert info is not None and info.versions == {"v1", "v1alpha2"}
        assert (info.runtime_name, info.runtime_version) == ("containerd", "v1.7.13")
        assert await health(channel, RUNTIME_A2) == SERVING

        # A v1-only client (kubelet 1.26+).
        answer = await V1.runtime(channel).Version(V1.pb.VersionRequest(), timeout=10)
        assert answer.runtime_api_version == "v1"
        await V1.runtime(channel).Status(V1.pb.StatusRequest(), timeout=10)
        await tags(channel)
        await V1.images(channel).ImageFsInfo(V1.pb.ImageFsInfoRequest(), timeout=10)
        for containerd in (runtime, images):
            assert CRI_V1ALPHA2 not in await deprecations(containerd), containerd.base

        # A v1alpha2 client is still served natively, and containerd records it.
        answer = await V1ALPHA2.runtime(channel).Version(V1ALPHA2.pb.VersionRequest(), timeout=10)
        assert answer.runtime_api_version == "v1alpha2"
        await tags(channel, V1ALPHA2)
        for containerd in (runtime, images):
            assert CRI_V1ALPHA2 in await deprecations(containerd), containerd.base
