"""One instance at a time on a unix socket path: a lock beside the socket.

The connect probe of :func:`unixsocket.prepare` cannot see another instance
that has not bound yet: two starting at once both find the path free, and on
grpc (whose bind first unlinks what is at the path) the later bind replaces
the earlier's socket, which then serves a name nobody can reach. So every
instance that binds a socket path (the proxy on both data paths, the SDK's
hook servers, balloons' status socket) first takes an exclusive flock on
``DIR/.NAME.lock``, and holds it through its stale check, its bind and its
whole life, until its server has stopped (grpc's stop unlinks the path it
bound) and its socket is removed. The socket keeps its own name: ss and
/proc/net/unix show the bound name, which must be the path kubelet dials.

A second instance meets the lock held. Anything but a socket at the path
(which no holder's stop removes) is refused at once, as
:func:`unixsocket.prepare` refuses it. Else it probes the socket: a holder
that serves it (the socket answers) refuses it at once, naming the holder's
pid (written into the file). A holder that does not serve it is starting (it
binds within moments: then refused as above) or stopping (its stop lets go
of the lock): the second waits for it, up to ``wait_s``: ``LOCK_WAIT_S``,
more than the units' TimeoutStopSec, past which systemd kills a stop and
with it the lock; the proxy passes more when its grace period makes a stop
longer (cripath/server.py). A holder that may stop for longer still (a
longer grace than the waiter's) says so: it records ``stop_s``, how long its
stop may take, beside its pid (lockholder.py), and the waiter waits that
long (its record as last read) and ``HOLDER_MARGIN_S`` more when
it is longer than its own ``wait_s``, at most ``MAX_WAIT_S`` (a garbled
number must not hang a start). A file without it (an older holder's, or one
not written yet) leaves ``wait_s``. The holder may change during the wait:
it lets go and another instance takes the lock before the waiter's next try
(a record of another nonce, which each holder draws as it takes the lock: an
older holder's record, without one, by its file and pid; a record not
written yet, or read as it is written, is no change). The new holder's stop is waited for from then, by
its own record, as the first's was; the whole wait across holders ends after
``MAX_WAIT_S`` (``wait_s`` when longer), so that a chain of instances each
starting as the last stops cannot hang a start for ever. A holder whose stop
is given a longer grace than it claimed with records that
(``SocketLock.record_longer_stop``). Under systemd the waiter sends
EXTEND_TIMEOUT_USEC, what is left of its wait (at most MAX_WAIT_S) and
EXTEND_MARGIN_S, as it begins to wait for a holder or for a new bound:
systemd moves the start's deadline to that long after the message when
that is later, and keeps the latest deadline any such message set (never
earlier than its TimeoutStartSec's). It says whom it waits for (STATUS=),
cleared however the wait ends. Waiting, not refusing: a hook server's new
instance started while the old one stops (a DaemonSet's rolling update with
a surge) then serves as soon as it can, instead of failing into a restart
backoff. Under systemd's Restart= the old process has exited before the new
one starts, so the lock is free.

Stopping is told from serving by the probe alone, so a holder whose socket
still answers in its stop refuses a second instance as if it served: the
proxy on the grpc data path while its stop holds new calls (at most 1 s,
HOLD_LIMIT_S, before grpc's shutdown closes the listener), ``hook run``
while it answers for ``--drain`` after removing its registration, and any
SDK hook server while its ``stop`` drains: 0.5 s by default under
``hooks.sdk.run`` once a hook file the run wrote is removed, and for any
server whose drain is set (``HookServer(drain=...)``, ``stop(drain=...)``),
under ``run`` or not. The frames data path closes its listener as its stop
begins.

The kernel drops a flock with its holder's last descriptor, however the
holder dies: no lock outlives its process. The holder removes the file as it
lets go; a crashed holder's file stays, harmless (the next taker locks it,
then removes it in turn). Because the file may be removed, a taker checks
after its flock that the path still names the file it locked, else locks
the new one (lockholder.try_lock). A socket directory removed while a claim
waits is made again, and the lock taken in it, as :func:`unixsocket.prepare`
would make it (the bind needs it too). Not guarded: a holder whose directory
was removed (an operator's ``rm -rf`` of it during a stop) still holds its
lock file, nameless, so the next instance takes the lock at once, and that
holder's stop can still unlink the new socket by name. A lock file that
cannot be used (a directory this process may not write, a file of another
user it may not open, a symlink or anything but a regular file at its name)
leaves the probe alone guarding the path, as before this lock, with a
warning. Programs that take no lock are still met by the probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import sdnotify, unixsocket
from .lockholder import Held, Holder, Taken, Unusable, same_file, try_lock, write_holder

log = logging.getLogger(__name__)

LOCK_WAIT_S = 30.0  # more than TimeoutStopSec of runtime-proxy.service (20 s) and the hook unit (10 s)
HOLDER_MARGIN_S = 1.0  # past the holder's recorded stop: its lock file's removal and close
MAX_WAIT_S = 600.0  # the most a holder's record makes anyone wait, and a whole wait across holders
EXTEND_MARGIN_S = 30.0  # systemd's start timeout, past the wait: the start goes on after it
POLL_S = 0.05  # flock has no timed or async wait; the holder's socket is probed between tries anyway


def lock_path(socket_path: Path) -> Path:
    """The lock file of ``socket_path``: hidden, beside it, named after it."""
    return socket_path.parent / f".{socket_path.name}.lock"


class SocketInUse(unixsocket.UnixSocketError):
    """Another instance holds the socket path's lock."""

    def __init__(self, message: str, holder: int | None) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass
class SocketLock:
    """The lock of one socket path; ``held`` is False when the lock file could
    not be used (the path is then guarded by the probe alone)."""

    path: Path  # the lock file
    _fd: int | None = field(default=None, repr=False)
    stop_s: float | None = None  # the stop recorded in it, for an instance that waits for this one
    nonce: str = ""  # this holder's, in its record (lockholder.py)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def record_longer_stop(self, stop_s: float) -> None:
        """Record that this holder's stop may take ``stop_s``, if longer than
        the stop recorded (a stop passed a longer grace than the one it
        claimed with calls it as it begins): an instance waiting for it reads
        it at its next try."""
        if self._fd is None or (self.stop_s is not None and stop_s <= self.stop_s):
            return
        with contextlib.suppress(OSError):  # gone: the lock is as good, the record is for the waiter's log
            write_holder(self._fd, os.fstat(self._fd), stop_s, self.nonce)
        self.stop_s = stop_s

    def release(self) -> None:
        """Remove the lock file and let go; idempotent. Call it only once the
        socket is stopped and removed: a waiting instance binds right after."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):  # gone, or a directory we may no longer write: harmless
            if same_file(self.path, os.fstat(fd)):
                self.path.unlink()
        os.close(fd)


def release(lock: SocketLock | None) -> None:
    """Let go of an owner's ``lock``, if it took one; idempotent, so the owner
    calls it in its stop's ``finally`` whatever state the stop ended in."""
    if lock is not None:
        lock.release()


async def release_once_stopped(
    stop: Callable[[], Awaitable[object]] | None, lock: SocketLock | None, path: Path,
    identity: unixsocket.SocketIdentity | None, last_step: Callable[[], Awaitable[object]] | None = None,
    kept: Callable[[], object] | None = None,
) -> None:
    """The end of an owner's stop, however its stop went (call it in the
    stop's ``finally``, once the owner's own stop returned or raised), or
    of a start that failed once it held the lock (``stop`` None: it undid
    its listener itself, nothing to stop): ``stop()`` once more (grpc.aio's ``stop(None)`` returns at once after a
    stop that finished; on one cut short it cancels the calls left, whose
    caller was cancelled anyway), then ``last_step()`` (the owner's state
    writes, under the lock), then the owner's socket removed and the
    lock let go. A stop cut
    short before grpc's own left the server RUNNING, and its shutdown, when
    it comes (a second stop, the server's ``__del__``), unlinks the path it
    bound by name: once the lock went, a newer instance's socket. If this
    stop fails too, socket and lock stay (the kernel drops the lock as the
    process exits), logged. A cancel during ``last_step`` (the server is
    stopped) cuts it, and socket and lock go all the same. A ``last_step``
    that returns an asyncio Future still pending (a hook's state write in
    a thread, which nothing can cut) keeps the lock until that is done: the
    write must not land after the next instance, waiting on the lock, has
    read the state. That Future cancelled (a thread's cannot be: someone
    cancelled a wrapper of it) tells nothing of the write: the lock stays
    until this process exits. ``kept()``, asked when a cancel cut
    ``last_step``, names a Future it had started, which keeps the lock as
    one returned does."""
    try:
        if stop is not None:
            await stop()
    except BaseException as exc:
        log.error("server not stopped; its socket path stays locked until this process exits",
                  extra={"path": str(path), "lock": str(lock.path) if lock else None, "error": repr(exc)})
        if not isinstance(exc, Exception):  # a cancel goes on
            raise
        return
    write: object = None
    try:
        if last_step is not None:
            write = await last_step()
    finally:  # a cancel of the stop too: the server stopped, the step is cut, as past its own bound
        unixsocket.remove_own(path, identity)
        if write is None and kept is not None:  # (cut by a cancel: a write it had started may run yet)
            write = kept()
        pending = write if isinstance(write, asyncio.Future) and not write.done() else None
        if pending is None:
            release(lock)
        else:
            pending.add_done_callback(lambda done: _release_unless_cancelled(done, lock, path))


