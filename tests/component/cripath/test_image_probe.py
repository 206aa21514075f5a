"""The separate image service's probe alone (cripath/imageprobe.py's
image_probe) against a fake: both versions asked at once under one
deadline, each version's UNIMPLEMENTED read for whether the version is there,
and a failure's reason naming its version."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from runtimeproxy.cripath.imageprobe import Probed, image_probe
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.host.unixsocket import grpc_address

from ..fakes import FakeBackend

FS_INFO = "/runtime.{}.ImageService/ImageFsInfo"
V1, A2 = ApiVersion.V1, ApiVersion.V1ALPHA2


@pytest_asyncio.fixture
async def images(sock_dir: Path) -> AsyncIterator[FakeBackend]:
    async with FakeBackend(sock_dir / "images.sock") as fake:
        yield fake


@pytest_asyncio.fixture
async def channel(images: FakeBackend) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(grpc_address(images.socket)) as opened:
        yield opened


async def test_both_versions_hung_cost_one_deadline(images: FakeBackend, channel: aio.Channel) -> None:
    """Before: asked one after the other, up to twice the timeout."""
    for version in ("v1", "v1alpha2"):
        images.script(FS_INFO.format(version), hang=True)
    started = time.monotonic()
    probed = await image_probe(channel, 1.0)
    assert time.monotonic() - started < 1.8
    assert probed == Probed("ImageFsInfo (v1, v1alpha2): DEADLINE_EXCEEDED: Deadline Exceeded")


@pytest.mark.parametrize(("v1_details", "versions", "unknown"), [
    # grpc-go: the service is not registered, so the version is missing.
    ("unknown service runtime.v1.ImageService", frozenset({A2}), frozenset()),
    # grpc-go: the service is there without the call.
    ("unknown method ImageFsInfo for service runtime.v1.ImageService", frozenset(ApiVersion), frozenset()),
    ("method ImageFsInfo not implemented", frozenset(ApiVersion), frozenset()),
    # grpc-python's, saying neither: taken to be there, as unknown.
    ("Method not found!", frozenset(ApiVersion), frozenset({V1})),
])
async def test_unimplemented_is_read_for_whether_the_version_is_there(
    images: FakeBackend, channel: aio.Channel, v1_details: str, versions: frozenset[ApiVersion],
    unknown: frozenset[ApiVersion],
) -> None:
    """Before: any UNIMPLEMENTED was taken for a missing version, and one in
    both versions for both there."""
    images.script(FS_INFO.format("v1"), code=grpc.StatusCode.UNIMPLEMENTED, details=v1_details)
    assert await image_probe(channel, 5) == Probed(None, versions, unknown)


async def test_one_version_failing_leaves_only_that_version_out(images: FakeBackend, channel: aio.Channel) -> None:
    """Before: UNAVAILABLE in one version was the whole service down. The
    version failing is named (``failing``: its backoff's ceiling depends on
    whether image calls are sent in it)."""
    images.script(FS_INFO.format("v1alpha2"), code=grpc.StatusCode.UNAVAILABLE, details="busy")
    assert await image_probe(channel, 5) == Probed(
        None, frozenset({V1}), frozenset(), "ImageFsInfo (v1alpha2): UNAVAILABLE: busy", frozenset({A2}))


async def test_no_image_service_in_either_version_is_down(images: FakeBackend, channel: aio.Channel) -> None:
    """A socket whose server has no ImageService at all (a wrong --image-backend)
    is down, not up with no version (before: it served, with none)."""
    for version in ("v1", "v1alpha2"):
        images.script(FS_INFO.format(version), code=grpc.StatusCode.UNIMPLEMENTED,
                      details=f"unknown service runtime.{version}.ImageService")
    assert await image_probe(channel, 5) == Probed(
        "ImageFsInfo (v1, v1alpha2): unknown service: no CRI ImageService listens there")
