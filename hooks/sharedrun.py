"""One run at a time of an async step, which a second call joins (``HookServer.start``).

A call while a run is under way waits for it and shares its outcome: it
returns once the run has returned, or raises the run's error (a cancelled
run: a :class:`HookServerError` saying so, not a cancel of the waiter, which
was not cancelled). A waiter cancelled leaves the run going; the call that
began the run cancelled cancels it, and returns once it has ended (a start
lets its lock go on the way). :meth:`SharedRun.cancel` cuts the run from
outside (``HookServer.stop`` during a start): it runs in a task of its own
for that, so that its callers get a :class:`HookServerError`, not a cancel
of their own tasks. A run is cancelled once at most, whoever asks again
(a second stop, the first caller cancelled after a stop): a further cancel
would reach the run in its clean-up (a start stopping the listener it had
made) and cut that short, leaving the listener or its socket behind.
For the same reason a run whose clean-up has begun on its own (a start that
failed, running its release step) says so (:meth:`SharedRun.finishing`):
no cancel reaches it then, and a stop waits for that step, bounded by it.
A stop from within the run itself (a built-in hook's start whose last
step failed, stopping the server it started) cuts and waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hooks.errors import HookServerError

logger = logging.getLogger("hooks.sdk")

T = TypeVar("T")


class SharedRun:
    def __init__(self, what: str) -> None:
        self._what = what  # for the error of a run cancelled: "the start of the hook server on ..."
        self._run: asyncio.Task[None] | None = None
        self._cut_by = ""  # who cut the run under way (cancel()), for its callers' error
        self._cancelled = False  # the run under way was cancelled: never again (its clean-up runs)

    @property
    def under_way(self) -> bool:
        return self._run is not None and not self._run.done()

    async def run(self, step: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """``step()``, or, while a run is under way, its outcome."""
        run, first = self._run, False
        if run is None or run.done():
            run, first, self._cut_by, self._cancelled = asyncio.ensure_future(step()), True, "", False
            run.add_done_callback(retrieve)  # a failure after its first caller was cancelled: not "never retrieved"
            self._run = run
        try:
            await asyncio.shield(run)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # this call was cancelled, not the run
                if first:  # its own run: cancelled with it, as when the step was awaited directly
                    self._cancel(run)
                    while not run.done():  # to its end, through a further cancel (its start's clean-up is under way)
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.wait({run})
                raise
            waited = "" if first else " that this call waited for"
            raise HookServerError(f"{self._what}{waited} was cancelled{self._cut_by}") from None

    async def cancel(self, by: str) -> None:
        """Cut the run under way, if any (``by``: who, for its callers'
        error); returns once it has ended. From within the run: nothing."""
        run = self._run
        if run is None or run.done() or run is asyncio.current_task():  # (the run's own stop: it would wait for itself)
            return
        if not self._cancelled:  # else it is ending already, cancelled by whoever came first
            self._cut_by = f" by {by}"
            self._cancel(run)
        await asyncio.wait({run})

    def finishing(self) -> None:
        """Called by the run as its clean-up begins (a start that failed on
        its own): no cancel cuts that clean-up from now on, and the run's own
        error is what its callers get (a stop then only waits for it)."""
        self._cancelled = True

    def _cancel(self, run: asyncio.Task[None]) -> None:
        if not self._cancelled:
            self._cancelled = True
            run.cancel()


async def to_end(step: Coroutine[Any, Any, T], what: str = "a clean-up") -> T:
    """``step``, run to its end however often the caller is cancelled
    meanwhile: a clean-up that a cancel must not cut (a listener half
    stopped, its socket left). Only for a step bounded itself (a stop with
    no grace, a file removed): nothing here cuts one that hangs, not even
    a second cancel. The caller's cancel is raised, with its message, once
    the step has ended; the step's failure then, which nobody reads, is
    logged at warning naming ``what``."""
    task = asyncio.ensure_future(step)
    cancel: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancel = cancel or exc
    if cancel is None:
        return task.result()
    if not task.cancelled() and (failure := task.exception()) is not None:
        logger.warning("%s failed after its caller was cancelled: %s", what, failure, exc_info=failure,
                       extra={"step": what, "error": repr(failure)})
    raise cancel


def retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback for a task nobody awaits any more (a run whose caller
    was cancelled, a cut release step): its late failure logged at debug,
    not by asyncio as 'never retrieved'."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.debug("a task whose caller left failed after it left", exc_info=exc)
