"""Unix sockets in the states the socket rules tell apart (tests/*/host/)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

from runtimeproxy.host.unixsocket import SocketIdentity


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
