"""A separate image service's watch (cripath/imagewatch.py) pausing between
probes on a real grpc channel that stays READY leaves no waits behind."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from runtimeproxy.cripath import imagewatch
from runtimeproxy.cripath.imagewatch import ImageWatch, Probed
from runtimeproxy.cripath.methods import ApiVersion
from runtimeproxy.host.unixsocket import grpc_address, grpc_target

PAUSES = 500
A2_FAILING = Probed(None, frozenset({ApiVersion.V1}), failed="ImageFsInfo (v1alpha2): UNAVAILABLE: x",
                    failing=frozenset({ApiVersion.V1ALPHA2}))


def live_futures() -> int:
    gc.collect()
    return sum(isinstance(o, asyncio.Future) for o in gc.get_objects())


async def test_pauses_on_a_ready_channel_leave_no_waits_behind(
    monkeypatch: pytest.MonkeyPatch, sock_dir: Path
) -> None:
    """A service serving with a version failing is paused on PAUSES times
    while its channel stays READY: the live asyncio futures stay as many.
    Before: each pause began a wait for a state change and cancelled it,
    which grpc aio keeps (with its future) until the state next changes: one
    future more a pause, ~720 an hour for a service down on a READY channel."""
    socket = sock_dir / "img.sock"
    server = aio.server()
    assert server.add_insecure_port(grpc_address(socket)) != 0
    await server.start()
    channel = aio.insecure_channel(grpc_target(socket))
    try:
        await asyncio.wait_for(channel.channel_ready(), 10)

        async def probe(_channel: Any, timeout: float) -> Probed:
            return A2_FAILING

        monkeypatch.setattr(imagewatch, "image_probe", probe)
        counts: list[int] = []
        over = asyncio.Event()

        async def sleep(delay: float) -> None:  # the backoff's wait: over at once (one loop turn)
            counts.append(live_futures() if len(counts) in (50, 50 + PAUSES) else -1)
            if len(counts) > 50 + PAUSES:
                over.set()
                await asyncio.Event().wait()
            await asyncio.sleep(0)

        watch = ImageWatch(socket, channel, sleep=sleep)
        task = asyncio.ensure_future(watch.run())
        try:
            await asyncio.wait_for(over.wait(), 60)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert channel.get_state() is grpc.ChannelConnectivity.READY  # no change of state released them
        assert counts[50 + PAUSES] - counts[50] < 5
    finally:
        await channel.close()
        await server.stop(None)
