"""What one client connection may hold of the proxy, and giving it back.

A client that opens calls and never reads their answers (its HTTP/2 window
stays shut) keeps each call's handler, its answer and grpc's per-call state
(about 25 KiB a call) alive until the connection closes. The stream count
bounds that; answer sizes are bounded by the message size limit.

When the connection closes, grpc frees all of it, but glibc keeps freed
memory in its heaps (grpc core allocates from its own threads' arenas, which
shrink only from the top), so the process stays at its high-water mark.
``give_back_freed_memory`` returns it to the system once it has grown.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_INTERVAL_S = 5.0
TRIM_GROWTH_BYTES = 8 << 20  # growth since the last look worth a trim
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
        return ctypes.CDLL(name).malloc_trim if name else None  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


async def give_back_freed_memory(interval: float = TRIM_INTERVAL_S, growth: int = TRIM_GROWTH_BYTES) -> None:
    """Every ``interval``, while resident memory is ``growth`` above the
    least seen, hand the C heaps' free pages back to the system (what is in
    use stays). Freed memory does not lower the resident size by itself, so
    the trim is tried until the process is back near its floor; a trim of a
    heap this size takes about a millisecond, in a thread."""
    trim = _malloc_trim()
    if trim is None:
        log.debug("malloc_trim not available: freed memory stays with the process")
        return
    floor = rss_bytes()
    while True:
        await asyncio.sleep(interval)
        before = rss_bytes()
        floor = min(floor, before)
        if before - floor < growth:
            continue
        await asyncio.to_thread(trim, 0)
        after = rss_bytes()
        floor = min(floor, after)
        if before - after >= growth:
            log.debug(
                "freed memory given back",
                extra={"rss_before_mib": round(before / _MIB, 1), "rss_after_mib": round(after / _MIB, 1)},
            )
