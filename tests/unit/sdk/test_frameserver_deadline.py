"""hooks/frameserver/calls.py's Deadline and within, under which connection.py's _run
runs a handler, against asyncio.timeout, which they replaced: each way a handler can
meet its deadline ends the same under both (answered, answered DEADLINE_EXCEEDED, or
cancelled with nobody to answer), and leaves its task's count of cancel requests the
same, on both event loops."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from hooks.frameserver.calls import CALL_DEADLINE, Deadline, within

Body = Callable[[], Awaitable[object]]


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()  # never done


async def _answers() -> object:
    return "answer"


async def _outlives() -> object:
    await _forever()
    return "never"


async def _swallows_the_cancel() -> object:
    try:
        await _forever()
    except asyncio.CancelledError:
        return "answer after all"
    return "never"


async def _cancelled_again() -> object:
    try:
        await _forever()
    except asyncio.CancelledError:
        asyncio.current_task().cancel()  # type: ignore[union-attr]  # a reset arrives as the deadline passes
        raise
    return "never"


async def _cancelled_first() -> object:
    asyncio.current_task().cancel()  # type: ignore[union-attr]  # a reset before the deadline
    await _forever()
    return "never"


async def _raises_timeout() -> object:
    raise TimeoutError("the route's own")


BODIES: dict[str, tuple[float, Body]] = {
    "answers in time": (5.0, _answers),
    "outlives its deadline": (0.001, _outlives),
    "swallows the deadline's cancel": (0.001, _swallows_the_cancel),
    "cancelled again at its deadline": (0.001, _cancelled_again),
    "cancelled before its deadline": (5.0, _cancelled_first),
    "no time, answers without waiting": (0.0, _answers),
    "no time, waits": (0.0, _outlives),
    "raises TimeoutError itself": (5.0, _raises_timeout),
}


async def _with_asyncio_timeout(seconds: float, body: Body) -> object:
    try:
        async with asyncio.timeout(seconds):
            return await body()
    except TimeoutError:
        return "DEADLINE_EXCEEDED"


async def _with_deadline(seconds: float, body: Body) -> object:
    try:
        return await within(Deadline(seconds), body())  # as connection.py's _run
    except TimeoutError:
        return "DEADLINE_EXCEEDED"


async def _outcome(run: Callable[[float, Body], Awaitable[object]], seconds: float, body: Body) -> tuple[object, int]:
    async def task() -> tuple[object, int]:
        answer = await run(seconds, body)
        return answer, asyncio.current_task().cancelling()  # type: ignore[union-attr]

    try:
        return await asyncio.get_running_loop().create_task(task())
    except asyncio.CancelledError:
        return "cancelled", -1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("case", list(BODIES))
def test_a_deadline_ends_a_handler_as_asyncio_timeout_did(case: str, loop: str) -> None:
    seconds, body = BODIES[case]
    factory = uvloop.new_event_loop if loop == "uvloop" else None
    with asyncio.Runner(loop_factory=factory) as runner:
        expected = runner.run(_outcome(_with_asyncio_timeout, seconds, body))
        got = runner.run(_outcome(_with_deadline, seconds, body))
    assert got == expected
    assert expected[0] in ("answer", "answer after all", "DEADLINE_EXCEEDED", "cancelled")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_answered_calls_task_is_freed_without_the_cyclic_collector(loop: str) -> None:
    """As connection.py's _run: the deadline in the task's context (CALL_DEADLINE)
    must not keep a cycle back to the task once the call is answered, else every
    call's task, coroutines and context wait for the collector (a twentieth of a
    no-op call's instructions, by bench.hookcpu)."""

    async def run() -> object:
        deadline = Deadline(5.0)
        CALL_DEADLINE.set(deadline)
        return await within(deadline, _answers())

    async def call() -> weakref.ref[asyncio.Task[object]]:
        task = asyncio.get_running_loop().create_task(run())
        assert await task == "answer"
        ref = weakref.ref(task)
        del task
        await asyncio.sleep(0)  # the loop's own references (its done callbacks) go
        return ref

    factory = uvloop.new_event_loop if loop == "uvloop" else None
    gc.collect()
    gc.disable()
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            ref = runner.run(call())
            assert ref() is None
    finally:
        gc.enable()
