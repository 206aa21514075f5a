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
from runtimeproxy.host.lockholder import holder_text
from runtimeproxy.host.socketlock import SocketInUse, claim, lock_path
from tests.prerequisites import fail_or_skip
from tests.unixsockets import LockWaits, recorded, waiting_claim

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
