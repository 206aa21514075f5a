"""Per-object ordering of hooked calls: one lock per pod or container id."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from functools import partial


class KeyedLocks:
    """One lock per pod or container id, gone when nobody holds or awaits it.

    Held across the backend call on purpose: calls on the same container are
    applied in the order they arrived, while other containers go in parallel.
    Stops hold it only until issued (``Executor.ordered_until_issued``).

    What ``asyncio.Lock`` gave, without one per call (nearly every call finds
    its key free, and a lock, its acquire coroutine and its release cost more
    than the rest of this): waiters get the key in the order they came, a
    release hands it to the first waiter still waiting (so no newcomer gets in
    ahead of it), and a waiter cancelled after it was handed the key passes it on.
    """

    def __init__(self) -> None:
        # A held key: its waiters, oldest first (a cancelled one stays until its
        # task has seen the cancel, and is skipped at a release).
        self._held: dict[str, deque[asyncio.Future[None]]] = {}

    def try_acquire(self, key: str) -> Callable[[], None] | None:
        """``key`` at once if nobody holds it: the function that releases it
        (once); None if it is held (then ``await acquire(key)``)."""
        if key in self._held:
            return None
        self._held[key] = deque()
        return partial(self._release, key)

    async def acquire(self, key: str) -> Callable[[], None]:
        """Wait for ``key``; returns the function that releases it (once)."""
        release = self.try_acquire(key)
        if release is not None:
            return release
        waiters = self._held[key]
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(key)  # handed the key, cancelled before it ran: the next one's turn
            else:
                try:
                    waiters.remove(waiter)
                except ValueError:  # a release already skipped it
                    pass
            raise
        return partial(self._release, key)

    def _release(self, key: str) -> None:
        waiters = self._held[key]
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # handed over: the key stays held, by that waiter now
                return
        del self._held[key]

    def users(self, key: str) -> int:
        """Calls holding or waiting for ``key``."""
        waiters = self._held.get(key)
        return 0 if waiters is None else 1 + len(waiters)

    def __len__(self) -> int:
        return len(self._held)
