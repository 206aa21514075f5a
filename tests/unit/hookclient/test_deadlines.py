"""Hook calls' deadlines on one timer (hookclient/deadlines.py) end calls as
``asyncio.timeout_at`` does: each scenario runs under both, with the same outcome."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from runtimeproxy.hookclient.deadlines import Deadlines

Bounds = Callable[[float], Any]  # a loop time -> a context manager bounding a block by it


@contextlib.asynccontextmanager
async def _asyncio_timeout(deadline: float):  # type: ignore[no-untyped-def]
    async with asyncio.timeout_at(deadline):
        yield


def _shared() -> Bounds:
    deadlines = Deadlines()

    @contextlib.asynccontextmanager
    async def bound(deadline: float):  # type: ignore[no-untyped-def]
        with deadlines.bound(deadline):
            yield

    return bound


KINDS = {"asyncio.timeout_at": lambda: _asyncio_timeout, "Deadlines": _shared}


async def _call(bound: Bounds, deadline: float, done: asyncio.Event) -> str:
    """A call that ends when ``done`` is set, bounded by ``deadline``."""
    loop = asyncio.get_running_loop()
    try:
        async with bound(deadline):
            await done.wait()
    except TimeoutError:
        assert loop.time() >= deadline - 0.002  # (libuv's clock has milliseconds)
        return "timed out"
    return "answered"


@pytest.mark.parametrize("kind", list(KINDS))
async def test_calls_end_at_their_own_deadlines_whatever_order_they_came_in(kind: str) -> None:
    bound, loop = KINDS[kind](), asyncio.get_running_loop()
    now = loop.time()
    hanging, answered = asyncio.Event(), asyncio.Event()
    # late far enough past early that no stall of a loaded loop reaches it before
    # the check below (before: 0.25 s apart); still ended by its own deadline, the timer set again
    late = asyncio.ensure_future(_call(bound, now + 2.0, hanging))  # the timer is set for it first
    early = asyncio.ensure_future(_call(bound, now + 0.05, hanging))  # then for this one, earlier
    quick = asyncio.ensure_future(_call(bound, now + 0.1, answered))
    answered.set()
    assert await quick == "answered"
    assert await early == "timed out"
    assert not late.done()  # the earlier deadline ended only its own call
    assert await late == "timed out"


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_deadline_already_past_ends_the_call_at_its_first_wait(kind: str) -> None:
    bound, loop = KINDS[kind](), asyncio.get_running_loop()
    assert await _call(bound, loop.time() - 1, asyncio.Event()) == "timed out"


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_cancel_from_elsewhere_stays_a_cancel(kind: str) -> None:
    bound, loop = KINDS[kind](), asyncio.get_running_loop()
    waiting = asyncio.Event()

    async def call() -> None:
        async with bound(loop.time() + 10):
            waiting.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(call())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_cancel_from_elsewhere_at_the_deadline_stays_a_cancel(kind: str) -> None:
    """Cancelled by its caller after the deadline cancelled it, before it ran
    again: two cancels, one not the deadline's, so not a timeout."""
    bound, loop = KINDS[kind](), asyncio.get_running_loop()
    caller: list[asyncio.Task[None]] = []
    deadline = loop.time() + 0.05

    async def call() -> None:
        async with bound(deadline):
            await asyncio.Event().wait()

    task = asyncio.ensure_future(call())
    # At the deadline, in the loop turn of the deadline's own timer: before the task runs again.
    loop.call_at(deadline, lambda: caller.append(task) or task.cancel())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert caller == [task]


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_call_that_catches_its_timeout_is_free_to_go_on(kind: str) -> None:
    bound, loop = KINDS[kind](), asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    assert await _call(bound, loop.time() + 0.02, asyncio.Event()) == "timed out"
    assert task.cancelling() == before  # its cancel was taken back: later awaits are not cancelled
    assert await _call(bound, loop.time() + 5, _set()) == "answered"


def _set() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


async def test_ended_calls_leave_nothing_behind_and_the_timer_follows_the_calls_under_way() -> None:
    deadlines, loop = Deadlines(), asyncio.get_running_loop()

    @contextlib.asynccontextmanager
    async def with_them(deadline: float):  # type: ignore[no-untyped-def]
        with deadlines.bound(deadline):
            yield

    for _ in range(100):  # ended well before their deadline
        assert await _call(with_them, loop.time() + 0.05, _set()) == "answered"
    assert deadlines._live == set()
    hanging = asyncio.Event()
    late = asyncio.ensure_future(_call(with_them, loop.time() + 0.2, hanging))
    # The timer set by the first of the hundred fires, finds nothing due, and is set for this one.
    assert await late == "timed out"
    assert deadlines._live == set() and deadlines._timer is None


async def test_a_timer_run_before_its_time_ends_the_calls_due_then_and_is_not_set_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # uvloop rounds a timer to whole milliseconds and may run it a little before
    # loop.time() reaches it: what the timer was set for is due all the same, or
    # it is set again for that time and runs again at once, spinning until then.
    loop, deadlines = asyncio.get_running_loop(), Deadlines()
    deadline = loop.time() + 30.0  # (never reached: the timer is run by hand below)
    task = asyncio.ensure_future(_bounded(deadlines, deadline))
    await asyncio.sleep(0)  # (the call is under way, the timer set for its deadline)
    armed: list[float] = []
    real_call_at = loop.call_at
    monkeypatch.setattr(loop, "call_at", lambda when, cb, *args: armed.append(when) or real_call_at(when, cb, *args))
    monkeypatch.setattr(loop, "time", lambda: deadline - 0.0004)  # run 0.4 ms early
    deadlines._fire()
    monkeypatch.undo()
    assert armed == []  # not set again for the same time
    assert await task == "timed out"


async def _bounded(deadlines: Deadlines, deadline: float) -> str:
    try:
        with deadlines.bound(deadline):
            await asyncio.Event().wait()
    except TimeoutError:
        return "timed out"
    return "answered"


async def test_closed_deadlines_drop_their_timer_and_are_freed_at_once() -> None:
    """A call that ends leaves the timer set for its deadline, holding the
    deadlines (and the client) until then; closed, the timer goes at once."""
    deadlines, loop = Deadlines(), asyncio.get_running_loop()
    with deadlines.bound(loop.time() + 60):
        pass  # answered: the timer stays set for a minute from now
    deadlines.close()
    alive = weakref.ref(deadlines)
    del deadlines
    assert alive() is None
