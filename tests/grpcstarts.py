"""Cancelling a task at the one await of grpc.aio's server start."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

SERVING_TASK = "_server_main_loop"  # what AioServer.start creates, then awaits the first step of


@contextlib.contextmanager
def cancelling_as_grpc_starts(task: asyncio.Future[Any]) -> Iterator[list[bool]]:
    """Cancel ``task`` as a grpc.aio server's start creates its serving task:
    the start (wherever it runs) then awaits that task's first step, which
    has not run yet. Yields a list that holds True once the cancel was made."""
    loop = asyncio.get_running_loop()
    real = loop.create_task
    fired: list[bool] = []

    def create_task(coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made = real(coro, **kwargs)
        if not fired and getattr(coro, "__name__", None) == SERVING_TASK:
            fired.append(task.cancel())
        return made

    # The method replaced on purpose, on this loop only: mypy refuses any method assignment.
    loop.create_task = create_task  # type: ignore[method-assign]
    try:
        yield fired
    finally:
        del loop.create_task  # the loop's own again (one loop for the whole run)