def _release_unless_cancelled(kept: asyncio.Future[object], lock: SocketLock | None, path: Path) -> None:
    if kept.cancelled():  # no word of the write: it may land yet (the kernel drops the lock as we exit)
        log.warning("the write kept waiting for was cancelled, not ended: its socket path stays locked until "
                    "this process exits", extra={"path": str(path), "lock": str(lock.path) if lock else None})
        return
    if (exc := kept.exception()) is not None:  # (the owner that handed it logs it: hooks.releasestep)
        log.debug("the write kept waiting for failed; the lock goes", exc_info=exc, extra={"path": str(path)})
    release(lock)


@dataclass(frozen=True)
class WaitBound:
    """How long a claim waits for a holder that does not serve, and why."""

    seconds: float
    source: str  # "own", "holder", "holder, capped"


def wait_bound(wait_s: float, holder: Holder) -> WaitBound:
    """``wait_s``, or the holder's recorded stop and a margin when longer
    (at most ``MAX_WAIT_S``, which never shortens ``wait_s``)."""
    if holder.stop_s is None:
        return WaitBound(wait_s, "own")
    theirs = holder.stop_s + HOLDER_MARGIN_S
    if theirs <= wait_s:
        return WaitBound(wait_s, "own")
    if theirs > MAX_WAIT_S:
        return WaitBound(wait_s, "own") if wait_s >= MAX_WAIT_S else WaitBound(MAX_WAIT_S, "holder, capped")
    return WaitBound(theirs, "holder")


async def claim(path: Path, wait_s: float = LOCK_WAIT_S, stop_s: float | None = None) -> SocketLock:
    """Lock ``path`` for this instance, then :func:`unixsocket.prepare` it:
    its length checked and its directory made before the lock, its stale
    socket removed after it (what is there may change while it waits).

    ``stop_s``: how long this instance's stop may take once it no longer
    serves, recorded for an instance that waits for it (None: not known).
    Raises :class:`SocketInUse` when another instance holds it, and what
    ``prepare`` raises; the lock is let go on any failure. The caller binds,
    and releases the lock after its server's stop and ``remove_own``."""
    unixsocket.check_path_length(path)
    unixsocket.make_directory(path)  # the lock file goes in it
    lock = await _lock(path, wait_s, stop_s)
    try:
        unixsocket.remove_stale(path)
    except BaseException:
        lock.release()
        raise
    return lock


@dataclass
class _Waited:
    """The holder a claim waits for, replaced whole when another takes the lock."""

    since: float  # when the wait for it began: its bound counts from there
    identity: object = None  # Held.identity, once a record of it is read
    holder: Holder = Holder(None, None)  # its record, the last read
    logged: WaitBound | None = None  # the bound logged for it


