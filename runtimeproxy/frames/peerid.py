"""Which client connection a frames log line is about.

A unix socket's peer has no address; what tells an operator which client it
is, is its process (SO_PEERCRED: kubelet's pid, or crictl's), and what tells
apart that process's connections open at the same time is the proxy's
descriptor of the socket (``ls -l /proc/<proxy pid>/fd/<fd>``, ``ss -xp``).
Read once, as a connection is set up (one getsockopt), and put in every line
about that connection or its calls: nothing per frame, and still right on the
lines logged as it closes, when the socket can no longer be asked.
"""

from __future__ import annotations

import asyncio
import socket

from ..host.peercred import peer_credentials


def client_identity(transport: asyncio.BaseTransport) -> dict[str, int | None]:
    """``client_pid`` and ``client_fd`` for a log line's ``extra`` (None where unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return {"client_pid": None, "client_fd": None}
    pid: int | None = None
    if sock.family == socket.AF_UNIX and hasattr(socket, "SO_PEERCRED"):
        try:
            pid = peer_credentials(sock)[0]
        except OSError:  # closed meanwhile
            pid = None
    fd = sock.fileno()
    return {"client_pid": pid, "client_fd": fd if fd >= 0 else None}
