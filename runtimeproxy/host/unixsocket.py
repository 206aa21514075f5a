"""The unix-socket rules shared by the proxy and the hook-server SDK.

Before listening, :func:`prepare` makes room for a socket without ever taking
one from someone else: a path that is not a socket is refused, a socket
someone answers on is refused, a socket nobody listens on (ECONNREFUSED, or
gone) is stale and removed. Any other answer (EACCES, EAGAIN from a full
backlog, a timeout...) does not tell whether the owner is alive, so the path
is refused too, naming the errno: unlinking a live socket silently cuts its
server off from every new client. :func:`check_bindable` applies the rules
that need no connect, changing nothing (``check-config``).

After stopping, :func:`remove_own` removes the socket only if it is still the
one we bound (same st_dev/st_ino): a newer instance may have replaced it.

The probe cannot see another instance that has not bound yet, nor keep a
stopping grpc server from unlinking its path: every instance binding a path
takes its lock first (socketlock.py, whose ``claim`` applies :func:`prepare`'s
rules around it: :func:`remove_stale` once it holds it).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import stat
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MAX_PATH = 107  # sockaddr_un.sun_path without its terminating NUL
PROBE_TIMEOUT = 1.0  # seconds a stale check may take at most

# Only these connect errors prove that nobody listens on the socket (ENOENT:
# removed since the caller looked at it).
_STALE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENOENT})
# What the other answers most likely mean, for the operator reading the refusal.
_HINTS = {
    errno.EACCES: "no permission to connect: the socket may belong to a server of another user",
    errno.EAGAIN: "its listen backlog is full: a server that is alive but not accepting",
    errno.ETIMEDOUT: "no answer in time",
}


SOCKET_UMASK = 0o117  # a socket bound under it is 0660: never, even briefly, open to others


@contextlib.contextmanager
def socket_umask() -> Iterator[None]:
    """The umask for a socket's bind. It is the whole process's: hold it
    around the bind alone, never across an await, or a file another task
    creates meanwhile gets it too (a directory without its x bits)."""
    old = os.umask(SOCKET_UMASK)
    try:
        yield
    finally:
        os.umask(old)


class ListenError(RuntimeError):
    """The proxy cannot listen where it was told (its socket, a bind, its
    private directories); the message says why. Here, below the proxy's
    server (cripath/server.py) and its frames path (frames/path.py) alike."""


class UnixSocketError(RuntimeError):
    """The socket path cannot be used; the message names the path and why."""


class PathTooLong(UnixSocketError, ValueError):
    pass


class UnusablePath(UnixSocketError):
    """Nothing can ever listen at the path as the disk stands (no directory
    can hold it, or another kind of file is there): waiting or restarting
    will not help, unlike a socket another process serves."""


# The errnos of a failed mkdir or lstat that say what the path itself is (a
# file in the way, a name the kernel refuses). Any other (EACCES, EROFS,
# EPERM, ENOSPC...) is the system's state at that moment, which a restart may
# find changed: at boot /run may still be read-only, or a directory another
# unit makes may not have its owner or mode yet.
_PATH_ERRNOS = frozenset({errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP})


def _path_error(message: str, exc: OSError) -> UnixSocketError:
    kind = UnusablePath if exc.errno in _PATH_ERRNOS else UnixSocketError
    return kind(f"{message}: {exc.strerror or exc}")


@dataclass(frozen=True)
class SocketIdentity:
    """Which file a socket path pointed to when we bound it (``of`` right after bind)."""

    dev: int
    ino: int

    @classmethod
    def of(cls, path: Path) -> SocketIdentity:
        st = os.lstat(path)
        return cls(st.st_dev, st.st_ino)


def check_path_length(path: Path) -> None:
    length = len(os.fsencode(path))
    if length > MAX_PATH:
        raise PathTooLong(f"unix socket path too long ({length} > {MAX_PATH} bytes): {path}")


# grpc splits a unix: target's path at each comma, after decoding it (%2C
# too): it dials /run/a then b.sock (relative to the current directory), never
# /run/a,b.sock. Its bind takes the whole path, but what the proxy binds is
# dialled through grpc too (`listen` by `runtime-proxy status` and the bench),
# and the proxy dials the backends and each hook server.
COMMA_REASON = ("a comma in a unix socket path: grpc reads it as a separator between two addresses "
                "(even written %2C) and cannot dial it; choose a path without one")


class UndialablePath(UnusablePath, ValueError):
    """A path grpc cannot dial (a comma)."""


def dial_problem(path: str | os.PathLike[str]) -> str | None:
    """Why grpc cannot dial ``path`` (None: it can)."""
    return COMMA_REASON if b"," in os.fsencode(path) else None


def grpc_address(path: str | os.PathLike[str]) -> str:
    """The address that makes grpc's server bind ``path`` itself. Not
    ``unix://PATH``: grpc's bind takes all after ``unix:`` as the path, so it
    would bind ``///run/...`` (the same file, but two bytes longer, limiting
    paths to 105 bytes, and shown so by ss and /proc/net/unix). Quoted, as
    grpc decodes it: ``%41`` would bind ``A``, and ``#`` or ``?`` cut the path."""
    return "unix:" + urllib.parse.quote(os.fsencode(path))


def grpc_target(path: str | os.PathLike[str]) -> str:
    """The target that makes a grpc channel dial ``path`` (absolute from the
    current directory), quoted as :func:`grpc_address`: ``/x/cri#1.sock``
    unquoted dials ``/x/cri``. An UndialablePath for a comma (grpc reads it
    as a second address, even quoted): never a target that dials elsewhere;
    settings and hook files refuse such a path before it comes here."""
    absolute = os.path.abspath(path)
    problem = dial_problem(absolute)
    if problem is not None:
        raise UndialablePath(f"{problem}: {absolute}")
    return "unix://" + urllib.parse.quote(os.fsencode(absolute))