async def _lock(path: Path, wait_s: float, stop_s: float | None) -> SocketLock:
    lockfile = lock_path(path)
    loop = asyncio.get_running_loop()
    started = 0.0  # when the wait began, for its ceiling across holders
    waited: _Waited | None = None
    told = False  # whether systemd was told of the wait (STATUS=)
    try:
        while True:
            got = try_lock(lockfile, stop_s)
            if isinstance(got, Taken):
                if waited is not None:
                    log.info("socket path free again; taking it",
                             extra={"path": str(path), "lock": str(lockfile)})
                return SocketLock(lockfile, got.fd, stop_s, got.nonce)
            if isinstance(got, Unusable):
                log.warning(
                    "cannot lock the socket path; binding without the lock: another instance starting at this "
                    "moment could take the path over (make the lock file's directory writable, or remove what "
                    "is there)",
                    extra={"path": str(path), "lock": str(lockfile), "error": got.reason},
                )
                return SocketLock(lockfile)
            # What no holder's stop removes is refused now, as prepare would: a
            # file the probe finds stale (ECONNREFUSED) or a symlink it follows.
            unixsocket.refuse_non_socket(path)
            if not unixsocket.is_stale(path):
                raise SocketInUse(
                    f"{path} is in use by another process ({_who(got.holder.pid)}, holding {lockfile}); "
                    "refusing to take it over", got.holder.pid)
            now = loop.time()
            if waited is None:
                started, waited = now, _Waited(now)
            waited = _read(waited, got, now)
            _wait_on(path, lockfile, wait_s, started, waited, now)
            told = True  # its first call that returns has told systemd
            await asyncio.sleep(POLL_S)
    finally:
        if told:
            _notify_systemd("STATUS=")  # however the wait ended: what follows says its own, if anything


def _read(waited: _Waited, got: Held, now: float) -> _Waited:
    """The holder after this try's read of the record. Another holder: the
    first let go and another instance took the lock before this try (its
    record says another nonce): its stop is waited for from now, as the
    first's was, under the ceiling. A record not read (not written yet, or
    read as it is written) is no change: the holder so far stands."""
    if got.identity is None:
        return waited
    if waited.identity not in (None, got.identity):
        waited = _Waited(now)
    # Read at each try: the holder writes it just after its flock, and again
    # when its stop is to take longer (record_longer_stop).
    waited.identity, waited.holder = got.identity, got.holder
    return waited


def _wait_on(path: Path, lockfile: Path, wait_s: float, started: float, waited: _Waited, now: float) -> None:
    """Raise :class:`SocketInUse` when the wait is over, else log a new
    bound, and tell systemd."""
    pid = waited.holder.pid
    bound = wait_bound(wait_s, waited.holder)
    if now - waited.since >= bound.seconds:
        raise SocketInUse(
            f"{path} is held by another process ({_who(pid)}, holding {lockfile}) that has neither served "
            f"it nor let it go for {bound.seconds:g} s; refusing to take it over: stop that process first", pid)
    # A chain of holders, each let go of as the next takes the lock, ends too.
    ceiling = max(wait_s, MAX_WAIT_S)
    if now - started >= ceiling:
        raise SocketInUse(
            f"{path} has been held by other processes one after another ({_who(pid)} last, holding "
            f"{lockfile}), none serving it, for {ceiling:g} s; refusing to take it over: stop them first", pid)
    if waited.logged == bound:
        return
    if waited.logged is None and waited.since == started:
        message = "socket path held by another instance that does not serve it (starting or stopping); waiting"
    elif waited.logged is None:
        message = ("socket path taken meanwhile by another instance that does not serve it "
                   "(starting or stopping); waiting for that one")
    else:
        message = "the socket path's holder recorded how long its stop may take; waiting with the new bound"
    log.info(message, extra={
        "path": str(path), "lock": str(lockfile), "holder_pid": pid, "wait_s": bound.seconds,
        "wait_from": bound.source, "holder_stop_s": waited.holder.stop_s, "own_wait_s": wait_s,
        "waited_s": round(now - started, 3)})
    waited.logged = bound
    # Under systemd a start that waits must not be killed for its
    # TimeoutStartSec (the hook unit's is systemd's default, 90 s): the
    # start's timeout is extended to what is left of the wait and a margin
    # for what the start does after it (what is left at most MAX_WAIT_S: a
    # waiter's own bound may be any number). A stop signal cancels the wait
    # at its next await: a try run between the two may still send this,
    # which then extends the stop's timeout; not guarded (the signal is not
    # seen here).
    left = min(waited.since + bound.seconds, started + ceiling, now + MAX_WAIT_S) - now
    _notify_systemd(f"EXTEND_TIMEOUT_USEC={int((left + EXTEND_MARGIN_S) * 1e6)}\n"
                    f"STATUS=waiting for {_who(pid)} to let go of {path}")


def _who(pid: int | None) -> str:
    return f"pid {pid}" if pid is not None else "pid unknown"


def _notify_systemd(state: str) -> None:
    """sd_notify, for a ``Type=notify`` unit's start; nothing outside systemd."""
    sdnotify.notify(state)
