"""What a frames connection sends: answers' DATA within the peer's windows,
and all of it in one write per turn, bounded for a peer that does not read."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import hpack

from runtimeproxy.frames import frame as fr

from .calls import Call
from .headers import OK_TRAILERS, OK_TRAILERS_BLOCK, Headers
from .settings import PeerSettings

# Control frames answered (PING and SETTINGS ACKs) while the peer does not
# read: past this many unsent bytes it is not read either.
CONTROL_BACKLOG = 1 << 20


class Sender:
    def __init__(self, peer: PeerSettings, encoder: hpack.Encoder, is_open: Callable[[int], bool],
                 finished: Callable[[Call], None]) -> None:
        """``finished(call)``: a call's END_STREAM is queued; ``is_open(sid)``: it is still the server's to answer."""
        # Frames queued this turn, written by ``pump``; emptied in place, never
        # replaced: the connection queues into this same list (connection.py).
        self.out: list[bytes] = []
        self.window = fr.DEFAULT_WINDOW  # the peer's connection window, for what this side sends
        self.transport: asyncio.Transport | None = None
        self._peer = peer
        self._encoder = encoder
        self._is_open = is_open
        self._finished = finished
        self._answers: deque[Call] = deque()  # answered calls whose DATA is not all out
        self._paused = False  # the transport's buffer is full
        self._reading_paused = False  # see CONTROL_BACKLOG
        self._backlog = 0  # bytes written while the transport's buffer was full

    def block(self, headers: list[tuple[bytes, bytes]], stateless: bytes) -> bytes:
        """``headers`` as a header block: ``stateless``, their block made once
        (hpackstatic.py), unless the encoder owes the peer a table size update,
        which must open the next block it sends (RFC 7541 section 4.2)."""
        return self._encoder.encode(headers) if self._encoder.header_table.resized else stateless

    def headers(self, sid: int, headers: Headers, stateless: bytes, end_stream: bool) -> None:
        """Queue ``headers`` (``block``) as the stream's HEADERS frame, and CONTINUATIONs if it needs them."""
        self.out.extend(fr.header_frames(sid, self.block(headers, stateless), self._peer.max_frame, end_stream))

    def answer(self, call: Call, message: bytes) -> None:
        """``message`` (framed) goes out as the windows allow, behind earlier answers."""
        n = len(message)
        if (not self._answers and not self._paused and n <= call.window and n <= self.window
                and n <= self._peer.max_frame):
            # Nearly every answer: nothing waits before it and it fits in one
            # DATA frame now, as _answer_data would send it, without its queue,
            # view and slices. (The call's own window is not taken from: its
            # stream ends here, and is never read again.)
            self.out.append(fr.serialize(fr.T_DATA, 0, call.sid, message))
            self.window -= n
            self._trail(call)
            return
        call.out = memoryview(message)
        self._answers.append(call)

    def forget(self, call: Call) -> None:
        if call in self._answers:
            self._answers.remove(call)

    def clear(self) -> None:
        self._answers.clear()

    def pause(self) -> None:
        self._paused = True  # no DATA goes out; control answers still do, up to CONTROL_BACKLOG

    def resume(self) -> None:
        self._paused = False
        self._backlog = 0
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        self.pump()

    def pump(self) -> None:
        """Send what the windows allow, in answer order, then write it all at once."""
        if self._answers and not self._paused:
            self._answer_data()
        if self.out and self.transport is not None:
            data, paused = b"".join(self.out), self._paused
            self.transport.write(data)  # may pause writing, now
            if paused:  # paused before this write: it held no DATA, only control frames and headers
                self._backlog += len(data)
                if self._backlog > CONTROL_BACKLOG and not self._reading_paused:
                    # A peer that does not read is not read either: its
                    # PINGs' answers would pile up here without end.
                    self._reading_paused = True
                    self.transport.pause_reading()
        self.out.clear()

    def _answer_data(self) -> None:
        still: deque[Call] = deque()
        for call in self._answers:
            if not self._is_open(call.sid):
                continue
            out = call.out
            assert out is not None
            while out and call.window > 0 and self.window > 0:
                n = min(len(out), call.window, self.window, self._peer.max_frame)
                self.out.append(fr.serialize(fr.T_DATA, 0, call.sid, bytes(out[:n])))  # (an int: see connection.py)
                call.window -= n
                self.window -= n
                out = out[n:]
            call.out = out
            if out:
                still.append(call)
                continue
            self._trail(call)
        self._answers = still

    def _trail(self, call: Call) -> None:
        """The call's message is all out: its trailers end its stream."""
        self.headers(call.sid, OK_TRAILERS, OK_TRAILERS_BLOCK, True)
        self._finished(call)
