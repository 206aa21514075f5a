"""NRI's connection multiplexer: several byte streams over one unix socket.

Each frame is ``u32 BE connection id | u32 BE payload length | payload``.
There is no open or close signalling: a connection exists once a frame names
it, and all of them end with the socket. Connection 1 carries the Plugin
service (the runtime calls us), connection 2 the Runtime service (we call it).
"""

from __future__ import annotations

import asyncio
import logging
import struct

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">II")
MAX_PAYLOAD = 16 * 1024 * 1024
# containerd reads each connection through a 4096-byte buffer: a message whose
# first frame is longer closes the connection. Go's mux sends the first 4096
# bytes of a write as one frame and the rest as the next; so do we.
FIRST_FRAME_LIMIT = 4096
PLUGIN_CONN = 1
RUNTIME_CONN = 2


class MuxError(ConnectionError):
    """The peer broke the framing; the socket is closed."""


def split_message(data: bytes) -> list[bytes]:
    """The frame payloads one message is sent as."""
    chunks = [data[:FIRST_FRAME_LIMIT]]
    rest = data[FIRST_FRAME_LIMIT:]
    while rest:
        chunks.append(rest[:MAX_PAYLOAD])
        rest = rest[MAX_PAYLOAD:]
    return chunks


def encode_frames(conn_id: int, data: bytes) -> bytes:
    return b"".join(FRAME_HEADER.pack(conn_id, len(chunk)) + chunk for chunk in split_message(data))


class MuxConn:
    """One multiplexed connection: a reassembled byte stream in, messages out."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self.mux = mux
        self.conn_id = conn_id
        self.reader = asyncio.StreamReader(limit=MAX_PAYLOAD)

    async def send(self, message: bytes) -> None:
        await self.mux.send(self.conn_id, message)


class Mux:
    """Reads frames into per-connection streams; writes whole messages."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, MuxConn] = {}
        self._write_lock = asyncio.Lock()
        self._unknown_logged: set[int] = set()
        self.closed = asyncio.Event()

    def open(self, conn_id: int) -> MuxConn:
        if conn_id == 0:
            raise ValueError("connection id 0 is reserved")
        conn = self._conns.get(conn_id)
        if conn is None:
            conn = self._conns[conn_id] = MuxConn(self, conn_id)
        return conn

    async def run(self) -> None:
        """Read until the socket ends; then every connection sees EOF."""
        try:
            while True:
                try:
                    header = await self._reader.readexactly(FRAME_HEADER.size)
                except asyncio.IncompleteReadError:
                    return
                conn_id, length = FRAME_HEADER.unpack(header)
                if length > MAX_PAYLOAD or conn_id == 0:
                    raise MuxError(f"bad mux frame: connection {conn_id}, length {length}")
                try:
                    payload = await self._reader.readexactly(length)
                except asyncio.IncompleteReadError:
                    return
                conn = self._conns.get(conn_id)
                if conn is None:
                    if conn_id not in self._unknown_logged:
                        self._unknown_logged.add(conn_id)
                        log.warning("frame for an unknown mux connection dropped", extra={"conn_id": conn_id})
                    continue
                conn.reader.feed_data(payload)
        except (ConnectionError, OSError) as exc:
            log.info("NRI socket read failed", extra={"error": str(exc)})
        finally:
            self.close()

    async def send(self, conn_id: int, message: bytes) -> None:
        if self.closed.is_set():
            raise ConnectionResetError("NRI connection closed")
        # One message's frames go out together, so two messages on the same
        # connection never interleave.
        async with self._write_lock:
            self._writer.write(encode_frames(conn_id, message))
            await self._writer.drain()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for conn in self._conns.values():
            conn.reader.feed_eof()
        self._writer.close()
