"""HTTP/2 frames (RFC 9113 section 4): just enough to relay them.

The relay reads frame headers to find boundaries, stream ids and flow
control; payloads pass on untouched. Frames the proxy writes itself are built
here too.
"""

from __future__ import annotations

import struct
from collections import deque
from enum import IntEnum

HEADER_LEN = 9
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_MAX_FRAME = 16_384
DEFAULT_HEADER_TABLE = 4_096  # SETTINGS_HEADER_TABLE_SIZE's initial value
MAX_FRAME_LIMIT = (1 << 24) - 1
DEFAULT_WINDOW = 65_535
MAX_WINDOW = (1 << 31) - 1
MAX_STREAM_ID = (1 << 31) - 1  # a GOAWAY naming it as last refuses no stream


class FrameType(IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


class Flag:
    END_STREAM = 0x1
    ACK = 0x1
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class FrameError(Exception):
    """A connection error: the peer gets a GOAWAY with ``code``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class AckedSetting:
    """One peer's setting as it changes (MAX_FRAME_SIZE, INITIAL_WINDOW_SIZE, HEADER_TABLE_SIZE).
    A value it announces applies once it is acknowledged (RFC 9113 section
    6.5.3), and the ACK comes from the other side of the proxy: so what the
    proxy sends this peer itself keeps within every value still in play
    (``send``: frame sizes, the window of its own DATA), while frames relayed
    to it may reach any of them (``relay``)."""

    def __init__(self, initial: int) -> None:
        self._acked = initial
        self._announced: deque[int | None] = deque()  # one per SETTINGS not acknowledged yet
        self.send = self.relay = initial

    def announced(self, size: int | None) -> None:
        """The peer sent SETTINGS (with this setting at ``size``, or without it: None)."""
        self._announced.append(size)
        self._update()

    @property
    def acked(self) -> int:
        """The value in force (acknowledged)."""
        return self._acked

    def acknowledged(self) -> None:
        """Its oldest SETTINGS not acknowledged yet was (ACKs come in order)."""
        if self._announced:
            size = self._announced.popleft()
            if size is not None:
                self._acked = size
            self._update()

    def _update(self) -> None:
        sizes = [self._acked, *(size for size in self._announced if size is not None)]
        self.send, self.relay = min(sizes), max(sizes)


class Frame:
    """One parsed frame; a plain slotted class, made for every frame relayed
    (a frozen dataclass costs several times as much to build)."""

    __slots__ = ("type", "flags", "stream_id", "payload")

    def __init__(self, type_: int, flags: int, stream_id: int, payload: memoryview | bytes) -> None:
        self.type = type_  # a FrameType, or an unknown type (relayed, RFC 9113 section 4.1)
        self.flags = flags
        self.stream_id = stream_id
        self.payload = payload

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)

    def __repr__(self) -> str:
        return f"Frame(type={self.type}, flags={self.flags:#x}, stream_id={self.stream_id}, {len(self.payload)} bytes)"


# 24-bit length as a byte and a short, type, flags, stream id. The relay's
# loops (upstream.py, downstream.py) read it themselves: no Frame per frame
# that passes verbatim.
HEADER = struct.Struct(">BHBBI")
INCREMENT = struct.Struct(">I")  # a WINDOW_UPDATE's payload
# Of these flags, END_HEADERS alone: a header block whole in one frame, no
# padding or priority to strip (nearly every block a gRPC peer sends).
WHOLE_PLAIN = Flag.END_HEADERS | Flag.PADDED | Flag.PRIORITY

# For the frame loops (upstream.py, downstream.py), as module globals: an
# IntEnum member compares slower than an int, and a class attribute costs a
# lookup each time.
T_DATA, T_HEADERS, T_SETTINGS, T_WINDOW_UPDATE = (
    int(FrameType.DATA), int(FrameType.HEADERS), int(FrameType.SETTINGS), int(FrameType.WINDOW_UPDATE))
T_PRIORITY, T_RST_STREAM, T_PUSH_PROMISE, T_PING, T_GOAWAY, T_CONTINUATION = (
    int(FrameType.PRIORITY), int(FrameType.RST_STREAM), int(FrameType.PUSH_PROMISE), int(FrameType.PING),
    int(FrameType.GOAWAY), int(FrameType.CONTINUATION))
F_PADDED, F_END_STREAM, F_END_HEADERS = Flag.PADDED, Flag.END_STREAM, Flag.END_HEADERS


_BLOCK_FRAMES = (FrameType.HEADERS, FrameType.PUSH_PROMISE, FrameType.CONTINUATION)


def leaves_block_open(kind: int, flags: int) -> bool:
    """Whether a frame leaves a header block open: a HEADERS, PUSH_PROMISE or
    CONTINUATION frame without END_HEADERS, which only that block's
    CONTINUATION frames may follow (RFC 9113 section 6.10). A frame the proxy
    writes in between is a connection error (PROTOCOL_ERROR) for the peer."""
    return kind in _BLOCK_FRAMES and not flags & Flag.END_HEADERS


def without_end_stream(raws: list[bytes]) -> list[bytes]:
    """A header block's frames as received, with END_STREAM cleared on the first (the HEADERS)."""
    first = bytearray(raws[0])
    first[4] &= ~Flag.END_STREAM
    return [bytes(first), *raws[1:]]


def serialize(type_: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEADER.pack(n >> 16, n & 0xFFFF, type_, flags, stream_id & 0x7FFFFFFF) + payload


def parse(buf: bytes | bytearray | memoryview, start: int, max_frame: int) -> tuple[Frame | None, int]:
    """The frame at ``start`` and where the next begins; (None, start) if incomplete."""
    if len(buf) - start < HEADER_LEN:
        return None, start
    hi, lo, type_, flags, sid = HEADER.unpack_from(buf, start)
    length = (hi << 16) | lo
    if length > max_frame:
        raise oversized(length, max_frame)
    end = start + HEADER_LEN + length
    if len(buf) < end:
        return None, start
    payload = memoryview(buf)[start + HEADER_LEN : end]
    return Frame(type_, flags, sid & 0x7FFFFFFF, payload), end


def oversized(length: int, max_frame: int) -> FrameError:
    """The connection error for a frame longer than the receiver's SETTINGS_MAX_FRAME_SIZE."""
    return FrameError(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes exceeds {max_frame}")


class Carry:
    """A frame begun in one read and completed from the next ones: only that
    frame is copied, never the read it is completed from."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def keep(self, rest: memoryview) -> None:
        """The end of a read, which holds no complete frame."""
        self.buf = bytearray(rest)

    def complete(self, chunk: bytes, max_frame: int) -> tuple[bytes | None, int]:
        """The carried frame, completed from ``chunk`` (None while it still is
        not), and how many bytes of ``chunk`` that took."""
        buf, view = self.buf, memoryview(chunk)
        used = 0
        if len(buf) < HEADER_LEN:
            used = min(HEADER_LEN - len(buf), len(chunk))
            buf += view[:used]
            if len(buf) < HEADER_LEN:
                return None, used
        size = int.from_bytes(buf[:3], "big")
        if size > max_frame:
            raise oversized(size, max_frame)
        take = min(HEADER_LEN + size - len(buf), len(chunk) - used)
        buf += view[used : used + take]
        used += take
        if len(buf) < HEADER_LEN + size:
            return None, used
        self.buf = bytearray()
        return bytes(buf), used


_STRIPPED = int(Flag.PADDED | Flag.PRIORITY)  # an int: Flag's operators cost hundreds of instructions


def unpadded(frame: Frame) -> memoryview | bytes:
    """A DATA/HEADERS payload without padding (and HEADERS' priority fields)."""
    body = frame.payload
    if not frame.flags & _STRIPPED:  # most frames (every answer's): nothing to strip
        return body
    start, pad = 0, 0
    if frame.has(Flag.PADDED):
        if not body:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "padded frame without pad length")
        pad = body[0]
        start = 1
    if frame.type == FrameType.HEADERS and frame.has(Flag.PRIORITY):
        start += 5
    if start + pad > len(body):
        raise FrameError(ErrorCode.PROTOCOL_ERROR, "padding exceeds the frame")
    return body[start : len(body) - pad]


def settings(payload: memoryview | bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise FrameError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
    return {k: v for k, v in struct.iter_unpack(">HI", payload)}


def window_increment(frame: Frame) -> int:
    if len(frame.payload) != 4:
        raise FrameError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE length not 4")
    return struct.unpack(">I", frame.payload)[0] & 0x7FFFFFFF


def window_update(stream_id: int, increment: int) -> bytes:
    return serialize(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return serialize(FrameType.RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return serialize(FrameType.GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


def data_frames(stream_id: int, data: bytes, max_frame: int, end_stream: bool) -> list[bytes]:
    """``data`` as DATA frames of at most ``max_frame`` bytes each."""
    view = memoryview(data)
    chunks = [view[i : i + max_frame] for i in range(0, len(data), max_frame)] or [view]
    out = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        out.append(serialize(FrameType.DATA, Flag.END_STREAM if (last and end_stream) else 0, stream_id, bytes(chunk)))
    return out


_END_HEADERS, _ENDS_ALL = int(Flag.END_HEADERS), int(Flag.END_HEADERS | Flag.END_STREAM)


def header_frames(stream_id: int, block: bytes, max_frame: int, end_stream: bool) -> list[bytes]:
    """A header block as HEADERS + CONTINUATION frames."""
    if len(block) <= max_frame:  # the common case: one frame, no list of parts
        return [serialize(T_HEADERS, _ENDS_ALL if end_stream else _END_HEADERS, stream_id, block)]
    parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)] or [b""]
    out = []
    for i, part in enumerate(parts):
        flags = Flag.END_HEADERS if i == len(parts) - 1 else 0
        if i == 0:
            out.append(serialize(FrameType.HEADERS, flags | (Flag.END_STREAM if end_stream else 0), stream_id, part))
        else:
            out.append(serialize(FrameType.CONTINUATION, flags, stream_id, part))
    return out
