"""A socket path's holder changing while a claim waits (host/socketlock.py),
on a clock moved on at will: a wait of minutes in no time."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from runtimeproxy.host import socketlock
from runtimeproxy.host.lockholder import holder_text
from runtimeproxy.host.socketlock import SocketInUse, claim
from tests.unixsockets import Clock, LockWaits, stale_socket, until_waiting


async def next_tries(tried: asyncio.Event, claiming: asyncio.Future[object], count: int) -> None:
    """Until a waiting claim tried ``count`` times more; fails should the claim end first."""
    for _ in range(count):
        tried.clear()
        probed = asyncio.ensure_future(tried.wait())
        try:
            await asyncio.wait([probed, claiming], timeout=10, return_when=asyncio.FIRST_COMPLETED)
        finally:
            probed.cancel()
        assert not claiming.done(), claiming.exception() if not claiming.cancelled() else "cancelled"
        assert tried.is_set(), "no try within 10 s"


async def test_a_holder_that_takes_the_lock_as_another_lets_go_is_waited_for_from_then(
    sock_dir: Path, waiting: LockWaits, clock: Clock
) -> None:
    # A (a stop of 300 s) lets go after 100 s, B takes the lock before the
    # waiter's next try, and is starting, its record not written (the
    # waiter's own bound, 30 s): that wait counts from B's taking, not from
    # A's, which was over it already.
    path = sock_dir / "s.sock"
    old = await claim(path, stop_s=300)
    stale_socket(path)
    new = asyncio.ensure_future(claim(path))
    other: socketlock.SocketLock | None = None
    try:
        await until_waiting(waiting, new)
        clock.ahead = 100
        old.release()
        other = await claim(path)  # no await between its try and its hold: before the waiter's next try
        # B's record (another process's pid: the file may have A's inode
        # number, freed and used again), its pid alone, its stop_s not written yet.
        other.path.write_text(f"{os.getppid()}\n")
        await until_waiting(waiting, new)
        assert not new.done(), new.exception()
        first, second = waiting.records
        assert (first.wait_s, first.wait_from) == (300 + socketlock.HOLDER_MARGIN_S, "holder")
        assert second.getMessage() == ("socket path taken meanwhile by another instance that does not serve it "
                                       "(starting or stopping); waiting for that one")
        assert (second.wait_s, second.wait_from, second.holder_stop_s, second.waited_s) == (
            socketlock.LOCK_WAIT_S, "own", None, pytest.approx(100, abs=5))
        other.release()
        lock = await asyncio.wait_for(new, 10)
    finally:
        socketlock.release(other)
        old.release()
        new.cancel()
        await asyncio.gather(new, return_exceptions=True)
    assert lock.held
    lock.release()


async def test_a_chain_of_holders_is_waited_for_at_most_max_wait_s_in_all(
    sock_dir: Path, waiting: LockWaits, clock: Clock
) -> None:
    path = sock_dir / "s.sock"
    holder = await claim(path, stop_s=500)
    stale_socket(path)
    new = asyncio.ensure_future(claim(path))
    try:
        await until_waiting(waiting, new)
        clock.ahead = 400  # the first lets go within its 501 s, the next takes the lock at once
        holder.release()
        holder = await claim(path, stop_s=500)
        holder.path.write_text(holder_text(os.getppid(), 500))  # another process's, as it would be
        await until_waiting(waiting, new)
        assert not new.done(), new.exception()
        clock.ahead = socketlock.MAX_WAIT_S  # 200 s into the second's 501 s, 600 s in all
        with pytest.raises(SocketInUse, match=f"^{path} has been held by other processes one after another "
                                              f"\\(pid {os.getppid()} last, .*\\), none serving it, for 600 s;"):
            await asyncio.wait_for(new, 10)
    finally:
        holder.release()
        new.cancel()
        await asyncio.gather(new, return_exceptions=True)


async def test_a_record_written_after_the_waiters_first_try_gives_the_wait_its_bound(
    sock_dir: Path, waiting: LockWaits, clock: Clock, tried: asyncio.Event
) -> None:
    path = sock_dir / "s.sock"
    old = await claim(path)  # its record not written yet: its pid alone
    stale_socket(path)
    new = asyncio.ensure_future(claim(path))
    try:
        await until_waiting(waiting, new)
        old.path.write_text(holder_text(os.getpid(), 300))
        await until_waiting(waiting, new)
        first, second = waiting.records
        assert (first.wait_s, first.wait_from) == (socketlock.LOCK_WAIT_S, "own")
        assert second.getMessage() == (
            "the socket path's holder recorded how long its stop may take; waiting with the new bound")
        assert (second.wait_s, second.wait_from, second.holder_stop_s) == (
            300 + socketlock.HOLDER_MARGIN_S, "holder", 300)
        clock.ahead = 100  # past its own bound: waiting on
        tried.clear()
        await asyncio.wait_for(tried.wait(), 10)
        await asyncio.wait_for(tried.wait(), 10)  # a try past the probe, and the next
        tried.clear()
        await asyncio.wait_for(tried.wait(), 10)
        assert not new.done(), new.exception()
        old.release()
        lock = await asyncio.wait_for(new, 10)
    finally:
        old.release()
        new.cancel()
        await asyncio.gather(new, return_exceptions=True)
    assert lock.held
    lock.release()


async def test_a_shorter_stop_read_from_the_same_holder_leaves_the_longest_bound(
    sock_dir: Path, waiting: LockWaits, clock: Clock, tried: asyncio.Event
) -> None:
    # A read as the holder writes its record again may meet part of the
    # old and part of the new: 41 written over 101 read as 11. The waiter
    # gave up at once, 100 s into a wait of 102 s.
    path = sock_dir / "s.sock"
    old = await claim(path, stop_s=101)
    stale_socket(path)
    new = asyncio.ensure_future(claim(path))
    try:
        await until_waiting(waiting, new)
        clock.ahead = 100
        old.path.write_text(holder_text(os.getpid(), 11))  # the torn read, as it would read
        await next_tries(tried, new, 2)  # a try past the probe, and the next
        assert [record.wait_s for record in waiting.records] == [101 + socketlock.HOLDER_MARGIN_S]
        old.release()
        lock = await asyncio.wait_for(new, 10)
    finally:
        old.release()
        new.cancel()
        await asyncio.gather(new, return_exceptions=True)
    assert lock.held
    lock.release()
