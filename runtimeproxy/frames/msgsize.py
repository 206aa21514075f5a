"""gRPC message lengths in a relayed stream's DATA, to apply the proxy's size limits.

A relayed call never has its messages decoded, but each starts with a
5-byte prefix (compressed flag, length); the tracker follows those across
DATA frames and says when a message is longer than the limit, so the relay
can refuse it as grpc.aio would (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations


class MessageSizes:
    __slots__ = ("_limit", "remaining", "_prefix")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        # Bytes left of the current message body; the relay's loops skip a
        # frame within it themselves (downstream.py), without a call here.
        self.remaining = 0
        self._prefix = b""  # an incomplete prefix carried to the next frame

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
