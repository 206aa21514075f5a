"""The sd_notify protocol, client side: one datagram per state change.

systemd passes ``NOTIFY_SOCKET`` to a ``Type=notify`` service: a path, or an
abstract socket name written with a leading ``@``. Each message is
newline-separated ``KEY=value`` lines (``READY=1``, ``STATUS=...``,
``WATCHDOG=1``, ``STOPPING=1``). Without the variable nothing is sent: the
same binary runs outside systemd.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state``; True if it was sent. A failure is logged, never raised:
    systemd being unreachable must not take the service down."""
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("cannot notify systemd", extra={"state": state.split("\n")[0], "error": str(exc)})
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when
    systemd watches no watchdog for this process."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1e6 if value > 0 else None
