"""The image watch (cripath/imagewatch.py) with its real probe against a
fake image service, v1alpha2's ImageFsInfo failing: on a server that tells
v1alpha2 is registered (grpc-go's answers, as containerd's) it is taken as
served and never probed for a failure of its own, so no backoff; on one
whose answer does not tell (grpc-python's) its real call fails, and the
watch's waits grow towards VERSION_RETRY_MAX while image calls go in v1.
The waits are a fake clock's: each recorded, each over at once.
Guards existing behaviour (the backoff's unit tests script the probe)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc import aio

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import RETRY_FIRST, VERSION_RETRY_MAX, ImageWatch, Probed
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.host.unixsocket import grpc_address

from ..fakes import FakeBackend

V1, A2 = ApiVersion.V1, ApiVersion.V1ALPHA2
A2_FS_INFO = "/runtime.v1alpha2.ImageService/ImageFsInfo"
NOT_SERVED = "ImageFsInfo (v1alpha2): UNAVAILABLE: v1alpha2 gone"


class Clock:
    """The watch's sleep: records each wait, over at once until ``until``
    seconds have passed (then never: ``over`` is set)."""

    def __init__(self, until: float) -> None:
        self.now, self.until = 0.0, until
        self.waits: list[float] = []
        self.over = asyncio.Event()

    async def sleep(self, delay: float) -> None:
        self.waits.append(delay)
        self.now += delay
        if self.now >= self.until:
            self.over.set()
            await asyncio.Event().wait()


@asynccontextmanager
async def watching(images: FakeBackend, clock: Clock, monkeypatch: pytest.MonkeyPatch
                   ) -> AsyncIterator[tuple[ImageWatch, list[Probed], asyncio.Event]]:
    """The watch running on a channel to ``images``, image calls sent in v1;
    the real probe's outcomes so far; an event set when it is up."""
    outcomes: list[Probed] = []
    real = imagewatch.image_probe

    async def probe(channel: aio.Channel, timeout: float) -> Probed:
        outcomes.append(await real(channel, timeout))
        return outcomes[-1]

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    up = asyncio.Event()
    async with aio.insecure_channel(grpc_address(images.socket)) as channel:
        watch = ImageWatch(images.socket, channel, sleep=clock.sleep)
        watch.on_change(lambda is_up: up.set() if is_up else None)
        watch.sent_in(frozenset({V1}))
        task = asyncio.ensure_future(watch.run())
        try:
            yield watch, outcomes, up
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_registered_failing_v1alpha2_is_up_with_no_reprobe(
        sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(until=0.0)  # any backoff wait sets ``over``
    async with FakeBackend(sock_dir / "img.sock", go_unknown=True) as images:
        images.script(A2_FS_INFO, code=grpc.StatusCode.UNAVAILABLE, details="v1alpha2 gone")
        async with watching(images, clock, monkeypatch) as (watch, outcomes, up):
            await asyncio.wait_for(up.wait(), 10)
            with pytest.raises(TimeoutError):  # nothing to wait on: a backoff would end at once
                await asyncio.wait_for(clock.over.wait(), 0.3)
            assert (watch.up, watch.versions, watch.version_problem) == (True, frozenset({V1, A2}), None)
            assert outcomes == [Probed(None, frozenset({V1, A2}))]
            assert (clock.waits, images.calls(A2_FS_INFO)) == ([], [])


async def test_a_failing_v1alpha2_on_a_server_that_does_not_tell_backs_off_to_a_minute(
        sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(until=300.0)
    async with FakeBackend(sock_dir / "img.sock") as images:
        images.script(A2_FS_INFO, code=grpc.StatusCode.UNAVAILABLE, details="v1alpha2 gone")
        async with watching(images, clock, monkeypatch) as (watch, outcomes, _):
            await asyncio.wait_for(clock.over.wait(), 30)
            assert (watch.up, watch.versions, watch.version_problem) == (True, frozenset({V1}), NOT_SERVED)
            ramp = [RETRY_FIRST * 2 ** i for i in range(10)]  # 0.1 ... 51.2, then the minute
            assert clock.waits == pytest.approx(ramp + [VERSION_RETRY_MAX] * 4)
            assert len(outcomes) == len(clock.waits)
            assert set(outcomes) == {Probed(None, frozenset({V1}), failed=NOT_SERVED, failing=frozenset({A2}))}
