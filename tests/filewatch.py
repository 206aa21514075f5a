"""Wait for something on disk to hold, woken by file events (watchfiles),
not by a fixed sleep."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import watchfiles


async def until_on_disk(directory: Path, seen: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Until ``seen()`` holds, checked at once and at each file event under
    ``directory`` (or under its nearest existing parent, while it is not made
    yet), and every half second (an event between the first check and the
    watch's start is not missed); AssertionError naming ``what`` after ``timeout``.
    Each event is looked at as it comes (no debounce), every 10 ms at most."""
    if seen():
        return
    watched = directory
    while not watched.is_dir():  # (watchfiles refuses a path that is not there)
        watched = watched.parent
    try:
        async with asyncio.timeout(timeout), contextlib.aclosing(
                watchfiles.awatch(watched, debounce=0, step=10, rust_timeout=500, yield_on_timeout=True)) as changes:
            async for _ in changes:
                if seen():
                    return
    except TimeoutError:
        pass
    raise AssertionError(f"{what}: not so within {timeout} s")
