"""The proxy's sends to the backend: DATA under the backend's connection window.

The request direction's connection-level flow control is owned by the proxy
(per hop), as the response direction's is (outbound.py): the client's DATA
and the proxy's own (a hooked call's request, re-framed after its hooks)
share the backend's connection window, so the proxy counts it and grants the
client a window of its own (``CLIENT_GRANT``), given back as the client's
DATA is consumed. What the backend's window cannot take yet waits here, in
order, bounded by that grant.

Only DATA costs window. Frames that must stay behind queued DATA go through
``ordered``: a stream's RST_STREAM, a SETTINGS ACK (the DATA before it was
framed under the settings it acknowledges), and every header block, not
only a stream's trailers, which follow its DATA: the backend's HPACK
decoder must read the blocks in the order the client's encoder made them,
so none may overtake one queued (upstream.ClientSide.ordered). SETTINGS,
PING ACKs and WINDOW_UPDATE need no such order and are written at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from . import frame as fr
from .window import QueuedData, WindowQueue

CLIENT_GRANT = 4 * 1024 * 1024  # extra connection window given to the client (bounds this queue)


CREDIT_BATCH = 256 * 1024  # window given back at once, at least: a small call costs no extra frame
CREDIT_URGENT = 1024 * 1024  # window owed to the backend that goes at once, without waiting for a write


class Corked:
    """The backend's transport, whose writes can be held to the end of this
    loop turn: a hooked call's header block then leaves with its request, which
    its task sends in its first step when no hook has to be asked first (one
    write, one wake-up of the runtime instead of two). Connection window given
    back to the backend rides with the next write the same way (``credit``)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: list[bytes | memoryview] | None = None
        self._owed = 0  # connection window given back, not sent yet

    def write(self, data: bytes | memoryview) -> None:
        if self._held is None:
            self._send(data)
        else:
            self._held.append(data)

    def credit(self, increment: int) -> None:
        """Window for the backend's DATA, given back: it rides with the next
        write once CREDIT_BATCH is owed, and goes alone once CREDIT_URGENT is
        (the backend still has BACKEND_GRANT less that)."""
        self._owed += increment
        if self._owed >= CREDIT_URGENT and self._held is None and not self._transport.is_closing():
            self._send(b"")

    def _send(self, data: bytes | memoryview) -> None:
        if self._owed >= CREDIT_BATCH:
            update, self._owed = fr.window_update(0, self._owed), 0
            if len(data) > 65536:  # not worth a copy of the data
                self._transport.write(update)
            else:
                data = update + data
        self._transport.write(data)

    def hold(self) -> None:
        """Hold writes until the callbacks scheduled so far have run (FIFO), a
        task's step included."""
        if self._held is None:
            self._held = []
            asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        held, self._held = self._held, None
        # uvloop closes a transport on a socket error and tells the protocol a
        # turn later; writing to it then would raise in this bare callback.
        if (held or self._owed >= CREDIT_URGENT) and not self._transport.is_closing():
            self._send(b"".join(held or ()))  # (held is None only after close(): is_closing() then)

    def close(self) -> None:
        self._held = None  # the connection is over: nothing more goes out
        self._transport.close()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()


class Gone:
    """The runtime's side once it closed: what is still sent to it goes nowhere."""

    def write(self, data: bytes | memoryview) -> None:
        pass

    def close(self) -> None:
        pass

    def hold(self) -> None:
        pass

    def credit(self, increment: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


GONE = Gone()


class Inbound:
    def __init__(self, writer: asyncio.Transport | Corked, credit_client: Callable[[int], None]) -> None:
        self.writer = writer
        self._credit_client = credit_client
        self._queue = WindowQueue("backend")
        self.owed = 0  # the client's window its queued DATA took, given back as it leaves

    def take(self, size: int) -> bool:
        """A DATA frame of ``size`` may go now, verbatim, in the caller's run of
        frames: its window is spent."""
        queue = self._queue
        if queue.items or size > queue.window:
            return False
        queue.window -= size
        return True

    def data(self, stream_id: int, payload: bytes, end_stream: bool, credit: int = 0) -> None:
        """One DATA frame's payload, now if the window allows, else queued.

        The caller has written everything that must precede it."""
        self._queue.items.append(QueuedData(stream_id, bytes(payload), end_stream, credit))
        self.owed += credit
        self.pump()

    def ordered(self, raw: bytes) -> None:
        """Whole frames that must not overtake queued DATA (a RST_STREAM, a header block: see above)."""
        if self._queue.items:
            self._queue.items.append(raw)
        else:
            self.writer.write(raw)

    def grow(self, increment: int) -> None:
        self._queue.grow(increment)
        self.pump()

    def pump(self) -> None:
        out: list[bytes | memoryview] = []
        credit = self._queue.drain(out)
        if out:
            self.writer.write(b"".join(out))
        if credit:
            self.owed -= credit
            self._credit_client(credit)

    @property
    def queued(self) -> int:
        return len(self._queue.items)
