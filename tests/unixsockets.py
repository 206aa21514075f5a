"""Unix sockets in the states the socket rules tell apart (tests/*/host/)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from runtimeproxy.host import socketlock
from runtimeproxy.host.lockholder import read_holder
from runtimeproxy.host.unixsocket import SocketIdentity
from tests.loghandling import handled


def recorded(lock_file: Path) -> tuple[int | None, float | None]:
    """The pid and the stop a socket path's lock file records (its nonce aside)."""
    fd = os.open(lock_file, os.O_RDONLY)
    try:
        holder = read_holder(fd)
    finally:
        os.close(fd)
    return holder.pid, holder.stop_s


def stale_socket(path: Path) -> SocketIdentity:
    """A socket file nobody listens on (its server went away)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
    return SocketIdentity.of(path)


@contextlib.contextmanager
def full_backlog(path: Path) -> Iterator[socket.socket]:
    """A live listener that never accepts, its backlog full: a non-blocking
    connect gets EAGAIN, a blocking one waits for ever."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    queued: list[socket.socket] = []
    try:
        for _ in range(64):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            queued.append(client)
            try:
                client.connect(str(path))
            except BlockingIOError:
                break
        else:
            raise AssertionError("the backlog never filled")
        yield listener
    finally:
        for client in queued:
            client.close()
        listener.close()


PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Takes the lock of the path given (host/socketlock.py), recording the stop
# bound given after it if any, and leaves a stale socket there, as an instance
# stopping (or stuck starting) does; says "held" and holds both until its
# stdin closes.
STALE_HOLDER = """\
import asyncio, socket, sys
from pathlib import Path
from runtimeproxy.host.socketlock import claim
path = Path(sys.argv[1])
lock = asyncio.run(claim(path, stop_s=float(sys.argv[2]) if len(sys.argv) > 2 else None))
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.bind(str(path))
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.asynccontextmanager
async def stale_lock_holder(path: Path, stop_s: float | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    """Another process holding ``path``'s lock without serving it, its stop
    recorded as ``stop_s``: a new instance on the path waits for it (up to
    socketlock.LOCK_WAIT_S, or as long as ``stop_s`` says)."""
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STALE_HOLDER, str(path), *([] if stop_s is None else [str(stop_s)]), cwd=PROJECT_ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)  # fmt: skip
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 20) == b"held\n"
        yield holder
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


# socketlock's lines as it begins to wait, for a holder that took the lock
# meanwhile, and with a new bound (the holder's record read).
WAIT_MESSAGES = (
    "socket path held by another instance",
    "socket path taken meanwhile by another instance",
    "the socket path's holder recorded how long its stop may take",
)


class LockWaits(asyncio.Event):
    """Set once a claim logs that it waits for the path's holder; ``records``: those lines
    (``clear`` it to await the next)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []


async def until_waiting(waits: LockWaits, starting: asyncio.Future[Any], timeout: float = 10.0) -> None:
    """Until a claim logs its next wait (``waits`` is cleared then, for the
    one after); fails should ``starting``, what claims, end first, or
    neither come within ``timeout`` s."""
    logged = asyncio.ensure_future(waits.wait())
    try:
        await asyncio.wait([logged, starting], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        logged.cancel()
        await asyncio.gather(logged, return_exceptions=True)
    assert not starting.done(), starting.exception() if not starting.cancelled() else "cancelled"
    assert waits.is_set(), f"no wait logged within {timeout} s"
    waits.clear()


async def next_tries(tried: asyncio.Event, claiming: asyncio.Future[Any], count: int) -> None:
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


@contextlib.asynccontextmanager
async def waiting_claim(
    path: Path, waits: LockWaits, stop_s: float | None = None, wait_s: float = socketlock.LOCK_WAIT_S
) -> AsyncIterator[tuple[socketlock.SocketLock, asyncio.Future[socketlock.SocketLock]]]:
    """A holder in this process (its stop recorded as ``stop_s``) leaving a
    stale socket on ``path``, and a claim (its own bound ``wait_s``) waiting
    for it: both, once the claim logs its wait. After: the holder let go, the
    claim cancelled should it still wait."""
    old = await socketlock.claim(path, stop_s=stop_s)
    stale_socket(path)
    new = asyncio.ensure_future(socketlock.claim(path, wait_s=wait_s))
    try:
        await until_waiting(waits, new)
        yield old, new
    finally:
        old.release()
        new.cancel()
        await asyncio.gather(new, return_exceptions=True)


@contextlib.contextmanager
def lock_waits() -> Iterator[LockWaits]:
    """socketlock's "waiting" log lines, in this process, as they come."""
    waits = LockWaits()

    def emit(record: logging.LogRecord) -> None:
        if record.getMessage().startswith(WAIT_MESSAGES):
            waits.records.append(record)
            waits.set()

    with handled(socketlock.__name__, logging.INFO, emit):
        yield waits


class Clock:
    """The event loop's clock, moved on at will: a wait of minutes in no
    time (timers already set then are due at once: only the waiter's poll)."""

    def __init__(self) -> None:
        self.ahead = 0.0


def socket_mode_fails(monkeypatch: Any, path: str | Path) -> None:
    """os.chmod refusing (EPERM) ``path`` only, as a server's start sets its
    socket's mode: the start fails once its listener is bound (``monkeypatch``:
    pytest's, undone with it)."""
    real_chmod = os.chmod

    def chmod(where: Any, mode: int, **kwargs: Any) -> None:
        if Path(where) == Path(path):
            raise PermissionError(1, "Operation not permitted")
        real_chmod(where, mode, **kwargs)

    monkeypatch.setattr(os, "chmod", chmod)


@contextlib.contextmanager
def another_instance_serving(path: Path, lock: socketlock.SocketLock) -> Iterator[None]:
    """``lock`` (claimed on ``path``) held and a live listener at ``path``,
    as another instance serving it: a claim is refused at once. Both let go
    at the end."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(8)
        try:
            yield
        finally:
            os.unlink(path)
            socketlock.release(lock)
