"""A separate image service's watch restarted after it died probes a READY
service that does not serve at the first backoff again, not at the one the
dead run had reached (cripath/imagewatch.py). The waits are a fake clock's
(tests/fakeclock.py): each recorded, each over at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import RETRY_FIRST, RETRY_MAX, ImageWatch

from tests.fakeclock import Clock

DOWN = imagewatch.Probed("ImageFsInfo (v1, v1alpha2): UNAVAILABLE: not yet")


class ReadyChannel:
    """Always READY; the wait for a change never ends, unless ``breaks`` is
    set: then it fails (the watch dies)."""

    def __init__(self) -> None:
        self.breaks = asyncio.Event()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY

    async def wait_for_state_change(self, state: grpc.ChannelConnectivity) -> None:
        await self.breaks.wait()
        self.breaks.clear()
        raise RuntimeError("the watch broke")


async def test_a_restarted_watch_backs_off_from_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dead run's waits reached RETRY_MAX; the restarted run probes at
    once and waits RETRY_FIRST after its first failure. Before: ``_retry``
    kept the dead run's backoff (up to RETRY_MAX, 5 s), so a service that
    came right after the restart waited that long to be seen serving."""
    probes: list[float] = []  # the clock's time at each probe
    clock = Clock(until=16.0)  # the 8th wait (0.1 ... 3.2, 5, 5: 16.3 s) never ends

    async def failing(channel: Any, timeout: float) -> imagewatch.Probed:
        probes.append(clock.now)
        return DOWN

    monkeypatch.setattr(imagewatch, "image_probe", failing)
    channel = ReadyChannel()
    watch = ImageWatch(Path("/run/img.sock"), channel, sleep=clock.sleep)  # type: ignore[arg-type]
    first_run = asyncio.ensure_future(watch.run())
    await asyncio.wait_for(clock.over.wait(), 5)
    assert clock.waits == pytest.approx([RETRY_FIRST * 2 ** i for i in range(6)] + [RETRY_MAX] * 2)
    assert len(probes) == 8
    channel.breaks.set()
    with pytest.raises(RuntimeError, match="the watch broke"):
        await asyncio.wait_for(first_run, 5)
    probes.clear()
    clock.waits.clear()
    clock.until = at = clock.now  # the restarted run's first wait never ends
    clock.over.clear()
    restarted = asyncio.ensure_future(watch.run())
    try:
        await asyncio.wait_for(clock.over.wait(), 5)
        assert (probes, clock.waits) == ([at], [RETRY_FIRST])  # at once, then the first backoff
    finally:
        restarted.cancel()
        await asyncio.gather(restarted, return_exceptions=True)
