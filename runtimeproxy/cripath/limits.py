"""What one client connection may hold of the proxy, and giving it back.

A client that opens calls and never reads their answers (its HTTP/2 window
stays shut) keeps each call's handler, its answer and grpc's per-call state
(about 25 KiB a call) alive until the connection closes. The stream count
bounds that; answer sizes are bounded by the message size limit.

When the connection closes, grpc frees all of it, but glibc keeps freed
memory in its heaps (grpc core allocates from its own threads' arenas, which
shrink only from the top), so the process stays at its high-water mark.
``give_back_freed_memory`` returns it to the system once it has grown.

A trim that gives nothing back still walks every heap, and a process may sit
above its start-up floor for good (its caches, a steady load): after such a
trim the next waits twice as long, up to a minute (``TrimPacing``), and any
new growth, or a trim that gave memory back, brings it back to every 5 s.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

TRIM_INTERVAL_S = 5.0
TRIM_GROWTH_BYTES = 8 << 20  # growth since the last look worth a trim
# The longest wait between trims while they give nothing back: what a client
# that held memory frees when it leaves is given back at most this late.
TRIM_MAX_INTERVAL_S = 60.0
_MIB = 1 << 20


def server_options(channel_options: list[tuple[str, int | str]], max_concurrent_streams: int) -> list[tuple[str, int | str]]:
    """The proxy server's options: the channels' ones, plus the per-connection bounds."""
    return [*channel_options, ("grpc.max_concurrent_streams", max_concurrent_streams)]


def rss_bytes() -> int:
    """This process's resident memory (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None on a C library without it (musl)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


@dataclass
class TrimPacing:
    """When to trim, from resident-memory readings and what trims gave back.

    A trim is due while memory is ``growth`` above the least seen (the floor),
    and either it grew ``growth`` since the last trim, or the wait since the
    last trim is over. The wait starts at ``interval`` and doubles, up to
    ``max_wait``, after each trim that gave back less than ``growth``: memory
    a process keeps above its floor is not trimmed every ``interval`` for
    ever. Growth, a trim that gave memory back, or memory back near the
    floor set it to ``interval`` again.
    """

    interval: float
    growth: int
    max_wait: float
    floor: int
    wait: float = field(init=False)
    last_trim_at: float | None = field(default=None, init=False)
    last_after: int = field(default=0, init=False)  # resident size after the last trim

    def __post_init__(self) -> None:
        self.wait = self.interval

    def due(self, now: float, rss: int) -> bool:
        """Whether to trim now, resident memory being ``rss``."""
        self.floor = min(self.floor, rss)
        if rss - self.floor < self.growth:
            self.wait = self.interval  # back near the floor: the next growth is trimmed promptly
            return False
        if self.last_trim_at is None or rss - self.last_after >= self.growth:
            self.wait = self.interval  # grown since the last trim: what it holds may soon be freed
            return True
        return now - self.last_trim_at >= self.wait

    def trimmed(self, now: float, before: int, after: int) -> None:
        """A trim at ``now`` took resident memory from ``before`` to ``after``."""
        self.floor = min(self.floor, after)
        self.last_trim_at, self.last_after = now, after
        if before - after >= self.growth:
            self.wait = self.interval  # it gave memory back: more may be freed soon
        else:
            self.wait = min(self.wait * 2, self.max_wait)


async def give_back_freed_memory(
    interval: float = TRIM_INTERVAL_S,
    growth: int = TRIM_GROWTH_BYTES,
    max_wait: float = TRIM_MAX_INTERVAL_S,
    *,
    trim: Callable[[int], int] | None = None,
    rss: Callable[[], int] = rss_bytes,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Every ``interval``, look at resident memory and, when ``TrimPacing``
    says so, hand the C heaps' free pages back to the system (what is in use
    stays). Freed memory does not lower the resident size by itself, so a
    trim is tried again while the process stays above its floor, less often
    while trims give nothing back; a trim of a heap this size takes about a
    millisecond, in a thread. (``trim``, ``rss``, ``clock``, ``sleep``: glibc's
    malloc_trim, /proc, the monotonic clock and asyncio's, but for tests.)"""
    trim = trim or _malloc_trim()
    if trim is None:
        log.debug("malloc_trim not available: freed memory stays with the process")
        return
    pacing = TrimPacing(interval, growth, max_wait, floor=rss())
    while True:
        await sleep(interval)
        before = rss()
        if not pacing.due(clock(), before):
            continue
        await asyncio.to_thread(trim, 0)
        after = rss()
        pacing.trimmed(clock(), before, after)
        if before - after >= growth:
            log.debug(
                "freed memory given back",
                extra={"rss_before_mib": round(before / _MIB, 1), "rss_after_mib": round(after / _MIB, 1)},
            )
