"""One run at a time of an async step, which a second call joins (``HookServer.start``).

A call while a run is under way waits for it and shares its outcome: it
returns once the run has returned, or raises the run's error (a cancelled
run: a :class:`HookServerError` saying so, not a cancel of the waiter, which
was not cancelled). A waiter cancelled leaves the run going.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from hooks.errors import HookServerError


class SharedRun:
    def __init__(self, what: str) -> None:
        self._what = what  # for the error of a run cancelled: "the start of the hook server on ..."
        self._under_way: asyncio.Future[None] | None = None

    @property
    def under_way(self) -> bool:
        return self._under_way is not None and not self._under_way.done()

    async def run(self, step: Callable[[], Awaitable[None]]) -> None:
        """``step()``, or, while a run is under way, its outcome."""
        if self._under_way is not None and not self._under_way.done():
            await asyncio.shield(self._under_way)
            return
        run = self._under_way = asyncio.get_running_loop().create_future()
        try:
            await step()
        except BaseException as exc:
            run.set_exception(exc if isinstance(exc, Exception) else
                              HookServerError(f"{self._what} that this call waited for was cancelled"))
            run.exception()  # retrieved: with no call waiting, not logged as "never retrieved"
            raise
        run.set_result(None)
