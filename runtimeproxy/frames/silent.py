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
Status of the proxy's own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import frame as fr
from .frame import ErrorCode

if TYPE_CHECKING:
    from .connection import FrameConnection

# The connection's own logger: these are its lines.
log = logging.getLogger(__package__ + ".connection")

# grpc-go and C-core servers send their SETTINGS as they accept: in
# microseconds. Seconds are a runtime that is not answering.
SETTINGS_WAIT_S = 5.0


def bound(conn: FrameConnection, backend: Path, silent: Callable[[str], None]) -> None:
    """From now, ``conn``'s runtime has SETTINGS_WAIT_S to send its SETTINGS;
    else ``silent`` is told why and the client told to go away."""
    wait = SETTINGS_WAIT_S
    timer = asyncio.get_running_loop().call_later(wait, _expired, conn, backend, silent, wait)
    conn.closed.add_done_callback(lambda _: timer.cancel())


def _expired(conn: FrameConnection, backend: Path, silent: Callable[[str], None], wait: float) -> None:
    if conn.closed.done() or conn.prefaced:
        return
    reason = f"it accepted a connection but sent no HTTP/2 SETTINGS within {wait:g} s"
    log.warning("frames: the runtime accepted the connection but sent no HTTP/2 SETTINGS in time: it is taken as "
                "unreachable; the client is told to reconnect, and hooked calls are refused until it answers",
                extra={"backend": str(backend), "seconds": wait,
                       "calls": len(conn.relayed) + len(conn.hooked) + len(conn.diverted)})
    silent(reason)
    conn.out.release()  # an empty SETTINGS: a valid preface for the GOAWAY
    text = f"runtime-proxy: the runtime at {backend} sent no SETTINGS within {wait:g} s"
    conn.out.control(fr.goaway(0, ErrorCode.NO_ERROR, text.encode()[:200]))
    conn.out.flush()
    conn.lost()
