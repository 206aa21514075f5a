"""KeyedLocks: the order asyncio.Lock gave calls on one object, kept without a lock per call."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from runtimeproxy.hookpath.locks import KeyedLocks

T = TypeVar("T")


class _LockPerKey:
    """The implementation KeyedLocks replaced (an asyncio.Lock per key): the reference."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: str) -> Callable[[], None]:
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

    def __len__(self) -> int:
        return len(self._locks)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _held(locks: KeyedLocks) -> Callable[[], None]:
    """ctr-1 taken at once: its release."""
    release = locks.try_acquire("ctr-1")
    assert release is not None
    return release


def _in_turn(locks: KeyedLocks, order: list[T]) -> Callable[[T], Awaitable[None]]:
    """A call that waits for ctr-1, notes ``n`` in ``order`` once it has it, and lets it go."""

    async def call(n: T) -> None:
        release = await locks.acquire("ctr-1")
        order.append(n)
        release()

    return call


async def test_a_free_key_is_taken_at_once_and_freed_by_its_release() -> None:
    locks = KeyedLocks()
    release = locks.try_acquire("ctr-1")
    assert release is not None
    assert locks.try_acquire("ctr-1") is None  # held
    assert locks.try_acquire("ctr-2") is not None  # another object goes in parallel
    assert locks.users("ctr-1") == 1
    release()
    assert locks.users("ctr-1") == 0
    assert len(locks) == 1  # ctr-2's
    assert locks.try_acquire("ctr-1") is not None


async def test_waiters_get_the_key_in_the_order_they_came_one_at_a_time() -> None:
    locks = KeyedLocks()
    first = _held(locks)
    order: list[int] = []
    holding: list[int] = []

    async def call(n: int) -> None:
        release = await locks.acquire("ctr-1")
        holding.append(n)
        assert len(holding) == 1  # never two at once
        order.append(n)
        await asyncio.sleep(0)
        holding.remove(n)
        release()

    tasks = [asyncio.create_task(call(n)) for n in range(4)]
    await _settle()
    assert locks.users("ctr-1") == 5 and order == []
    first()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]
    assert len(locks) == 0


async def test_a_newcomer_does_not_get_in_ahead_of_the_waiter_a_release_woke() -> None:
    locks = KeyedLocks()
    first = _held(locks)
    order: list[str] = []
    call = _in_turn(locks, order)

    waiter = asyncio.create_task(call("waiter"))
    await _settle()
    first()  # handed to the waiter, which has not run yet
    assert locks.try_acquire("ctr-1") is None
    await asyncio.gather(waiter, call("newcomer"))
    assert order == ["waiter", "newcomer"]
    assert len(locks) == 0


async def test_a_cancelled_waiter_is_skipped_and_leaves_nothing_behind() -> None:
    locks = KeyedLocks()
    first = _held(locks)
    order: list[int] = []
    call = _in_turn(locks, order)

    tasks = [asyncio.create_task(call(n)) for n in range(3)]
    await _settle()
    tasks[1].cancel()
    await _settle()
    assert locks.users("ctr-1") == 3  # the holder and two waiters
    first()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[1], asyncio.CancelledError)
    assert order == [0, 2]
    assert len(locks) == 0


async def test_a_waiter_cancelled_after_it_was_handed_the_key_passes_it_on() -> None:
    locks = KeyedLocks()
    first = _held(locks)
    order: list[int] = []
    call = _in_turn(locks, order)

    tasks = [asyncio.create_task(call(n)) for n in range(2)]
    await _settle()
    first()  # handed to call 0...
    tasks[0].cancel()  # ...which is cancelled before it runs
    async with asyncio.timeout(5):  # a key left held would stop call 1 for good
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert order == [1]  # not stuck behind a holder that never ran
    assert len(locks) == 0


async def test_a_waiter_cancelled_while_a_release_skips_it_leaves_the_key_consistent() -> None:
    locks = KeyedLocks()
    first = _held(locks)
    waiter = asyncio.create_task(locks.acquire("ctr-1"))
    await _settle()
    waiter.cancel()  # its future is cancelled now; its task sees it later
    first()  # skips it: the key is free
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(locks) == 0
    assert locks.try_acquire("ctr-1") is not None


async def _trace(locks: KeyedLocks | _LockPerKey, seed: int) -> list[tuple[str, int]]:
    """Random calls on three keys, some cancelled while waiting or holding: the order keys are taken in."""
    rng = random.Random(seed)
    taken: list[tuple[str, int]] = []
    tasks: list[asyncio.Task[None]] = []

    async def call(n: int, key: str, steps: int) -> None:
        release = await locks.acquire(key)
        taken.append((key, n))
        try:
            for _ in range(steps):
                await asyncio.sleep(0)
        finally:
            release()

    for n in range(40):
        tasks.append(asyncio.create_task(call(n, rng.choice("abc"), rng.randrange(3))))
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
        if rng.random() < 0.3:
            rng.choice(tasks).cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(locks) == 0
    return taken


@pytest.mark.parametrize("seed", range(30))
async def test_keys_are_taken_in_the_order_a_lock_per_key_gave(seed: int) -> None:
    assert await _trace(KeyedLocks(), seed) == await _trace(_LockPerKey(), seed)
