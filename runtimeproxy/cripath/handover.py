"""Socket activation on the grpc path: a call that crosses the shutdown is refused, so that it is retried.

A client may send a call just before it reads the GOAWAY that a shutting
down grpc server sends. grpc core takes such a call and cancels it
(CANCELLED, which kubelet does not retry), and its first GOAWAY counts every
stream as processed (last stream id 2^31-1), so the client cannot retry it
either. The activation relay sees the client's bytes before grpc does: from
the moment the shutdown starts (``cut``, see Proxy._stop_accepting), frames of
streams the client opens are kept from grpc, and each such stream is answered
RST_STREAM REFUSED_STREAM once grpc's first GOAWAY has reached the client:
gRPC clients (grpc-go, C-core) retry a refused stream once, and, told to go
away, on a new connection (it waits in the backlog for the next instance);
before the GOAWAY they would retry on this one, to be refused again. The
window the dropped DATA took is given back (WINDOW_UPDATE), so the calls
still running keep theirs.

So the relay follows frame boundaries in both directions, reading frame
headers only: which stream a frame is on, and where grpc's next frame
begins, since the relay's frames must go between two of them, and outside
a header block: a HEADERS or PUSH_PROMISE frame without END_HEADERS (grpc's
trailers over the client's frame size, say) is followed directly by its
CONTINUATION frames (RFC 9113 6.10), and a frame in between is a connection
error for the client, failing every call on the connection. grpc decodes no
header block the client sends after a dropped one, since gRPC clients send
none but a new stream's (no request trailers): its HPACK state stays that of
the client's encoder. Malformed input is never an error here; before the cut
all of it reaches grpc, which answers it as without the relay.
"""

from __future__ import annotations

from collections.abc import Callable

from ..frames.frame import HEADER, HEADER_LEN, PREFACE, FrameType, leaves_block_open

_HEADER = HEADER.unpack_from


class _Boundaries:
    """Where frames begin in one direction's bytes."""

    def __init__(self, skip: int = 0) -> None:
        self._skip = skip  # bytes of the current frame (or the preface) still to come
        self._head = b""  # an incomplete frame header

    @property
    def at_boundary(self) -> bool:
        return not self._skip and not self._head

    def _header(self, data: bytes, i: int) -> tuple[bytes | None, int]:
        """The frame header starting at ``i`` (completing a carried one), and where it ends;
        None if ``data`` ends first (it is carried)."""
        take = data[i : i + HEADER_LEN - len(self._head)]
        head = self._head + take if self._head else take
        if len(head) < HEADER_LEN:
            self._head = head
            return None, len(data)
        self._head = b""
        return head, i + len(take)


class ServerFrames(_Boundaries):
    """grpc's bytes to the client, with the relay's own frames put between two
    of grpc's outside a header block, once grpc's first GOAWAY has gone out
    (before it, not even its SETTINGS may have)."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[bytes] = []
        self._kind = -1  # the type of grpc's frame being passed
        self._in_block = False  # in a header block of grpc's: its CONTINUATION frames come next
        self._goaway_sent = False

    @property
    def _outside(self) -> bool:
        """Between two of grpc's frames, outside a header block: where a frame of the relay's may go."""
        return self.at_boundary and not self._in_block

    @property
    def _may_insert(self) -> bool:
        return self._goaway_sent and self._outside

    def insert(self, frame: bytes) -> bytes:
        """``frame`` to send now (returned), or later, at the first boundary after
        grpc's GOAWAY outside a header block (b"")."""
        if self._may_insert and not self._pending:
            return frame
        self._pending.append(frame)
        return b""

    def feed(self, data: bytes) -> bytes:
        """What to write to the client for ``data``."""
        if not self._pending:
            self._walk(data, 0)
            return data
        out: list[bytes] = []
        i = 0
        while self._pending:
            if self._may_insert:
                out += self._pending
                self._pending.clear()
            elif i < len(data):
                j = self._walk(data, i, stop_at_boundary=True)
                out.append(data[i:j])
                i = j
            else:
                break
        if i < len(data):
            self._walk(data, i)
            out.append(data[i:])
        return b"".join(out)

    def end(self) -> bytes:
        """grpc closed the connection: what is still pending, if it can go (not
        inside a frame or a header block)."""
        pending, self._pending = self._pending, []
        return b"".join(pending) if self._outside and self._kind != -1 else b""

    def _walk(self, data: bytes, i: int, stop_at_boundary: bool = False) -> int:
        n = len(data)
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
            else:
                head, i = self._header(data, i)
                if head is None:
                    break
                hi, lo, self._kind, flags, _ = _HEADER(head)
                self._skip = (hi << 16) | lo
                self._in_block = leaves_block_open(self._kind, flags)
            if not self._skip:  # a frame ends here
                if self._kind == FrameType.GOAWAY:
                    self._goaway_sent = True
                if stop_at_boundary:
                    return i
        return i


class ClientStreams(_Boundaries):
    """The client's bytes to grpc: once ``cut``, streams it opens are kept from
    grpc and refused. A header block goes whole or not at all: its
    CONTINUATION frames go where its HEADERS went, even one begun before the cut."""

    def __init__(self, refuse: Callable[[int], None]) -> None:
        super().__init__(len(PREFACE))
        self._refuse = refuse
        self._cut = False
        self._passing = True  # the current frame goes to grpc
        self._head_passed = 0  # bytes of a carried frame header that already went to grpc
        self._block_kept = True  # the open header block goes to grpc (its CONTINUATION frames follow it)
        self._last_refused = 0
        self.last_opened = 0  # the last stream the client opened before the cut
        self.dropped = 0  # DATA bytes kept from grpc, whose window the client is owed

    def cut(self) -> None:
        self._cut = True

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` goes on to grpc."""
        cut = self._cut
        out: list[bytes] = []
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                if cut and self._passing:
                    out.append(data[i : i + step])
                self._skip -= step
                i += step
                continue
            start = i
            head, i = self._header(data, i)
            if head is None:
                if not cut:
                    self._head_passed = len(self._head)
                elif self._head_passed:
                    out.append(data[start:])
                    self._head_passed = len(self._head)
                break
            hi, lo, kind, _, sid = _HEADER(head)
            size, sid = (hi << 16) | lo, sid & 0x7FFFFFFF
            if cut and self._head_passed:  # its header began before the cut and went on: so does the frame
                self._passing = True
                if kind == FrameType.HEADERS:
                    self.last_opened = max(self.last_opened, sid)
            else:
                self._passing = self._keeps(kind, sid)
                if not self._passing and kind == FrameType.DATA:
                    self.dropped += size
            if cut and self._passing:
                out.append(head[self._head_passed :])
            self._head_passed = 0
            self._skip = size
        return b"".join(out) if cut else data

    def _keeps(self, kind: int, sid: int) -> bool:
        if not self._cut:
            if kind == FrameType.HEADERS and sid > self.last_opened:
                self.last_opened = sid
            return True
        if kind == FrameType.CONTINUATION:
            return self._block_kept
        if sid == 0 or sid <= self.last_opened:
            if kind == FrameType.HEADERS:
                self._block_kept = True
            return True
        if kind == FrameType.HEADERS:
            self._block_kept = False
            if sid > self._last_refused:  # a new stream (a client's stream ids only grow)
                self._last_refused = sid
                self._refuse(sid)
        return False

