"""A minimal HTTP/2 client that opens gRPC calls and never reads them.

grpc's own clients always read what they are sent, so a slow reader (a
client whose flow-control window stays shut) has to be written by hand:
the preface, SETTINGS with INITIAL_WINDOW_SIZE=0 (the server may send
headers but no message), then HEADERS and one DATA frame per call. Headers
are HPACK literals without indexing, so no header table is needed.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import hpack

from ..headerblocks import decoded

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _string(value: bytes) -> bytes:
    assert len(value) < 127, "one-byte HPACK length only"
    return bytes([len(value)]) + value


def literal_headers(headers: list[tuple[str, str]]) -> bytes:
    # 0x00: literal header field without indexing, new name.
    return b"".join(b"\x00" + _string(k.encode()) + _string(v.encode()) for k, v in headers)


def grpc_call(stream: int, path: str, message: bytes = b"") -> bytes:
    block = literal_headers(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )
    body = b"\x00" + struct.pack(">I", len(message)) + message
    return frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, body)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    head = await reader.readexactly(9)
    length = int.from_bytes(head[:3], "big")
    return head[3], head[4], await reader.readexactly(length)


class SlowReader:
    """One connection whose calls are sent and whose answers are never read."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._next_stream = 1

    @classmethod
    async def connect(cls, socket: Path) -> SlowReader:
        reader, writer = await asyncio.open_unix_connection(str(socket))
        writer.write(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0)))
        # Acknowledge the server's settings (a connection that never does is
        # closed by the server), then read nothing more.
        async with asyncio.timeout(10):
            while True:
                kind, flags, _ = await _read_frame(reader)
                if kind == SETTINGS and not flags & ACK:
                    break
        writer.write(frame(SETTINGS, ACK, 0, b""))
        await writer.drain()
        return cls(reader, writer)

    async def open_calls(self, path: str, count: int, message: bytes = b"") -> None:
        for _ in range(count):
            self._writer.write(grpc_call(self._next_stream, path, message))
            self._next_stream += 2
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass  # the server may have closed first


class RawPeer:
    """A hand-driven HTTP/2 client: what grpc's own never sends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, path: Path, preface: bytes = PREFACE) -> RawPeer:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(preface)
        return cls(reader, writer)

    async def read(self) -> tuple[int, int, int, bytes] | None:
        """The next frame (type, flags, stream, payload), or None at EOF."""
        async with asyncio.timeout(10):
            try:
                head = await self.reader.readexactly(9)
            except asyncio.IncompleteReadError:
                return None
            payload = await self.reader.readexactly(int.from_bytes(head[:3], "big"))
        return head[3], head[4], struct.unpack(">I", head[5:])[0] & 0x7FFFFFFF, payload

    async def until(self, kind: int, stream: int | None = None) -> list[tuple[int, int, int, bytes]]:
        """Frames read up to and including the first of ``kind`` (on ``stream``)."""
        seen = []
        while (f := await self.read()) is not None:
            seen.append(f)
            if f[0] == kind and stream in (None, f[2]):
                return seen
        raise AssertionError(f"connection closed before a frame of type {kind}; saw {seen}")

    async def goaway_code(self) -> int:
        """Read to the GOAWAY and the connection's end; the GOAWAY's error code."""
        goaway = (await self.until(GOAWAY))[-1]
        assert await self.read() is None  # and the connection is closed
        return struct.unpack(">II", goaway[3][:8])[1]

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def raw_with_settings(path: Path, *settings: tuple[int, int]) -> RawPeer:
    """A raw peer past the SETTINGS exchange, having announced ``settings`` (id, value)."""
    peer = await RawPeer.connect(path)
    peer.writer.write(frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in settings)))
    await peer.until(SETTINGS)  # the server's own
    peer.writer.write(frame(SETTINGS, ACK, 0, b""))
    return peer


def errors(frames: list[tuple[int, int, int, bytes]]) -> list[tuple[int, int, int]]:
    """The GOAWAYs and RST_STREAMs among ``frames`` (kind, flags, stream, payload): kind, stream, error code."""
    out = []
    for kind, _, sid, payload in frames:
        if kind == GOAWAY:
            out.append((kind, sid, struct.unpack(">II", payload[:8])[1]))
        elif kind == RST_STREAM:
            out.append((kind, sid, struct.unpack(">I", payload)[0]))
    return out


def open_call(stream: int, path: str) -> bytes:
    """A call's HEADERS, the request to follow in DATA."""
    call = grpc_call(stream, path)
    return call[: 9 + int.from_bytes(call[:3], "big")]


def message(body: bytes) -> bytes:
    """One gRPC length-prefixed message, uncompressed."""
    return struct.pack(">BI", 0, len(body)) + body


def without_request(block: bytes) -> bytes:
    """``open_call``'s HEADERS ending the stream: a call with no request message."""
    return block[:3] + bytes([HEADERS, END_HEADERS | END_STREAM]) + block[5:]


async def final_status(path: Path, call: bytes, timeout: float = 5) -> str | None:
    """Write ``call`` (stream 1) on a new connection and return the
    grpc-status of its last HEADERS; a reset of the stream fails the test."""
    peer = await raw_with_settings(path)
    try:
        peer.writer.write(call)
        decoder = hpack.Decoder()
        async with asyncio.timeout(timeout):
            while True:
                got = await peer.read()
                assert got is not None, "the proxy closed the connection"
                kind, flags, sid, payload = got
                assert not (kind == RST_STREAM and sid == 1), "the call was reset"
                if kind == HEADERS and sid == 1:
                    headers = decoded(decoder, payload)
                    if flags & END_STREAM:
                        return headers.get("grpc-status")
    finally:
        await peer.close()
