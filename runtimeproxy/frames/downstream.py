"""The backend -> client direction of a frames connection (connection.py).

Backend frames go to the client through the connection's window queue
(outbound.py), DATA under the client's connection window, header blocks whole;
frames for streams the backend no longer has (diverted or ended by the
proxy) are dropped, their window given back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import frame as fr
from .frame import ErrorCode, Flag, FrameError, FrameType, Setting

if TYPE_CHECKING:
    from .connection import FrameConnection

log = logging.getLogger(__name__)


class BackendSide:
    def __init__(self, conn: FrameConnection) -> None:
        self.conn = conn
        self.buf = b""  # an incomplete frame carried to the next read
        self.block: list[bytes] = []  # an open header block, sent once complete
        self.block_sid = 0
        self.block_ends = False

    def feed(self, chunk: bytes) -> None:
        conn = self.conn
        out = conn.out
        buf = self.buf + chunk if self.buf else chunk
        block = self.block
        pos = 0
        while True:
            f, nxt = fr.parse(buf, pos, conn.client_max_frame)
            if f is None:
                break
            raw = buf[pos:nxt]
            pos = nxt
            sid = f.stream_id
            t = f.type
            if t == FrameType.DATA:
                if sid in conn.diverted or sid in conn.ended:
                    conn.credit_backend(len(f.payload))
                    continue
                sizes = conn.sizes_out.get(sid)
                if sizes is not None:
                    too_long = sizes.feed(fr.unpadded(f) if f.has(Flag.PADDED) else f.payload)
                    if too_long is not None:
                        message = f"Received message larger than max ({too_long} vs. {conn.max_response})"
                        log.info("call failed", extra={"code": "RESOURCE_EXHAUSTED", "error": message})
                        conn.backend.write(conn.end_locally(sid, 8, message))
                        conn.credit_backend(len(f.payload))
                        continue
                end = f.has(Flag.END_STREAM)
                if f.has(Flag.PADDED):
                    out.data(sid, bytes(fr.unpadded(f)), end, credit=len(f.payload))
                else:
                    out.data(sid, f.payload, end, credit=len(f.payload), raw=raw)
                if end:
                    conn.stream_done(sid)
            elif t in (FrameType.HEADERS, FrameType.CONTINUATION):
                if sid in conn.diverted:
                    # Dropping it would desync the client's HPACK table.
                    raise FrameError(ErrorCode.INTERNAL_ERROR, f"backend answered diverted stream {sid}")
                if t == FrameType.HEADERS:
                    block[:] = [raw]
                    self.block_sid = sid
                    self.block_ends = f.has(Flag.END_STREAM)
                    if sid in conn.relayed:
                        conn.responded.add(sid)
                else:
                    block.append(raw)
                if f.has(Flag.END_HEADERS):
                    out.frames(b"".join(block))
                    block.clear()
                    if self.block_ends:
                        conn.stream_done(self.block_sid)
            elif sid in conn.diverted or sid in conn.ended:
                # RST_STREAM/WINDOW_UPDATE for a stream the backend no longer has. (Its
                # header blocks, above, still go out: the client decodes and drops them.)
                continue
            else:
                if t == FrameType.SETTINGS and not f.has(Flag.ACK):
                    values = fr.settings(f.payload)
                    if Setting.MAX_FRAME_SIZE in values:
                        conn.backend_max_frame = values[Setting.MAX_FRAME_SIZE]
                    if Setting.HEADER_TABLE_SIZE in values:  # the client's encoder may use that much
                        conn.decoder.max_allowed_table_size = values[Setting.HEADER_TABLE_SIZE]
                elif t == FrameType.RST_STREAM:
                    conn.stream_done(sid)
                    out.frames(raw)  # after the stream's queued DATA
                    continue
                out.control(raw)
        self.buf = buf[pos:]
        out.flush()
