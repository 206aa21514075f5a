"""The image probe (cripath/imageprobe.py) when a call raises something
other than an RPC error (a channel closed under it): it raises, and leaves
no part of itself running on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest
from grpc import aio

from runtimeproxy.cripath.imageprobe import image_probe

V1_FS_INFO = "/runtime.v1.ImageService/ImageFsInfo"


class Channel:
    """v1's ImageFsInfo raises UsageError (as a closed channel's calls do);
    every other call hangs until cancelled, which ``cancelled`` records."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    def unary_unary(self, path: str) -> Callable[..., Awaitable[bytes]]:
        async def call(_request: bytes, timeout: float) -> bytes:
            if path == V1_FS_INFO:
                raise aio.UsageError("Channel is closed.")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            raise AssertionError("unreachable")
        return call


async def test_a_v1_call_raising_cancels_the_v1alpha2_part(caplog: pytest.LogCaptureFixture) -> None:
    """v1's call raising while v1alpha2's question is under way: the probe
    raises it, and the question is cancelled (before: it ran on, unowned,
    and its end went unretrieved)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    channel = Channel()
    with pytest.raises(aio.UsageError):
        await image_probe(channel, 60.0)  # type: ignore[arg-type]
    await asyncio.wait_for(channel.cancelled.wait(), 2)
    assert not caplog.records
