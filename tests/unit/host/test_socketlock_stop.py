"""The stop a socket path's holder records beside its pid (host/socketlock.py):
a waiting claim waits as long as that stop may take, not only its own bound."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from runtimeproxy.host import socketlock, unixsocket
from runtimeproxy.host.lockholder import Holder, holder_text
from runtimeproxy.host.socketlock import SocketInUse, claim
from tests.unixsockets import LockWaits, stale_lock_holder, stale_socket, until_waiting, waiting_claim


async def test_a_holder_records_how_long_its_stop_may_take_beside_its_pid(sock_dir: Path) -> None:
    lock = await claim(sock_dir / "s.sock", stop_s=47.5)
    try:
        assert lock.path.read_text() == holder_text(os.getpid(), 47.5, lock.nonce)
    finally:
        lock.release()


async def test_a_holder_records_a_longer_stop_over_its_first(sock_dir: Path) -> None:
    lock = await claim(sock_dir / "s.sock", stop_s=2)
    try:
        lock.record_longer_stop(1)  # shorter: left as it is
        assert lock.path.read_text() == holder_text(os.getpid(), 2, lock.nonce)
        lock.record_longer_stop(51)
        assert lock.path.read_text() == holder_text(os.getpid(), 51, lock.nonce)
        assert lock.stop_s == 51
    finally:
        lock.release()


async def test_a_longer_stop_is_recorded_in_a_lock_file_whose_directory_was_removed(sock_dir: Path) -> None:
    # Nameless, the file has no other name a write could reach (a hard link's
    # is refused); its record is still read through a descriptor (/proc/PID/fd).
    path = sock_dir / "d" / "s.sock"
    lock = await claim(path, stop_s=2)
    try:
        shutil.rmtree(path.parent)
        lock.record_longer_stop(51)
        assert lock._fd is not None
        assert os.pread(lock._fd, 128, 0).decode() == holder_text(os.getpid(), 51, lock.nonce)
    finally:
        lock.release()


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.Event]:
    """Set, in turn, as a waiting claim probes the held path: the first, the second..."""
    events = [asyncio.Event() for _ in range(3)]
    count = 0
    is_stale = unixsocket.is_stale

    def counted(path: Path, timeout: float = unixsocket.PROBE_TIMEOUT) -> bool:
        nonlocal count
        stale = is_stale(path, timeout)
        if count < len(events):
            events[count].set()
        count += 1
        return stale

    monkeypatch.setattr(unixsocket, "is_stale", counted)
    return events


async def test_a_claim_waits_past_its_own_bound_while_the_holder_recorded_a_longer_stop(
    sock_dir: Path, waiting: LockWaits, probes: list[asyncio.Event]
) -> None:
    # A proxy with a longer grace than the waiting one's: without its record
    # the wait ended at the waiter's own bound, the holder still stopping.
    path = sock_dir / "s.sock"
    # The holder stopping (not serving, its lock held); the claim's own bound: none.
    async with waiting_claim(path, waiting, stop_s=300, wait_s=0) as (old, new):
        probed = asyncio.ensure_future(probes[-1].wait())
        try:
            await asyncio.wait([new, probed], timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert not new.done(), new.exception()
            assert probed.done(), "not polled three times"  # past its own bound of 0 s
        finally:
            probed.cancel()
            await asyncio.gather(probed, return_exceptions=True)
        (record,) = waiting.records
        assert (record.wait_s, record.wait_from, record.holder_stop_s, record.own_wait_s) == (
            300 + socketlock.HOLDER_MARGIN_S, "holder", 300, 0)
        assert record.holder_pid == os.getpid()
        old.release()
        lock = await asyncio.wait_for(new, 10)
    try:
        assert lock.held and not path.exists()
        assert lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)  # the new holder's own record
    finally:
        lock.release()


@pytest.mark.parametrize("content", ["{pid}\n", "{pid}\nstop_s=soon\n", "{pid}\nstop_s=-5\n", "{pid}\nstop_s=nan\n",
                                     "{pid}\nstop_s=inf\n", "{pid}\nstop_s=\n", "{pid}"])
async def test_a_lock_file_without_a_readable_stop_leaves_the_waiters_own_bound(sock_dir: Path, content: str) -> None:
    # An older holder's (its pid alone), or garbled: the holder is still named.
    path = sock_dir / "s.sock"
    lock = await claim(path, stop_s=3600)
    try:
        lock.path.write_text(content.format(pid=os.getpid()))
        stale_socket(path)
        with pytest.raises(SocketInUse, match=f"pid {os.getpid()}, .* neither served it nor let it go for 0 s;") as refused:
            await asyncio.wait_for(claim(path, wait_s=0), 10)  # read as 3600 s, a timeout
        assert refused.value.holder == os.getpid()
    finally:
        lock.release()


@pytest.mark.parametrize("recorded", ["1e12", "1e300"])
async def test_a_holders_garbage_stop_is_capped(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, waiting: asyncio.Event, recorded: str
) -> None:
    monkeypatch.setattr(socketlock, "MAX_WAIT_S", 0.2)  # short, to see the wait end
    path = sock_dir / "s.sock"
    lock = await claim(path)
    try:
        lock.path.write_text(f"{os.getpid()}\nstop_s={recorded}\n")
        stale_socket(path)
        with pytest.raises(SocketInUse, match="neither served it nor let it go for 0.2 s;"):
            await asyncio.wait_for(claim(path, wait_s=0), 10)  # not capped, a timeout
        (record,) = waiting.records
        assert (record.wait_s, record.wait_from) == (0.2, "holder, capped")
    finally:
        lock.release()


@pytest.mark.parametrize(("wait_s", "stop_s", "bound"), [
    (30, None, socketlock.WaitBound(30, "own")),
    (30, 10, socketlock.WaitBound(30, "own")),  # shorter than the waiter's own
    (30, 29, socketlock.WaitBound(30, "own")),  # with the margin, as long
    (30, 40, socketlock.WaitBound(41, "holder")),
    (30, 1e9, socketlock.WaitBound(socketlock.MAX_WAIT_S, "holder, capped")),
    (900, 1e9, socketlock.WaitBound(900, "own")),  # the cap never shortens the waiter's own, which it is then
])  # fmt: skip
def test_the_wait_bound_is_the_longer_of_the_waiters_and_the_holders_stop(
    wait_s: float, stop_s: float | None, bound: socketlock.WaitBound
) -> None:
    assert socketlock.wait_bound(wait_s, Holder(os.getpid(), stop_s)) == bound


async def test_a_holder_in_another_process_with_a_longer_stop_is_waited_for_until_it_lets_go(
    sock_dir: Path, waiting: LockWaits
) -> None:
    path = sock_dir / "s.sock"
    async with stale_lock_holder(path, 300) as holder:
        new = asyncio.ensure_future(claim(path, wait_s=0))
        try:
            await until_waiting(waiting, new)
            assert holder.stdin is not None
            holder.stdin.close()  # its stop is over: it exits, the kernel drops its lock
            lock = await asyncio.wait_for(new, 10)
        finally:
            new.cancel()
            await asyncio.gather(new, return_exceptions=True)
    try:
        (record,) = waiting.records
        assert (record.holder_pid, record.wait_s, record.wait_from) == (
            holder.pid, 300 + socketlock.HOLDER_MARGIN_S, "holder")
        assert lock.held and lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)
    finally:
        lock.release()
