"""The image watch's backoff waits on a fake clock (ImageWatch(sleep=)):
no test waits out real time for a backoff."""

from __future__ import annotations

import asyncio


class Clock:
    """The watch's sleep: records each wait and ends it at once, until
    ``until`` seconds have passed (then it never ends: the run is over)."""

    def __init__(self, until: float = float("inf")) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        self.until = until
        self.over = asyncio.Event()

    async def sleep(self, delay: float) -> None:
        self.waits.append(delay)
        self.now += delay
        if self.now >= self.until:
            self.over.set()
            await asyncio.Event().wait()
