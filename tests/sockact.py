"""Socket activation as systemd does it, for tests: the test binds and holds
the listening socket, and each proxy it starts gets it as fd 3 with
LISTEN_FDS=1 and LISTEN_PID set to the proxy's own pid (by a small wrapper that
moves the fd, sets them and execs the proxy, keeping its pid)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

# dash's redirections take one-digit fds only: the wrapper is Python.
_WRAPPER = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execvp(sys.argv[2], sys.argv[2:])
"""


class HeldSocket:
    """What systemd's runtime-proxy.socket does: bind, listen, keep."""

    def __init__(self, path: Path, mode: int = 0o660, backlog: int = 128) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chmod(path, mode)
        self.sock.listen(backlog)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started with the socket as fd 3 (start it with ``pass_fds=self.pass_fds``)."""
        return [sys.executable, "-c", _WRAPPER, str(self.sock.fileno()), *argv]

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self.sock.fileno(),)

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)
