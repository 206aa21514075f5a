"""gRPC message lengths in a relayed stream's DATA, to apply the proxy's size limits.

A relayed call never has its messages decoded, but each starts with a
5-byte prefix (compressed flag, length); the tracker follows those across
DATA frames and says when a message is longer than the limit, so the relay
can refuse it as grpc.aio would (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import struct

from .frame import HEADER_LEN

LENGTH = struct.Struct(">I").unpack_from  # a message prefix's length field
LENGTH_AT = 1  # where that field starts in the prefix: after its flag byte
# Where the first message's length field starts in a DATA frame (unpadded),
# from the frame's header: as the relay's loops read it (upstream.py, downstream.py).
DATA_LENGTH_AT = HEADER_LEN + LENGTH_AT


class MessageSizes:
    __slots__ = ("_limit", "remaining", "_prefix")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        # Bytes left of the current message body; the relay's loops skip a
        # frame within it themselves (downstream.py), without a call here.
        self.remaining = 0
        self._prefix = b""  # an incomplete prefix carried to the next frame

    def feed_at(self, buf: bytes, start: int, n: int) -> int | None:
        """``feed`` for the ``n`` bytes of ``buf`` from ``start`` (a DATA frame's
        payload, unpadded). A frame that starts a message and holds its prefix
        whole (a unary call's one message, nearly always) is read in place,
        without a view, a copy or a loop (the relay's loops, per frame); so is
        one within a message's body (an incomplete prefix leaves none)."""
        remaining = self.remaining
        if remaining >= n:
            self.remaining = remaining - n
            return None
        if remaining or self._prefix or n < 5:
            return self.feed(memoryview(buf)[start : start + n])
        length = LENGTH(buf, start + LENGTH_AT)[0]
        if length > self._limit:
            return length
        if n - 5 > length:  # more messages in this frame
            return self.feed(memoryview(buf)[start : start + n])
        self.remaining = length - (n - 5)
        return None

    def feed(self, data: bytes | memoryview) -> int | None:
        """The length of a message over the limit that starts in ``data``, else None."""
        n = len(data)
        if self.remaining >= n:  # within one message's body: most DATA frames of a large answer
            self.remaining -= n
            return None
        i = 0
        while i < n:
            if self.remaining:
                step = min(self.remaining, n - i)
                self.remaining -= step
                i += step
                continue
            need = 5 - len(self._prefix)
            self._prefix += bytes(data[i : i + need])
            i += need
            if len(self._prefix) < 5:
                return None
            length = int.from_bytes(self._prefix[1:5], "big")
            self._prefix = b""
            if length > self._limit:
                return length
            self.remaining = length
        return None


class StreamSizes(dict[int, MessageSizes]):
    """One direction's trackers, by stream. A relayed stream gets one only at
    its first DATA frame that does not hold one whole message within the
    limit (a unary call's frames nearly always do): until then it is at a
    message's start, which is what a missing tracker says (the relay's loops
    read that case inline, upstream.py and downstream.py, before ``feed_at``),
    and a call costs no tracker at all. A hooked call's are made at its start
    (upstream.py): for it a missing one says the stream ended (taken.py)."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def tracker(self, sid: int) -> MessageSizes:
        sizes = self.get(sid)
        if sizes is None:
            sizes = self[sid] = MessageSizes(self.limit)
        return sizes

    def feed_at(self, sid: int, buf: bytes, start: int, n: int) -> int | None:
        """``MessageSizes.feed_at`` on ``sid``'s tracker, made if missing. The
        relay's loops (its only callers) read a frame that holds one whole
        message within the limit inline, needing no tracker, and call this
        for the others."""
        return self.tracker(sid).feed_at(buf, start, n)
