"""Per-object ordering of hooked calls: one lock per pod or container id."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class KeyedLocks:
    """One lock per pod or container id, gone when nobody holds or awaits it.

    Held across the backend call on purpose: calls on the same container are
    applied in the order they arrived, while other containers go in parallel.
    Stops hold it only until issued (``Executor.ordered_until_issued``).
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: str) -> Callable[[], None]:
        """Wait for ``key``; returns the function that releases it (once)."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._unref(key)
            raise

        def release() -> None:
            lock.release()
            self._unref(key)

        return release

    def _unref(self, key: str) -> None:
        lock, users = self._locks[key]
        if users == 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)

    def users(self, key: str) -> int:
        """Calls holding or waiting for ``key``."""
        return self._locks.get(key, (None, 0))[1]

    def __len__(self) -> int:
        return len(self._locks)
