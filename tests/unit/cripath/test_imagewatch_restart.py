"""A separate image service's watch restarted after it died probes a READY
service that does not serve at the first backoff again, not at the one the
dead run had reached (cripath/imagewatch.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import RETRY_FIRST, RETRY_MAX, ImageWatch


class ReadyChannel:
    """Always READY; its state changes at once while ``changing``, then the
    wait for a change fails once (the watch dies), then never comes."""

    def __init__(self) -> None:
        self.changing = True
        self.fail_next = False

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY

    async def wait_for_state_change(self, state: grpc.ChannelConnectivity) -> None:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the watch broke")
        if not self.changing:
            await asyncio.Event().wait()


async def test_a_restarted_watch_backs_off_from_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``_retry`` kept the dead run's backoff (up to RETRY_MAX, 5 s),
    so a service that came right after the restart waited that long to be
    seen serving."""
    probes: list[float] = []
    probed = asyncio.Event()

    async def failing(channel: Any, timeout: float) -> imagewatch.Probed:
        probes.append(asyncio.get_running_loop().time())
        probed.set()
        return imagewatch.Probed("ImageFsInfo (v1, v1alpha2): UNAVAILABLE: not yet")

    monkeypatch.setattr(imagewatch, "image_probe", failing)
    channel = ReadyChannel()
    watch = ImageWatch(Path("/run/img.sock"), channel)  # type: ignore[arg-type]
    first_run = asyncio.ensure_future(watch.run())
    while len(probes) < 8:  # each failed probe doubles the wait: RETRY_MAX reached
        probed.clear()
        await asyncio.wait_for(probed.wait(), 5)
    channel.changing, channel.fail_next = False, True
    with pytest.raises(RuntimeError, match="the watch broke"):
        await asyncio.wait_for(first_run, 5)
    assert RETRY_FIRST * 2 ** 7 > RETRY_MAX  # what the dead run had reached
    probes.clear()
    restarted = asyncio.ensure_future(watch.run())
    try:
        while len(probes) < 2:  # the first probe at once, the next after the first backoff
            probed.clear()
            await asyncio.wait_for(probed.wait(), RETRY_MAX / 2)
        assert probes[1] - probes[0] < RETRY_MAX / 2
    finally:
        restarted.cancel()
        await asyncio.gather(restarted, return_exceptions=True)
