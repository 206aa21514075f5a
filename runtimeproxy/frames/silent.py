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
so: each later client connection meets a bound again (kubelet's every few
seconds), its lines at DEBUG.

While the runtime is known silent (the latest sign the Unready has of it is
a silence, and no Status answered since), a new connection's bound is
KNOWN_SILENT_WAIT_S, not SETTINGS_WAIT_S: its client (kubelet retrying
after the GOAWAY) is told to go away again at once rather than held another
5 s, while a runtime that came back, whose SETTINGS come in microseconds,
is used at once. Should the runtime answer a Status during that short wait,
the connection gets the rest of the full bound. A healthy runtime's
connections get the full bound as before. The Unready's reason (REASON, in
every refusal and in the line that ends the outage) names the full bound:
a short wait is the same silence met again, its own length only in its
GOAWAY and its line's ``seconds``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

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
# The bound while the runtime is known silent: still far above the
# microseconds a runtime that came back takes, far below kubelet's patience.
KNOWN_SILENT_WAIT_S = 0.5
# The Unready's reason for a silent runtime, whichever bound a connection
# met: fixed, so that the short waits do not rewrite what the refusals say
# (and the docs quote), and so that Silences.known can tell it is still theirs.
REASON = f"it accepted a connection but sent no HTTP/2 SETTINGS within {SETTINGS_WAIT_S:g} s"


class Silence(Protocol):
    """What the bound tells of the connections a runtime left silent (the
    listener's ``runtime_silent``; Silences for a runtime's Unready)."""

    def __call__(self) -> bool:
        """A connection met the bound: returns whether to warn. (No reason
        is passed: a silence's is always REASON, the Unready's text that
        ``known`` looks for.)"""

    def known(self) -> bool:
        """Whether the runtime is known silent now: a new connection's bound is short."""


class Unwatched:
    """No Unready to tell: every silence is warned of, none is known (a
    listener's own, in tests)."""

    def __call__(self) -> bool:
        return True

    def known(self) -> bool:
        return False


class Silences:
    """Tells the runtime's Unready of each connection it left silent (the
    listener's ``runtime_silent``), and whether that is news: the first
    since the runtime last served, whose warning is given."""

    def __init__(self, unready: Unready) -> None:
        self._unready = unready
        self._warned = 0  # the Unready's episode the latest warning was in (0: none)

    def __call__(self) -> bool:
        """The Unready is told REASON: known() finds its own text there."""
        unready = self._unready
        first = unready.reason is None or unready.episode != self._warned
        # Its warning is this module's (_expired): Unready's own start line is
        # a debug one, its end (the runtime answers) an INFO one, the end of
        # what was warned of.
        unready.saw(REASON, logging.DEBUG, recovery=logging.INFO)
        self._warned = unready.episode
        return first

    def known(self) -> bool:
        """The Unready's reason is still a silence's (REASON): no Status
        answered since (ready) and no other sign came (an answer, 'not
        initialized', says the runtime speaks HTTP/2 again; its loss)."""
        return self._unready.reason == REASON


def bound(conn: FrameConnection, backend: Path, silent: Silence) -> None:
    """From now, ``conn``'s runtime has SETTINGS_WAIT_S to send its SETTINGS
    (KNOWN_SILENT_WAIT_S while ``silent`` knows it silent; their arrival
    cancels the timer: FrameConnection.server_prefaced); else ``silent`` is
    told (it returns whether to warn) and the client told to go away.
    Nothing to bound if they came already: the backend's attach, just before,
    may have delivered what the runtime sent while it was dialled."""
    if conn.prefaced or conn.closed.done():
        return
    short = silent.known() and KNOWN_SILENT_WAIT_S < SETTINGS_WAIT_S
    wait = KNOWN_SILENT_WAIT_S if short else SETTINGS_WAIT_S
    conn.settings_wait = asyncio.get_running_loop().call_later(wait, _expired, conn, backend, silent, wait, short)
    conn.closed.add_done_callback(lambda _: _disarm(conn))


def _disarm(conn: FrameConnection) -> None:
    if conn.settings_wait is not None:
        conn.settings_wait.cancel()
        conn.settings_wait = None


def _expired(conn: FrameConnection, backend: Path, silent: Silence, wait: float, short: bool) -> None:
    """``conn``'s runtime sent nothing in ``wait`` seconds; ``short``: the
    bound was the known-silent one."""
    conn.settings_wait = None
    if conn.closed.done() or conn.prefaced:
        return
    if short and not silent.known():
        # The short bound, and the runtime answered a Status meanwhile: it
        # serves again, so this connection has the rest of the full bound,
        # once (its end is not short: no third timer).
        conn.settings_wait = asyncio.get_running_loop().call_later(
            SETTINGS_WAIT_S - wait, _expired, conn, backend, silent, SETTINGS_WAIT_S, False)
        return
    first = silent()
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
