"""The proxy's sends to the client: one FIFO under the client's connection window.

The response direction's connection-level flow control is owned by the proxy
(per hop): the backend's DATA and the proxy's own answers (diverted calls)
share the client's window, so both go through this queue, in order. An item
is either a run of whole frames that costs no window (a header block is never
split), one stream's DATA, split when the window is smaller than it, or a
gate: a hooked call's final header block, held until the hook stage has
recorded the call (see hooked.py). The gate holds what follows it too, since
header blocks must reach the client in the order the backend encoded them
(HPACK). The backend's connection window is given back as its DATA leaves.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .frame import (
    DEFAULT_WINDOW,
    MAX_WINDOW,
    ErrorCode,
    Flag,
    FrameError,
    FrameType,
    serialize,
)


@dataclass
class _Data:
    stream_id: int
    payload: bytes
    end_stream: bool
    credit: int  # backend window to give back once sent (its padding included)


class Gate:
    """A header block held in the queue until ``open``."""

    def __init__(self, outbound: Outbound, raw: bytes) -> None:
        self._outbound = outbound
        self.raw = raw
        self.is_open = False
        self._timer: asyncio.TimerHandle | None = None

    def open_after(self, seconds: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(seconds, self.open)

    def open(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.is_open:
            self.is_open = True
            self._outbound.pump()
            self._outbound.flush()


class Outbound:
    def __init__(self, writer: asyncio.StreamWriter, credit_backend: Callable[[int], None]) -> None:
        self._writer = writer
        self._credit_backend = credit_backend
        self.window = DEFAULT_WINDOW  # the client's connection receive window
        self._queue: deque[bytes | _Data | Gate] = deque()
        self._pending: list[bytes] = []
        self._credit = 0

    def frames(self, raw: bytes) -> None:
        """Whole frames that cost no window (written in order at the next flush)."""
        if self._queue:
            self._queue.append(raw)
        else:
            self._pending.append(raw)

    def control(self, raw: bytes) -> None:
        """Frames with no order to keep against queued DATA (WINDOW_UPDATE, PING, SETTINGS, GOAWAY):
        they go out at the next flush even while DATA waits for the window."""
        self._pending.append(raw)

    def gate(self, raw: bytes) -> Gate:
        """``raw`` (whole frames), and everything queued after it, wait for ``Gate.open``."""
        gate = Gate(self, raw)
        self._queue.append(gate)
        return gate

    def data(self, stream_id: int, payload: bytes, end_stream: bool, credit: int = 0, raw: bytes | None = None) -> None:
        """One DATA frame's payload; ``raw`` is the frame as received, sent as is when it fits."""
        if raw is not None and not self._queue and len(payload) <= self.window:
            self.window -= len(payload)
            self._pending.append(raw)
            self._credit += credit
            return
        self._queue.append(_Data(stream_id, bytes(payload), end_stream, credit))
        self.pump()

    def flush(self) -> None:
        if self._pending:
            self._writer.write(b"".join(self._pending))
            self._pending.clear()
        if self._credit:
            credit, self._credit = self._credit, 0
            self._credit_backend(credit)

    def grow(self, increment: int) -> None:
        self.window += increment
        if self.window > MAX_WINDOW:
            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, "client connection window overflow")
        self.pump()

    def pump(self) -> None:
        out = self._pending
        credit = 0
        queue = self._queue
        while queue:
            head = queue[0]
            if isinstance(head, bytes):
                out.append(queue.popleft())
                continue
            if isinstance(head, Gate):
                if not head.is_open:
                    break
                out.append(queue.popleft().raw)  # type: ignore[union-attr]
                continue
            size = len(head.payload)
            if size <= self.window:
                queue.popleft()
                flags = Flag.END_STREAM if head.end_stream else 0
                out.append(serialize(FrameType.DATA, flags, head.stream_id, head.payload))
                self.window -= size
                credit += head.credit
                continue
            if self.window <= 0:
                break
            # Part of it now: a peer's frame may be larger than the window left.
            part = self.window
            out.append(serialize(FrameType.DATA, 0, head.stream_id, head.payload[:part]))
            head.payload = head.payload[part:]
            self.window = 0
            break
        self._credit += credit

    @property
    def queued(self) -> int:
        return len(self._queue)
