"""A separate image service's versions (cripath/imagewatch.py): its probe
finds them, and a service that comes back serving other versions is told to
the listeners (health follows it), not passed over as already up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import ImageWatch, Probed
from runtimeproxy.cripath.methods import ApiVersion


class SteppedChannel:
    """Always READY; each wait for a change returns when the test says so."""

    def __init__(self) -> None:
        self.step = asyncio.Queue[None]()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY

    async def wait_for_state_change(self, state: grpc.ChannelConnectivity) -> None:
        await self.step.get()


async def test_a_service_serving_other_versions_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a service already up was not looked at again, so a restart
    into other versions left health on the old ones."""
    answers = [frozenset({ApiVersion.V1}), frozenset({ApiVersion.V1}), frozenset(ApiVersion)]

    async def probe(channel: Any, timeout: float) -> Probed:
        return Probed(None, answers.pop(0))

    monkeypatch.setattr(imagewatch, "image_probe", probe)
    channel = SteppedChannel()
    watch = ImageWatch(Path("/run/img.sock"), channel)  # type: ignore[arg-type]
    told: list[tuple[bool, frozenset[ApiVersion] | None]] = []
    heard = asyncio.Event()

    def listener(up: bool) -> None:
        told.append((up, watch.versions))
        heard.set()

    watch.on_change(listener)
    running = asyncio.ensure_future(watch.run())
    try:
        await asyncio.wait_for(heard.wait(), 5)
        heard.clear()
        channel.step.put_nowait(None)  # the same versions: nothing to tell
        channel.step.put_nowait(None)  # both versions now
        await asyncio.wait_for(heard.wait(), 5)
        assert told == [(True, frozenset({ApiVersion.V1})), (True, frozenset(ApiVersion))]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
