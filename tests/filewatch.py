"""Wait for something on disk to hold, woken by the directory's file events
(watchfiles), not by a fixed sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import watchfiles


async def until_on_disk(directory: Path, seen: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Until ``seen()`` holds, checked at once and at each file event in
    ``directory`` (and every half second: a directory made after the watch
    began shows no events); AssertionError naming ``what`` after ``timeout``."""
    if seen():
        return
    try:
        async with asyncio.timeout(timeout):
            async for _ in watchfiles.awatch(directory, rust_timeout=500, yield_on_timeout=True):
                if seen():
                    return
    except TimeoutError:
        pass
    raise AssertionError(f"{what}: not so within {timeout} s")
