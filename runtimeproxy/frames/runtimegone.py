"""What a frames connection (connection.py) does when its runtime leaves: it
closed its connection (``closed``), or said it goes away (``going_away``).

The calls the runtime carried end as a gRPC client expects of a server that
goes (UNAVAILABLE, or REFUSED_STREAM for those it will not process, which a
client retries), while what the proxy answers itself, and the answers the
runtime gave whole, still reach the client before its connection ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from . import frame as fr
from .frame import ErrorCode
from .inbound import GONE

if TYPE_CHECKING:
    from .connection import FrameConnection

# The connection's own logger: these are its lines, as before they were told apart.
log = logging.getLogger(__package__ + ".connection")

# After the runtime left, how long answers may wait for a client that reads
# none of them (its window stays closed) before its connection is closed.
UNREAD_LINGER_S = 30.0

DEBUG_LOGGED = 200  # bytes of a runtime GOAWAY's debug data logged


def closed(conn: FrameConnection) -> None:
    """The runtime closed its connection: the calls it carried end UNAVAILABLE
    (kubelet retries), while the proxy's own answers on this connection (a
    health Watch) go on, as on the grpc path, and so do the hooked calls it
    had answered whole; the client, told to go away, opens a new
    connection (and so a new runtime connection) for new calls."""
    if conn.closed.done():
        return
    if conn.backend_heads_up is not None and not conn.backend_going_told:
        # A drain that ended before its second GOAWAY (the runtime exited, or
        # its grace ran out): the heads-up, at debug so far, is all it said.
        conn.backend_going_told = True
        log.info("frames: the runtime goes away: its heads-up GOAWAY, then it closed the connection "
                 "without the GOAWAY naming its last stream",
                 extra={"last_stream": fr.MAX_STREAM_ID, "refused": 0, "code": ErrorCode.NO_ERROR.name,
                        "debug": conn.backend_heads_up, **conn.identity})
    # A hooked call the runtime answered whole is not cut short: its
    # answer, held while its stages record it, still goes, once. One reset,
    # or ended by the proxy, has its end queued already: it keeps nothing.
    kept = {sid for sid, call in conn.hooked.items() if call.answered_whole and sid not in conn.ended}
    unanswered = [call for call in conn.hooked.values() if not call.answered.done()]
    # Answers the runtime gave whole may still wait for the client's
    # window, or behind a hooked call's gate: they go before the close.
    if (not kept and not conn.diverted and not conn.out.queued) or not conn.prefaced:
        # (before its SETTINGS, the client can be told nothing)
        if conn.relayed or conn.hooked:  # what the client sees as its connection closed
            log.warning("frames: runtime connection closed with calls in flight; closing the client's",
                        extra={"relayed": len(conn.relayed), "hooked": len(conn.hooked), **conn.identity})
        conn.lost()
        return
    log.info("frames: runtime connection closed; the proxy's own calls and the answers it gave go on",
             extra={"calls": len(conn.diverted), "hooked": len(kept),
                    "queued": conn.out.queued, **conn.identity})
    conn.backend_lost = True
    asyncio.get_running_loop().call_later(UNREAD_LINGER_S, _unread_too_long, conn)
    conn.hold_client_reads("runtime", False)  # a full transport that is gone holds nothing back
    conn.backend.close()
    conn.backend_pings.close()
    conn.backend = conn.inbound.writer = GONE  # type: ignore[assignment]  # Gone: a stand-in with the calls both get
    conn.out.control(fr.goaway(conn.last_stream, ErrorCode.NO_ERROR))
    for sid in sorted(conn.relayed | {call.stream_id for call in unanswered}):
        if sid not in conn.ended:
            conn.end_locally(sid, 14, "runtime-proxy: the runtime closed the connection")
    for call in [call for sid, call in conn.hooked.items() if sid not in kept]:
        call.cancel("the runtime closed the connection")
    conn.out.flush()


def _unread_too_long(conn: FrameConnection) -> None:
    if not conn.closed.done() and not conn.diverted and not conn.hooked and conn.out.queued:
        log.warning("frames: closing a client that read none of its answers since the runtime left",
                    extra={"queued": conn.out.queued, "seconds": UNREAD_LINGER_S, **conn.identity})
        conn.lost()


def going_away(conn: FrameConnection, last: int, code: int, debug: bytes | memoryview) -> None:
    """The runtime goes away: streams it will not process are refused to the
    client (a gRPC client retries those by itself); the client is told to go
    away too, keeping every stream it has, the proxy's own included."""
    refused = sorted(sid for sid in conn.relayed | set(conn.hooked) if sid > last and sid not in conn.ended)
    # grpc-go drains (GracefulStop, MaxConnectionAge) with a heads-up GOAWAY
    # naming no last stream (MAX_STREAM_ID), then, a PING later, the one that does:
    # the info line is that one's (what it refused), and one per connection.
    heads_up = last == fr.MAX_STREAM_ID and code == ErrorCode.NO_ERROR
    # (a heads-up the runtime closes after, with no second GOAWAY: closed's line)
    told = heads_up or conn.backend_going_told
    conn.backend_going_told = conn.backend_going_told or not heads_up
    said = bytes(debug[:DEBUG_LOGGED]).decode("utf-8", "replace")
    if heads_up:
        conn.backend_heads_up = said
    log.log(logging.DEBUG if told else logging.INFO,
            "frames: the runtime goes away; the client is told to go away too",
            extra={"last_stream": last, "refused": len(refused), "code": _code_name(code),
                   "debug": said, **conn.identity})
    conn.backend_going = True
    conn.backend_pings.at_once()
    for sid in refused:
        conn.out.frames(fr.rst_stream(sid, ErrorCode.REFUSED_STREAM))
        conn.mark_ended(sid)
        conn.stream_done(sid, "UNAVAILABLE")
        call = conn.hooked.get(sid)
        if call is not None:
            call.answer(14, "refused by the runtime")
    conn.out.control(fr.goaway(conn.last_stream, ErrorCode.NO_ERROR))


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:  # one the proxy never sends
        return hex(code)
