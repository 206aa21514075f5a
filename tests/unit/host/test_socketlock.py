"""The lock beside a socket path (host/socketlock.py): one instance at a time.

flock belongs to an open file description, so a second claim in this process
conflicts with the first as another process's would; a real second process
holds it in the tests that need its death or its pid.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runtimeproxy.host import lockholder, socketlock, unixsocket
from runtimeproxy.host.lockholder import Holder, holder_text
from runtimeproxy.host.socketlock import SocketInUse, claim, lock_path
from tests.prerequisites import fail_or_skip
from tests.unixsockets import LockWaits, recorded, stale_lock_holder, stale_socket, until_waiting, waiting_claim

PROJECT_ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534

# Claims the path given, says so, and holds it until its stdin closes.
HOLDER = """\
import asyncio, sys
from pathlib import Path
from runtimeproxy.host.socketlock import claim
lock = asyncio.run(claim(Path(sys.argv[1])))
print("held", flush=True)
sys.stdin.read()
"""


def read_line(process: subprocess.Popen[str], timeout: float = 10.0) -> str:
    """The child's next line, failing after ``timeout`` s rather than waiting for ever."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], timeout)
    assert readable, f"no line from the child within {timeout} s"
    return process.stdout.readline()


def listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


async def test_the_lock_is_beside_the_socket_names_its_holder_and_goes_with_it(sock_dir: Path) -> None:
    path = sock_dir / "a" / "s.sock"
    lock = await claim(path)
    assert lock.held and lock.path == sock_dir / "a" / ".s.sock.lock" == lock_path(path)
    st = os.lstat(lock.path)
    assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_ISREG(st.st_mode)
    assert lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)
    lock.release()
    assert not lock.path.exists()
    lock.release()  # idempotent
    assert sorted(p.name for p in path.parent.iterdir()) == []


async def test_a_second_claim_on_a_served_path_is_refused_at_once_naming_the_holder(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    lock = await claim(path)
    try:
        with listening(path):
            identity = unixsocket.SocketIdentity.of(path)
            with pytest.raises(SocketInUse, match=f"^{path} is in use by another process \\(pid {os.getpid()}, "
                                                  f"holding {lock.path}\\); refusing to take it over$") as refused:
                await claim(path, wait_s=3600)  # serving: no wait
            assert refused.value.holder == os.getpid()
            assert unixsocket.SocketIdentity.of(path) == identity
            assert lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)  # the refused claim left it as it was
    finally:
        lock.release()


async def test_a_claim_waits_for_a_holder_that_does_not_serve_then_takes_the_path(
    sock_dir: Path, waiting: LockWaits
) -> None:
    path = sock_dir / "s.sock"
    # The old instance stopped serving (a stale socket); its stop is not over.
    async with waiting_claim(path, waiting) as (old, new):
        assert not new.done() and path.exists()
        old.release()
        lock = await new
    try:
        assert lock.held and not path.exists()  # the stale socket went through the rules as usual
        assert lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)
    finally:
        lock.release()


