"""Accepting on a listening unix socket, and stopping without losing a connection.

asyncio's own server accepts a connection in one loop turn and makes its
transport in a later one, which it refuses once the server is closed: a
connection accepted just before a shutdown was dropped unanswered (kubelet:
"connection closed before server preface received"), and having left the
backlog, it never reached the next instance either. From Python 3.13,
closing a unix server also unlinks its socket's path, systemd's included.
Here an accepted socket is the caller's from the accept on, and stopping
only removes the reader: what was not accepted stays in the backlog.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

from .unixsocket import socket_umask

log = logging.getLogger(__name__)

BACKLOG = 128  # for a socket the proxy binds itself
BATCH = 64  # connections accepted per loop turn at most, so a burst does not starve the loop
RETRY_S = 1.0  # out of descriptors or memory: accepting pauses this long (as asyncio's server does)
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def bound_socket(path: str) -> socket.socket:
    """A unix socket listening on ``path``, 0660 from its creation (the caller removes a stale one)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_umask():
            sock.bind(path)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Acceptor:
    """Hands each connection accepted on ``sock`` to ``accepted``, from ``start`` to ``stop``."""

    def __init__(self, sock: socket.socket, accepted: Callable[[socket.socket], None]) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._accepted = accepted
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._retry: asyncio.TimerHandle | None = None
        self._stopped = False

    @property
    def address(self) -> str:
        return self._sock.getsockname()

    def start(self) -> None:
        if self._stopped or self._reading:
            return
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._ready)
        self._reading = True

    def stop(self) -> None:
        """No connection is accepted from now on; the socket stays open (``close``)."""
        self._stopped = True
        self._pause()

    def close(self) -> None:
        """``stop``, and close this process's descriptor of the socket (never its path)."""
        self.stop()
        self._sock.close()

    def _pause(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def _resume(self) -> None:
        self._retry = None
        self.start()

    def _ready(self) -> None:
        for _ in range(BATCH):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:  # the client left while it waited: the next one
                    continue
                log.warning("cannot accept a connection; retrying in %gs", RETRY_S,
                            extra={"socket": self.address, "error": str(exc), "exhausted": exc.errno in _EXHAUSTED})
                # Left in the backlog until descriptors or memory are freed (or
                # whatever else failed passes): the loop is not spun meanwhile.
                self._pause()
                if self._loop is not None:
                    self._retry = self._loop.call_later(RETRY_S, self._resume)
                return
            conn.setblocking(False)
            self._accepted(conn)
            if not self._reading:  # ``accepted`` stopped us
                return
