"""Frames in order under one peer's connection window (outbound.py, inbound.py).

DATA costs window and is split when the window is smaller than it; whole
frames (which cost none) and opened gates pass as they come; a gate not yet
open holds everything behind it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .frame import (
    DEFAULT_WINDOW,
    MAX_WINDOW,
    ErrorCode,
    Flag,
    FrameError,
    T_DATA,
    serialize,
)


@dataclass
class QueuedData:
    stream_id: int
    payload: bytes
    end_stream: bool
    credit: int  # window to give back to the sender once this has left


class Gate:
    """Whole frames held in the queue until ``open``; ``stalls``: whether its call
    still needs DATA from the backend (holding it may then stall that DATA)."""

    def __init__(self, raw: bytes, on_open: Callable[[], None], stalls: Callable[[], bool]) -> None:
        self.raw = raw
        self.is_open = False
        self._on_open = on_open
        self.stalls = stalls

    def open(self) -> None:
        if not self.is_open:
            self.is_open = True
            self._on_open()


class WindowQueue:
    def __init__(self, peer: str) -> None:
        self.peer = peer  # for errors: whose window this is
        self.window = DEFAULT_WINDOW  # the peer's connection receive window
        self.items: deque[bytes | QueuedData | Gate] = deque()

    def grow(self, increment: int) -> None:
        self.window += increment
        if self.window > MAX_WINDOW:
            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"{self.peer} connection window overflow")

    def drain(self, out: list[bytes | memoryview]) -> int:
        """What may go now, appended to ``out``; the credit it frees."""
        credit = 0
        items = self.items
        while items:
            head = items[0]
            if isinstance(head, bytes):
                out.append(head)
                items.popleft()
                continue
            if isinstance(head, Gate):
                if not head.is_open:
                    break
                out.append(head.raw)
                items.popleft()
                continue
            size = len(head.payload)
            if size <= self.window:
                items.popleft()
                out.append(serialize(T_DATA, Flag.END_STREAM if head.end_stream else 0, head.stream_id,
                                     head.payload))
                self.window -= size
                credit += head.credit
                continue
            if self.window > 0:  # part of it now: a peer's frame may be larger than the window left
                part = self.window
                out.append(serialize(T_DATA, 0, head.stream_id, head.payload[:part]))
                head.payload = head.payload[part:]
                self.window = 0
            break
        return credit


def detached(data: bytes | memoryview) -> bytes | memoryview:
    """``data`` as handed to a transport, which may keep it until the peer
    reads it: a view much smaller than the read it comes from is copied, so it
    does not keep the whole read alive.

    Only a view under a quarter of its read is copied: one at or above that
    keeps the whole read alive while the transport holds it, so the memory a
    slow reader's backlog takes may be up to 4 times what the transport's
    get_write_buffer_size counts (the views' lengths), which is what
    CLIENT_BACKLOG and the transport's high-water mark bound (connection.py)."""
    if isinstance(data, memoryview) and data.nbytes * 4 < len(data.obj):  # type: ignore[arg-type]  # obj: the bytes read (typeshed: any Buffer, not Sized)
        return bytes(data)
    return data