async def test_a_holder_that_neither_serves_nor_lets_go_is_refused_after_the_wait(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    lock = await claim(path)
    try:
        with pytest.raises(SocketInUse, match=f"pid {os.getpid()}.* neither served it nor let it go for 0 s"):
            await claim(path, wait_s=0)
    finally:
        lock.release()


@pytest.mark.parametrize(("kind", "refusal"), [
    ("file", "exists and is not a unix socket"),  # the probe finds it stale (ECONNREFUSED)
    ("symlink", "is a symbolic link, not a unix socket"),  # the probe follows it to a live socket
], ids=["file", "symlink"])  # fmt: skip
async def test_a_non_socket_at_a_held_path_is_refused_at_once_not_waited_on(
    sock_dir: Path, kind: str, refusal: str
) -> None:
    path = sock_dir / "s.sock"
    lock = await claim(path)
    try:
        with listening(sock_dir / "live.sock"):
            if kind == "file":
                path.write_text("precious")
            else:
                path.symlink_to(sock_dir / "live.sock")
            with pytest.raises(unixsocket.UnusablePath, match=f"^{path} {refusal}; refusing to replace it$"):
                await claim(path, wait_s=0)  # not "neither served it nor let it go", after the wait
    finally:
        lock.release()
    assert os.path.lexists(path)


async def test_a_failed_prepare_lets_the_lock_go(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    path.write_text("precious")
    with pytest.raises(unixsocket.UnusablePath, match="not a unix socket"):
        await claim(path)
    assert not lock_path(path).exists()
    assert path.read_text() == "precious"


def test_a_holder_in_another_process_is_named_and_its_death_frees_the_path(sock_dir: Path) -> None:
    path = sock_dir / "s.sock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=PROJECT_ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(holder) == "held\n"
        with pytest.raises(SocketInUse, match=f"pid {holder.pid}") as refused:
            asyncio.run(claim(path, wait_s=0))
        assert refused.value.holder == holder.pid
    finally:
        holder.kill()  # no release: the kernel drops the lock with the process
        holder.wait()
    assert recorded(lock_path(path)) == (holder.pid, None)  # its file stays, naming it
    lock = asyncio.run(claim(path, wait_s=0))  # and blocks nothing
    try:
        assert lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)
    finally:
        lock.release()
    assert not lock_path(path).exists()


async def test_a_lock_file_removed_by_its_holder_meanwhile_is_not_the_one_held(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The old holder lets go (removing the file) between this claim's open and
    # its flock: the flock it gets is on a file nobody else will open.
    path = sock_dir / "s.sock"
    stale_lock = await claim(path)
    flock = lockholder.fcntl.flock

    def released_meanwhile(fd: int, op: int) -> None:
        if stale_lock.held:
            stale_lock.release()
        flock(fd, op)

    monkeypatch.setattr(lockholder.fcntl, "flock", released_meanwhile)
    lock = await claim(path, wait_s=0)
    monkeypatch.undo()
    try:
        assert lock.held
        assert lock._fd is not None
        held, there = os.fstat(lock._fd), os.lstat(lock.path)
        assert (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
        with pytest.raises(SocketInUse):  # a third claim meets this lock
            await claim(path, wait_s=0)
    finally:
        lock.release()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
async def test_a_lock_name_taken_by_something_else_leaves_the_probe_alone_with_a_warning(
    sock_dir: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    path = sock_dir / "s.sock"
    name = lock_path(path)
    target = sock_dir / "precious"
    target.write_text("precious")
    {"symlink": lambda: name.symlink_to(target), "fifo": lambda: os.mkfifo(name),
     "directory": lambda: name.mkdir()}[kind]()
    with caplog.at_level(logging.WARNING, logger=socketlock.__name__):
        lock = await claim(path)
    assert not lock.held
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith("cannot lock the socket path; binding without the lock")
    assert warning.path == str(path) and warning.lock == str(name)
    lock.release()
    assert target.read_text() == "precious"
    assert os.path.lexists(name)  # not ours: left as it was


def test_a_lock_file_this_user_may_not_open_leaves_the_probe_alone(sock_dir: Path) -> None:
    if os.geteuid() != 0:
        fail_or_skip("needs root, to leave a root-owned lock file for an unprivileged instance")
    os.chmod(sock_dir, 0o777)  # the unprivileged instance may bind there, as in its own directory
    path = sock_dir / "s.sock"
    name = lock_path(path)
    name.write_text("1\n")
    os.chmod(name, 0o600)  # a root instance's, left by a crash
    child = """\
import asyncio, logging, os, sys
from pathlib import Path
from runtimeproxy.host.socketlock import claim
logging.basicConfig(level=logging.WARNING, format="%(message)s")
os.setgroups([]); os.setgid(65534); os.setuid(65534)
lock = asyncio.run(claim(Path(sys.argv[1]), wait_s=0))
print("held" if lock.held else "unlocked", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", child, str(path)], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "unlocked\n"
    assert "cannot lock the socket path; binding without the lock" in done.stderr
    assert name.read_text() == "1\n"


# -- the holder's recorded stop: a waiter waits as long as the holder's stop may take


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


async def test_a_socket_directory_removed_during_the_wait_is_made_again_and_locked(
    sock_dir: Path, waiting: LockWaits
) -> None:
    path = sock_dir / "d" / "s.sock"
    async with waiting_claim(path, waiting) as (old, new):
        old.release()
        path.unlink()
        path.parent.rmdir()  # an operator's clean-up, say
        lock = await asyncio.wait_for(new, 10)
    try:
        assert lock.held and path.parent.is_dir()  # not "binding without the lock", nor a bind without its directory
        assert lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)
    finally:
        lock.release()


async def test_a_socket_directory_removed_while_its_holder_lives_is_made_again_and_locked_at_once(
    sock_dir: Path, waiting: LockWaits
) -> None:
    # Not guarded (socketlock's docstring): the holder still holds its lock
    # file, nameless now, and its stop can still unlink the new socket.
    path = sock_dir / "d" / "s.sock"
    async with waiting_claim(path, waiting, stop_s=300) as (_, new):
        shutil.rmtree(path.parent)  # an operator's clean-up, say
        lock = await asyncio.wait_for(new, 10)
    try:
        assert lock.held and path.parent.is_dir()
        assert lock.path.read_text() == holder_text(os.getpid(), None, lock.nonce)
    finally:
        lock.release()
