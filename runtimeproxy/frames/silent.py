"""A runtime that accepts a frames connection and never sends its SETTINGS.

Nothing goes to the client before the runtime's first SETTINGS, its server
preface (outbound.py): a runtime that took the connection (its socket's
backlog, a hung process, something that is not a gRPC server) and says
nothing would hold the client, and every call it opened, until their
deadlines, hooked calls with their hooks asked. The wait is bounded: past
SETTINGS_WAIT_S the runtime is taken as unreachable. The client gets an empty
SETTINGS and a GOAWAY that says no stream was processed (last stream 0), so
a gRPC client retries its calls on a new connection, and the connection
ends; the runtime's Unready (cripath/unready.py) is told, so hooked calls are
refused before their hooks on either data path until the runtime answers a
Status of the proxy's own. The warning is given once while the runtime stays
so: each client connection meets the bound again (kubelet's every few
seconds), its lines at DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..cripath.unready import Unready
from . import frame as fr
from .frame import ErrorCode

if TYPE_CHECKING:
    from .connection import FrameConnection

# The connection's own logger: these are its lines.
log = logging.getLogger(__package__ + ".connection")

# grpc-go and C-core servers send their SETTINGS as they accept: in
# microseconds. Seconds are a runtime that is not answering.
SETTINGS_WAIT_S = 5.0


class Silences:
    """Tells the runtime's Unready of each connection it left silent (the
    listener's ``runtime_silent``), and whether that is news: the first
    since the runtime last served, whose warning is given."""

    def __init__(self, unready: Unready) -> None:
        self._unready = unready
        self._warned = 0  # the Unready's episode the latest warning was in (0: none)

    def __call__(self, reason: str) -> bool:
        unready = self._unready
        first = unready.reason is None or unready.episode != self._warned
        # Its warning is this module's (_expired): Unready's own start line is
        # a debug one, its end (the runtime answers) an INFO one, the end of
        # what was warned of.
        unready.saw(reason, logging.DEBUG, recovery=logging.INFO)
        self._warned = unready.episode
        return first


def bound(conn: FrameConnection, backend: Path, silent: Callable[[str], bool]) -> None:
    """From now, ``conn``'s runtime has SETTINGS_WAIT_S to send its SETTINGS
    (their arrival cancels the timer: FrameConnection.server_prefaced); else
    ``silent`` is told why (it returns whether to warn) and the client told to go away.
    Nothing to bound if they came already: the backend's attach, just before,
    may have delivered what the runtime sent while it was dialled."""
    if conn.prefaced or conn.closed.done():
        return
    wait = SETTINGS_WAIT_S
    timer = asyncio.get_running_loop().call_later(wait, _expired, conn, backend, silent, wait)
    conn.settings_wait = timer
    conn.closed.add_done_callback(lambda _: timer.cancel())


def _expired(conn: FrameConnection, backend: Path, silent: Callable[[str], bool], wait: float) -> None:
    conn.settings_wait = None
    if conn.closed.done() or conn.prefaced:
        return
    reason = f"it accepted a connection but sent no HTTP/2 SETTINGS within {wait:g} s"
    first = silent(reason)
    log.log(logging.WARNING if first else logging.DEBUG,
            "frames: the runtime accepted the connection but sent no HTTP/2 SETTINGS in time: it is taken as "
            "unreachable; the client is told to reconnect, and hooked calls are refused until it answers",
            extra={"backend": str(backend), "seconds": wait,
                   "calls": len(conn.relayed) + len(conn.hooked) + len(conn.diverted), **conn.identity})
    conn.out.release()  # an empty SETTINGS: a valid preface for the GOAWAY
    text = f"runtime-proxy: the runtime at {backend} sent no SETTINGS within {wait:g} s"
    # Last stream 0, though the runtime may have read some of the streams
    # relayed to it: grpc-go and C-core servers write their SETTINGS before
    # they read any stream, so one that sent none has processed none, and the
    # client may retry every call on a new connection (RFC 9113 6.8).
    conn.out.control(fr.goaway(0, ErrorCode.NO_ERROR, text.encode()[:200]))
    conn.out.flush()
    conn.lost()
