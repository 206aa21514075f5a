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
from typing import Any

import grpc
import pytest
from grpc import aio

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import RETRY_FIRST, VERSION_RETRY_MAX, ImageWatch, Probed
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.host.unixsocket import grpc_address

from tests.fakeclock import Clock

from ..fakes import FakeBackend

V1, A2 = ApiVersion.V1, ApiVersion.V1ALPHA2
A2_FS_INFO = "/runtime.v1alpha2.ImageService/ImageFsInfo"
NOT_SERVED = "ImageFsInfo (v1alpha2): UNAVAILABLE: v1alpha2 gone"


class Watched:
    """The watch's channel, passed through; ``parked`` is set when the watch
    begins its wait for the channel to leave READY (its pause after a READY
    probe). The pause starts that wait and any backoff timer together, before
    it first yields, so by the time a waiter on ``parked`` runs, a timer's
    first step (the clock's record of it) has run too."""

    def __init__(self, channel: aio.Channel) -> None:
        self._channel = channel
        self.parked = asyncio.Event()

    def __getattr__(self, name: str) -> Any:  # the probe's calls, get_state: the channel's own
        return getattr(self._channel, name)

    async def wait_for_state_change(self, state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.READY:
            self.parked.set()
        await self._channel.wait_for_state_change(state)


@asynccontextmanager
async def watching(images: FakeBackend, clock: Clock, monkeypatch: pytest.MonkeyPatch
                   ) -> AsyncIterator[tuple[ImageWatch, list[Probed], asyncio.Event, Watched]]:
    """The watch running on a channel to ``images``, image calls sent in v1;
    the real probe's outcomes so far; an event set when it is up; the
    channel as the watch sees it."""
    outcomes: list[Probed] = []
    real = imagewatch.image_probe

    async def probe(channel: aio.Channel, timeout: float) -> Probed:
        outcomes.append(await real(channel, timeout))
        return outcomes[-1]

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    up = asyncio.Event()
    async with aio.insecure_channel(grpc_address(images.socket)) as channel:
        watched = Watched(channel)
        watch = ImageWatch(images.socket, watched, sleep=clock.sleep)  # type: ignore[arg-type]
        watch.on_change(lambda is_up: up.set() if is_up else None)
        watch.sent_in(frozenset({V1}))
        task = asyncio.ensure_future(watch.run())
        try:
            yield watch, outcomes, up, watched
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_registered_failing_v1alpha2_is_up_with_no_reprobe(
        sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After its one probe the watch is parked on the channel's change of
    state alone: no backoff timer was begun (the clock never asked), so no
    re-probe comes while the channel stays READY."""
    clock = Clock(until=float("inf"))
    async with FakeBackend(sock_dir / "img.sock", go_unknown=True) as images:
        images.script(A2_FS_INFO, code=grpc.StatusCode.UNAVAILABLE, details="v1alpha2 gone")
        async with watching(images, clock, monkeypatch) as (watch, outcomes, up, watched):
            await asyncio.wait_for(up.wait(), 10)
            await asyncio.wait_for(watched.parked.wait(), 10)
            assert (watch.up, watch.versions, watch.version_problem) == (True, frozenset({V1, A2}), None)
            assert outcomes == [Probed(None, frozenset({V1, A2}))]
            assert (clock.waits, images.calls(A2_FS_INFO)) == ([], [])


async def test_a_failing_v1alpha2_on_a_server_that_does_not_tell_backs_off_to_a_minute(
        sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(until=300.0)
    async with FakeBackend(sock_dir / "img.sock") as images:
        images.script(A2_FS_INFO, code=grpc.StatusCode.UNAVAILABLE, details="v1alpha2 gone")
        async with watching(images, clock, monkeypatch) as (watch, outcomes, _, _):
            await asyncio.wait_for(clock.over.wait(), 30)
            assert (watch.up, watch.versions, watch.version_problem) == (True, frozenset({V1}), NOT_SERVED)
            ramp = [RETRY_FIRST * 2 ** i for i in range(10)]  # 0.1 ... 51.2, then the minute
            assert clock.waits == pytest.approx(ramp + [VERSION_RETRY_MAX] * 4)
            assert len(outcomes) == len(clock.waits)
            assert set(outcomes) == {Probed(None, frozenset({V1}), failed=NOT_SERVED, failing=frozenset({A2}))}
