"""Who is at the other end of a connected unix socket (``SO_PEERCRED``).

The kernel's record of the process as it was when it called connect() or,
for a server, last called listen() on its end (Linux sets it at every
listen(); not what it runs as now: one that listened as root and then
dropped to another user is still reported as root). Shared by the
frames server, naming its clients (frames/peerid.py), and the hook client,
judging its servers (hookclient/endpointtrust.py).
"""

from __future__ import annotations

import socket
import struct

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The peer's pid, uid and gid; ``OSError`` if they cannot be read (closed meanwhile)."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid
