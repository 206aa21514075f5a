"""What ``check-config`` reports: a finding, one line each, and the probe of
a socket the proxy connects to (a backend's, a hook server's)."""

from __future__ import annotations

import enum
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .host import unixsocket

__all__ = ["Finding", "Severity", "endpoint_findings"]


class Severity(enum.Enum):
    ERROR = "error"  # serve would refuse it, or it cannot work
    WARNING = "warning"  # valid, but probably not what was meant

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Finding:
    severity: Severity
    subject: Path  # the file (or socket, or directory) at fault
    reason: str
    line: int | None = None  # 1-based, when the reason has a place in the file

    def __str__(self) -> str:
        where = f"{self.subject}:{self.line}" if self.line is not None else str(self.subject)
        return f"{self.severity}: {where}: {self.reason}"


def endpoint_findings(path: Path, what: str,
                      connected: Callable[[socket.socket], None] | None = None) -> list[Finding]:
    """A socket the proxy connects to: missing is a warning (its server may start
    later), anything but a socket an error (no server can ever listen there).
    ``connected``: called with the probe's socket if someone accepted it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return [Finding(Severity.WARNING, path, f"{what}: socket does not exist (yet?); calls fail until it does")]
    except OSError as exc:
        return [Finding(Severity.WARNING, path, f"{what}: cannot stat: {exc.strerror or exc}")]
    if not stat.S_ISSOCK(mode):
        return [Finding(Severity.ERROR, path, f"{what}: exists and is not a unix socket")]
    failure = unixsocket.connect_failure(path, connected=connected)
    if failure is None:
        return []
    if failure.nobody_listens:
        return [Finding(Severity.WARNING, path, f"{what}: nobody listens on this socket (left behind by a "
                        "server that was killed or stopped?); calls fail until its server is started again")]
    # EACCES: check-config's user may not connect, the proxy's (root) may; EAGAIN: a server not accepting
    return [Finding(Severity.WARNING, path, f"{what}: cannot connect: {failure.hint}")]
