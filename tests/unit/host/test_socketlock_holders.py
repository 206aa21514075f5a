"""A socket path's holder changing while a claim waits (host/socketlock.py),
on a clock moved on at will: a wait of minutes in no time."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest

from runtimeproxy.host import socketlock
from runtimeproxy.host.lockholder import holder_text
from runtimeproxy.host.socketlock import SocketInUse, claim, lock_path
from tests.unixsockets import Clock, LockWaits, next_tries, until_waiting, waiting_claim


async def test_a_holder_that_takes_the_lock_as_another_lets_go_is_waited_for_from_then(
    sock_dir: Path, waiting: LockWaits, clock: Clock
) -> None:
    # A (a stop of 300 s) lets go after 100 s, B takes the lock before the
    # waiter's next try, and is starting, its record without a stop (the
    # waiter's own bound, 30 s): that wait counts from B's taking, not from
    # A's, which was over it already.
    path = sock_dir / "s.sock"
    other: socketlock.SocketLock | None = None
    try:
        async with waiting_claim(path, waiting, stop_s=300) as (old, new):
            clock.ahead = 100
            old.release()
            # No await between its try and its hold: before the waiter's next try.
            # Its record: A's pid (one process here), and its file may have A's
            # inode number (A's file removed and closed, the number free again):
            # its nonce alone tells it from A.
            other = await claim(path)
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
    assert lock.held
    lock.release()


async def test_a_chain_of_holders_is_waited_for_at_most_max_wait_s_in_all(
    sock_dir: Path, waiting: LockWaits, clock: Clock
) -> None:
    path = sock_dir / "s.sock"
    other: socketlock.SocketLock | None = None
    try:
        async with waiting_claim(path, waiting, stop_s=500) as (old, new):
            clock.ahead = 400  # the first lets go within its 501 s, the next takes the lock at once
            old.release()
            other = await claim(path, stop_s=500)
            other.path.write_text(holder_text(os.getppid(), 500, other.nonce))  # another process's, as it would be
            await until_waiting(waiting, new)
            assert not new.done(), new.exception()
            clock.ahead = socketlock.MAX_WAIT_S  # 200 s into the second's 501 s, 600 s in all
            with pytest.raises(SocketInUse, match=f"^{path} has been held by other processes one after another "
                                                  f"\\(pid {os.getppid()} last, .*\\), none serving it, for 600 s;"):
                await asyncio.wait_for(new, 10)
    finally:
        socketlock.release(other)


async def test_a_record_written_after_the_waiters_first_try_gives_the_wait_its_bound(
    sock_dir: Path, waiting: LockWaits, clock: Clock, tried: asyncio.Event
) -> None:
    # The holder's record not written yet: its pid alone.
    async with waiting_claim(sock_dir / "s.sock", waiting) as (old, new):
        old.path.write_text(holder_text(os.getpid(), 300, old.nonce))
        await until_waiting(waiting, new)
        first, second = waiting.records
        assert (first.wait_s, first.wait_from) == (socketlock.LOCK_WAIT_S, "own")
        assert second.getMessage() == (
            "the socket path's holder recorded how long its stop may take; waiting with the new bound")
        assert (second.wait_s, second.wait_from, second.holder_stop_s) == (
            300 + socketlock.HOLDER_MARGIN_S, "holder", 300)
        clock.ahead = 100  # past its own bound: waiting on
        await next_tries(tried, new, 2)  # a try past the probe, and the next
        old.release()
        lock = await asyncio.wait_for(new, 10)
    assert lock.held
    lock.release()


def torn_reads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the next preads read instead of the file, one each (a read as the holder writes)."""
    pending: list[bytes] = []
    pread = os.pread

    def torn(fd: int, size: int, offset: int) -> bytes:
        return pending.pop(0) if pending else pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", torn)
    return pending


@pytest.mark.parametrize("tear", ["pid line alone", "nonces mixed", "stop digits mixed", "stop shorter"])
async def test_a_record_read_as_it_is_written_is_not_taken(
    sock_dir: Path, waiting: LockWaits, tried: asyncio.Event, monkeypatch: pytest.MonkeyPatch, tear: str
) -> None:
    # pread is not atomic against pwrite: the pid line alone read as an older
    # holder's file, or a nonce half another's, invented a new holder; 101
    # written over 19 read as 191 (more than either) gave a new bound, kept
    # as the longest read. A shorter one (11) must not count either.
    pending = torn_reads(monkeypatch)  # none yet: the claims read the file
    async with waiting_claim(sock_dir / "s.sock", waiting, stop_s=101) as (old, new):
        whole = holder_text(os.getpid(), 101, old.nonce).encode()
        pending.append({
            "pid line alone": whole[:32],
            "nonces mixed": holder_text(os.getpid(), 101, "fedcba98" + old.nonce[8:]).encode(),
            "stop digits mixed": holder_text(os.getpid(), 191, old.nonce).encode(),
            "stop shorter": holder_text(os.getpid(), 11, old.nonce).encode(),
        }[tear])
        await next_tries(tried, new, 3)
        assert not pending
        (record,) = waiting.records  # no other holder, no new bound
        assert (record.wait_s, record.holder_stop_s) == (101 + socketlock.HOLDER_MARGIN_S, 101)
        old.release()
        lock = await asyncio.wait_for(new, 10)
    assert lock.held
    lock.release()


async def test_a_holder_taking_a_crashed_holders_file_in_the_same_pid_is_another_holder(
    sock_dir: Path, waiting: LockWaits, clock: Clock
) -> None:
    # The same lock file (st_dev, st_ino), the same pid (two containerised
    # hook servers are both pid 1): only the nonce tells B from A. Taken for
    # A, B's wait counted from A's start, under A's record.
    path = sock_dir / "s.sock"
    other: socketlock.SocketLock | None = None
    try:
        async with waiting_claim(path, waiting, stop_s=300) as (old, new):
            clock.ahead = 100
            file = os.stat(old.path)
            os.close(old._fd)  # A killed: its file stays; its release() does nothing now
            old._fd = None
            other = await claim(path, stop_s=500)
            assert (os.stat(other.path).st_ino, os.stat(other.path).st_dev) == (file.st_ino, file.st_dev)
            await until_waiting(waiting, new)
            second = waiting.records[-1]
            assert second.getMessage().startswith("socket path taken meanwhile by another instance")
            assert (second.wait_s, second.holder_pid, second.waited_s) == (
                500 + socketlock.HOLDER_MARGIN_S, os.getpid(), pytest.approx(100, abs=5))
            other.release()
            lock = await asyncio.wait_for(new, 10)
    finally:
        socketlock.release(other)
    assert lock.held
    lock.release()


async def test_a_new_holder_not_written_yet_is_no_change_until_it_writes(
    sock_dir: Path, waiting: LockWaits, clock: Clock, tried: asyncio.Event
) -> None:
    # B has made its file and taken its flock, its record not written yet:
    # the waiter keeps A's (and its bound) until B's is read, then counts
    # B's from there, once: not a change to nobody and another to B.
    path = sock_dir / "s.sock"
    fd: int | None = None
    try:
        async with waiting_claim(path, waiting, stop_s=300) as (old, new):
            clock.ahead = 100
            old.release()
            fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            await next_tries(tried, new, 2)
            assert len(waiting.records) == 1  # nothing new: A's 301 s stand
            os.pwrite(fd, holder_text(os.getpid(), None, "0123456789abcdef").encode(), 0)
            await until_waiting(waiting, new)
            clock.ahead = 100 + socketlock.LOCK_WAIT_S - 10  # B's own bound counted from 100 s: 10 s left
            await next_tries(tried, new, 2)
            second, = waiting.records[1:]
            assert second.getMessage().startswith("socket path taken meanwhile by another instance")
            assert (second.wait_s, second.waited_s) == (socketlock.LOCK_WAIT_S, pytest.approx(100, abs=5))
            os.unlink(lock_path(path))
            os.close(fd)
            fd = None
            lock = await asyncio.wait_for(new, 10)
    finally:
        if fd is not None:
            os.close(fd)
    assert lock.held
    lock.release()
