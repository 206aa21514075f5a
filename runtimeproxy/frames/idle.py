"""What shutdown waits for on a frames connection (connection.py): its unary
calls, relayed, hooked or diverted, until what answered them was written.

These are FrameConnection's ``busy``, ``check_idle`` and ``wait_idle``,
bound in its class body: each costs what a method of its own would, no call
more. Their state is the connection's: ``is_idle`` (changed only here) and
``idle_event``, what shutdown waits on, made only once it waits: an Event's
set and clear are Python calls, two per unary call, for nothing until then.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import FrameConnection


def busy(conn: FrameConnection) -> None:
    """A call opened that shutdown waits for: not idle."""
    if conn.is_idle:
        conn.is_idle = False
        if conn.idle_event is not None:
            conn.idle_event.clear()


def check(conn: FrameConnection) -> None:
    """Idle once no call is left to finish and what answered them has been
    written (not waiting for the client's window, nor behind a gate): told
    again as the window queue empties (outbound.py)."""
    done = not conn.diverted and not conn.hooked and not conn.out.queued
    if done and not conn.unary_open and (not conn.stopping or conn.prefaced):  # (prefaced: two calls)
        if not conn.is_idle:
            conn.is_idle = True
            if conn.idle_event is not None:
                conn.idle_event.set()
    else:
        busy(conn)
    if conn.backend_lost and done and not conn.closed.done():
        # The proxy's own calls, and the answers given, are done too. (Its own
        # method: this is one of the connection's, bound there.)
        conn._close()


async def wait(conn: FrameConnection) -> None:
    """Until no call is left that shutdown waits for."""
    if conn.is_idle:
        return
    if conn.idle_event is None:
        conn.idle_event = asyncio.Event()  # (not set: not idle)
    await conn.idle_event.wait()
