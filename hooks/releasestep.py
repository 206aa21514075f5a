"""The bound on a hook server's last step before its socket's lock goes (``HookServer._before_release``).

The step runs once the server has stopped, or once a start that failed
after ``_before_serving`` has undone its listener, and before the lock is
let go, so a state write it finishes lands before the next instance,
waiting on the lock, reads the state. A step that hangs would keep the
lock, and the stop (or the failed start), forever: past :data:`RELEASE_STEP_TIMEOUT_S` (the server's
``release_step_timeout``) it is cancelled, logged at warning naming the
server, and the lock goes all the same, without waiting for the step to
end (one that swallows the cancel is left to itself).

A step that cannot cut a write of its own (one in a thread, which no cancel
stops) returns it, still running, instead of waiting for it: the stop (or
failed start) ends,
and the lock stays held until that write has ended
(``socketlock.release_once_stopped``), so it cannot land after the next
instance has read the state or written its own. That instance waits on the
lock meanwhile, and is refused past its wait, naming this process's pid.
Hand back the default executor's own future (``loop.run_in_executor(None,
...)``), not a Task awaiting the thread: asyncio.run's end cancels the tasks
left, and a cancelled future says nothing of the write, so the lock then
stays until the process exits. Not one of an executor of the hook's own
either: asyncio.run joins its default executor as it ends, its loop still
running, so that future ends (the lock goes) and the process does not exit
before the write ends; another executor's future whose write outlives the
loop never ends (asyncio drops the outcome of a future whose loop has
closed), so the lock stays in that process for good, and a start again is
refused. Writes queued in a thread of the hook's own are joined from the
default executor (batchresource's last saves: ``hooks.batchresource.writer``).
A ``_before_serving`` cut by a stop hands over a read of its own in a thread
so too (batchresource's state dir load): the start ends, the lock waits.

A step that awaits more after starting such a write hands it over as soon
as it starts (``HookServer._keep_lock_until``): it keeps the lock then even
when the step is cut by its bound or a cancelled stop, or fails, before it
could return it. So does one that waits for the write up to a bound of its
own (balloons' 2 s): a ``release_step_timeout`` set below that bound cuts
the step before it returns the write, and the lock must still wait for it.

A stop cancelled during the step cuts it, as its bound does: the lock goes.
A stop during a failed start's step does not cut it, but waits for it
(``SharedRun.finishing``). Its log lines name which of the two ran it.
The bound acts at the step's awaits only: blocking code in it is not cut.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

from hooks.sharedrun import retrieve

logger = logging.getLogger("hooks.sdk")

# Long enough for a few small fsync-ed state files on a busy disk; a
# subclass whose step needs longer sets its ``release_step_timeout``.
RELEASE_STEP_TIMEOUT_S = 5.0

Pending = asyncio.Future[Any]
Step = Callable[[], Awaitable["Pending | None"]]
Handed = Callable[[], "Pending | None"]

# What ran the step, as its log lines name it: a stop, or a start that failed once it held the lock.
# A Literal, not a str: keep() runs in a finally, where a mistyped one would keep the lock (it
# looks it up with .get: a caller mypy does not check still gets its line, not a KeyError).
At = Literal["stop", "failed start"]
AT_STOP: Final = "stop"
AT_FAILED_START: Final = "failed start"
_ENDED: dict[At, str] = {AT_STOP: "stopped", AT_FAILED_START: "failed to start"}


def _none() -> Pending | None:
    return None


async def run_bounded(step: Step, timeout: float, server: str, socket: str, handed: Handed = _none,
                      at: At = AT_STOP) -> Pending | None:
    """Run ``step`` for at most ``timeout`` seconds; what it returns still
    pending (the lock is kept until it is done), else what it handed over
    (``handed()``) still pending, else None. Its failure, or its being cut,
    is logged: the lock goes all the same, unless a write it handed over
    keeps it. A cancel cuts it and goes on: the caller then :func:`keep`-s
    what it handed over. ``at``: what ran it (:data:`AT_STOP`, :data:`AT_FAILED_START`), for its log."""
    task = asyncio.ensure_future(step())
    try:
        await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:  # the stop (or failed start) was cancelled: the step is cut, as past its bound
        _cut(task, server, socket, f"the {at} was cancelled", handed())
        raise
    extra = {"server": server, "socket": socket}
    if not task.done():
        _cut(task, server, socket, f"it did not end within {timeout:g}s", handed(), timeout_s=timeout)
        return keep(handed(), server, socket, at)
    try:
        pending = task.result()
    except (Exception, asyncio.CancelledError) as exc:  # (a step may raise CancelledError itself) the lock goes
        logger.error("%s's last step before releasing its socket's lock failed", server, exc_info=exc,
                     extra={**extra, "error": repr(exc)})
        return keep(handed(), server, socket, at)
    return keep(pending if pending is not None else handed(), server, socket, at)


class LastStep:
    """The release step of a server's stops and failed starts
    (``HookServer._before_release``), and what the last one left its lock
    to wait for."""

    def __init__(self) -> None:
        self.kept: Pending | None = None  # a last write the last step's lock waits for
        self.handed: Pending | None = None  # what the step under way handed over

    def hand_over(self, write: Pending) -> None:
        """``write`` keeps the lock until it ends, even when the step is then cut or fails."""
        self.handed = write

    async def run(self, step: Step, timeout: float, server: str, socket: str, at: At = AT_STOP) -> Pending | None:
        """:func:`run_bounded`; a write the step returned or handed over,
        still running, is kept (:attr:`kept`), even when a cancel of the stop
        cuts the step (``socketlock.release_once_stopped`` reads it then)."""
        self.kept = self.handed = None
        try:
            self.kept = await run_bounded(step, timeout, server, socket, lambda: self.handed, at)
        except asyncio.CancelledError:
            self.kept = keep(self.handed, server, socket, at)
            raise
        return self.kept


def keep(pending: Pending | None, server: str, socket: str, at: At = AT_STOP) -> Pending | None:
    """``pending`` when it is still running (logged: the lock is kept until
    it ends, and how it ended), else None (its failure, if it failed, logged)."""
    extra = {"server": server, "socket": socket}
    if pending is None:
        return None
    if pending.done():
        _ended(pending, server, extra, "")
        return None
    logger.warning("%s %s, but keeps its socket's lock until disk I/O it cannot cut has ended (a stalled "
                   "disk?): an instance waiting on the lock waits meanwhile, and this process does not exit "
                   "before that I/O ends (a thread's is joined at exit)", server, _ENDED.get(at, at), extra=extra)
    pending.add_done_callback(lambda done: _ended(done, server, extra, ": its socket's lock goes"))
    return pending


def _ended(write: Pending, server: str, extra: dict[str, str], lock: str) -> None:
    """How a kept write ended: a failure at warning (retrieved: not asyncio's
    "never retrieved"), a success at info once it kept the lock."""
    if write.cancelled():  # socketlock says so: the lock stays
        return
    if (exc := write.exception()) is not None:
        logger.warning("%s's last write failed%s (state it was writing may be missing or old for the next "
                       "instance)", server, lock, exc_info=exc, extra={**extra, "error": repr(exc)})
    elif lock:
        logger.info("%s's last write has ended%s", server, lock, extra=extra)


def _cut(task: asyncio.Future[Any], server: str, socket: str, why: str, handed: Pending | None,
         **extra: float) -> None:
    task.cancel()
    task.add_done_callback(retrieve)  # not awaited: a step that swallows the cancel must not hold the stop
    lock = ("the lock kept until the write it handed over ends" if handed is not None and not handed.done()
            else "and the lock released anyway")
    logger.warning("%s's last step before releasing its socket's lock was cut (%s), %s (state it was writing "
                   "may be missing or old for the next instance)", server, why, lock,
                   extra={"server": server, "socket": socket, **extra})
