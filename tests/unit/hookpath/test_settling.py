"""The count of calls shutdown's settle waits for (hookpath/settling.py): its event is set exactly
while no call is counted, however they nest, end or fail."""

from __future__ import annotations

import asyncio

import pytest

from runtimeproxy.hookpath.settling import Unsettled


async def test_the_event_is_set_exactly_while_nothing_is_counted() -> None:
    unsettled = Unsettled()
    assert unsettled.count == 0 and unsettled.none.is_set()
    with unsettled:
        assert unsettled.count == 1 and not unsettled.none.is_set()
        with unsettled:
            assert unsettled.count == 2 and not unsettled.none.is_set()
        assert unsettled.count == 1 and not unsettled.none.is_set()
        with pytest.raises(asyncio.CancelledError), unsettled:
            raise asyncio.CancelledError  # a call cancelled while counted: counted out, not swallowed
        assert unsettled.count == 1 and not unsettled.none.is_set()
    assert unsettled.count == 0 and unsettled.none.is_set()


async def test_a_waiter_wakes_once_the_last_counted_call_ends() -> None:
    unsettled = Unsettled()

    async def call(entered: asyncio.Event, wait: asyncio.Event) -> None:
        with unsettled:
            entered.set()
            await wait.wait()

    events = [(asyncio.Event(), asyncio.Event()) for _ in range(2)]
    calls = [asyncio.ensure_future(call(*pair)) for pair in events]
    await asyncio.gather(*(entered.wait() for entered, _ in events))
    waiter = asyncio.ensure_future(unsettled.none.wait())
    events[0][1].set()
    await calls[0]
    assert unsettled.count == 1 and not unsettled.none.is_set()
    events[1][1].set()
    await asyncio.wait_for(waiter, 5)
    assert unsettled.count == 0