def _connect_errno(path: Path, timeout: float,
                   connected: Callable[[socket.socket], None] | None = None) -> int:
    """The errno of a non-blocking connect to ``path`` (0: someone accepted),
    waiting at most ``timeout`` seconds (ETIMEDOUT past it); ``connected``
    called with the connected socket (0) before it is closed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        err = probe.connect_ex(os.fsencode(path))
        if err == errno.EINPROGRESS:
            _, writable, _ = select.select([], [probe], [], timeout)
            if not writable:
                return errno.ETIMEDOUT
            err = probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err == 0 and connected is not None:
            connected(probe)
        return err


@dataclass(frozen=True)
class ConnectFailure:
    """A connect to a socket that nobody accepted."""

    errno: int
    hint: str  # what it most likely means, for the operator
    nobody_listens: bool  # proven (ECONNREFUSED, ENOENT); else it may be served: do not remove it

    @property
    def name(self) -> str:
        return errno.errorcode.get(self.errno, str(self.errno))


def connect_failure(path: Path, timeout: float = PROBE_TIMEOUT,
                    connected: Callable[[socket.socket], None] | None = None) -> ConnectFailure | None:
    """None if someone accepts a connect to ``path``; else why not.
    ``connected``: called with the probe's socket once connected (to read
    its peer without a second connect)."""
    err = _connect_errno(path, timeout, connected)
    if err == 0:
        return None
    return ConnectFailure(err, _HINTS.get(err, os.strerror(err)), err in _STALE_ERRNOS)


def is_stale(path: Path, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether nobody listens on the socket at ``path``: True if stale, False
    if live; raises :class:`UnixSocketError` when the answer does not tell."""
    failure = connect_failure(path, timeout)
    if failure is None:
        return False
    if failure.nobody_listens:
        return True
    raise UnixSocketError(
        f"cannot tell whether {path} is in use: connect failed with {failure.name} ({failure.hint}); "
        "refusing to remove it"
    )


def prepare(path: Path, timeout: float = PROBE_TIMEOUT) -> None:
    """Make ``path`` ready to bind: create its directory, remove a stale
    socket, refuse anything else that is there."""
    check_path_length(path)
    make_directory(path)
    remove_stale(path, timeout)


def remove_stale(path: Path, timeout: float = PROBE_TIMEOUT) -> None:
    """:func:`prepare` once the path's length is checked and its directory
    made (socketlock's ``claim`` does both before it takes its lock, whose
    file goes in that directory, and this after it)."""
    st = _lstat(path)
    if st is None:
        return
    _refuse_non_socket(path, st)
    if not is_stale(path, timeout):
        raise UnixSocketError(f"{path} is in use by another process; refusing to take it over")
    # Unlink only the socket we found stale, not one bound there meanwhile.
    if remove_own(path, SocketIdentity(st.st_dev, st.st_ino)):
        log.info("removed stale socket", extra={"path": str(path)})


def make_directory(path: Path) -> None:
    """Create the directory of the socket ``path`` (and its parents)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # EEXIST or ENOTDIR (a file in the way), EROFS, EACCES
        _check_directory(path)  # names the file in the way, when that is the cause
        raise _path_error(f"cannot create the directory of {path}", exc) from exc


def check_bindable(path: Path) -> None:
    """Raise what :func:`prepare` would for ``path`` whoever runs: too long,
    no directory possible, not a socket. Changes nothing on disk and asks no
    server: a live socket there may well be this proxy's own (check-config)."""
    check_path_length(path)
    _check_directory(path)
    try:
        st = os.lstat(path)
    except OSError:
        return  # nothing there, or no right to look (serve may run with more)
    _refuse_non_socket(path, st)


def _check_directory(path: Path) -> None:
    """The nearest existing ancestor of ``path`` must be a directory, or mkdir fails."""
    for ancestor in path.parents:
        try:
            st = os.stat(ancestor)  # followed, as mkdir follows a symlink to a directory
        except (FileNotFoundError, NotADirectoryError):
            continue  # made by prepare, or below a file found further up
        except OSError:
            return  # EACCES and the like: cannot tell without the rights serve runs with
        if not stat.S_ISDIR(st.st_mode):
            raise UnusablePath(f"cannot create the directory of {path}: {ancestor} is not a directory")
        return


def _lstat(path: Path) -> os.stat_result | None:
    """``path``'s own status (a symlink is not followed), None when nothing is there."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _path_error(f"cannot inspect {path}", exc) from exc


def refuse_non_socket(path: Path) -> None:
    """Raise :class:`UnusablePath` if anything but a socket is at ``path``
    (the rule :func:`prepare` applies before its probe); nothing there is fine."""
    st = _lstat(path)
    if st is not None:
        _refuse_non_socket(path, st)


def _refuse_non_socket(path: Path, st: os.stat_result) -> None:
    # lstat: a symlink, even to a socket, is refused (the stale check would follow it, the unlink not).
    if stat.S_ISLNK(st.st_mode):
        raise UnusablePath(f"{path} is a symbolic link, not a unix socket; refusing to replace it")
    if not stat.S_ISSOCK(st.st_mode):
        raise UnusablePath(f"{path} exists and is not a unix socket; refusing to replace it")


def remove_own(path: Path, identity: SocketIdentity | None) -> bool:
    """Unlink ``path`` if it is still the socket ``identity`` names."""
    if identity is None:
        return False
    try:
        if SocketIdentity.of(path) != identity:
            log.info("socket replaced by another process, left in place", extra={"path": str(path)})
            return False
        path.unlink()
    except FileNotFoundError:
        return False
    return True
