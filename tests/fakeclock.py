"""The image watch's backoff waits on a fake clock (ImageWatch(sleep=)):
no test waits out real time for a backoff. ``frozen_time``: a loop's clock
stopped for a synchronous block, so what it computes from the time is exact."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


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


@contextlib.contextmanager
def frozen_time(loop: asyncio.AbstractEventLoop) -> Iterator[float]:
    """``loop.time()`` stays at its value now (yielded) until the block ends:
    a timer armed in it is due exactly its delay from then, whatever the load.
    No awaits in the block: the loop's own timers would not come meanwhile."""
    now = loop.time()
    loop.time = lambda: now  # type: ignore[method-assign]
    try:
        yield now
    finally:
        del loop.time  # the class's again
