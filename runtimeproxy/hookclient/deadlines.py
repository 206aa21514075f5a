"""Hook calls' deadlines, all on one timer of the event loop.

``asyncio.timeout_at`` gives each call a timer of its own (uvloop makes and
frees a libuv timer for it) and an async context manager: some 30,000
instructions a call, a seventh of a hook call's. Here the calls under way are
a set, and one timer is set for the earliest deadline among them: a call
that ends before its deadline leaves the timer as it is (when it fires, it
finds nothing due and is set for the earliest call then under way, if any),
and one that starts while it is set for an earlier time sets nothing. At its
deadline a call is cancelled and ends with ``TimeoutError`` exactly as under
``asyncio.timeout_at``: a cancel of the task from elsewhere (its caller's)
stays a cancel.
"""

from __future__ import annotations

import asyncio
import math


class Deadlines:
    def __init__(self) -> None:
        self._live: set[Bound] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires

    def bound(self, deadline: float) -> Bound:
        """``with deadlines.bound(loop_time):`` in a task: cancelled at that
        time of the loop's clock, the block raises ``TimeoutError``."""
        return Bound(self, deadline)

    def _add(self, bound: Bound) -> None:
        self._live.add(bound)
        if bound.deadline < self._at:
            loop = asyncio.get_running_loop()
            if self._timer is not None:
                self._timer.cancel()
            self._loop, self._at = loop, bound.deadline
            self._timer = loop.call_at(bound.deadline, self._fire)

    def close(self) -> None:
        """No call is bounded any more (the client closed): the timer goes now,
        not at its time, and with it what it holds on to."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = None, math.inf

    def _fire(self) -> None:
        assert self._loop is not None
        # A loop may run a timer a little before its time (uvloop rounds to whole
        # milliseconds): what it was set for is due, or it would be set again and spin.
        now = max(self._loop.time(), self._at)
        self._timer, self._at = None, math.inf
        for bound in sorted((b for b in self._live if b.deadline <= now), key=lambda b: b.deadline):
            bound.expire()  # (in deadline order, as their own timers would)
        if self._live:  # the earliest call still under way
            self._at = min(b.deadline for b in self._live)
            self._timer = self._loop.call_at(self._at, self._fire)


class Bound:
    """One call's deadline: a synchronous context manager (``asyncio.Timeout``'s
    logic, without its awaits), for one use."""

    __slots__ = ("_deadlines", "deadline", "_task", "_cancelling", "_expired")

    def __init__(self, deadlines: Deadlines, deadline: float) -> None:
        self._deadlines = deadlines
        self.deadline = deadline
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._expired = False

    def __enter__(self) -> Bound:
        task = self._task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline is bound in a task")
        self._cancelling = task.cancelling()
        self._deadlines._add(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._deadlines._live.discard(self)
        # As asyncio.Timeout: our cancel, and no other since the block began, ends it as a timeout.
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:  # type: ignore[union-attr]  # set: __enter__ raises without a task
            raise TimeoutError from exc

    def expire(self) -> None:
        """Its deadline came while the block runs: its task is cancelled."""
        self._deadlines._live.discard(self)
        self._expired = True
        self._task.cancel()  # type: ignore[union-attr]  # (as above)
