"""The client -> backend direction of a frames connection (connection.py).

Frames of relayed calls go to the backend in verbatim runs, their DATA under
the backend's connection window (inbound.py); the client's header blocks are
decoded only to read ``:path``, which says how the call is carried
(routes.py): relayed, hooked in place (hooked.py) or diverted to the proxy's
own grpc.aio server (divert.py); those two the proxy takes, and their DATA
(taken.py) is credited to the client by the proxy. What the client's
SETTINGS change is settings.py's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import hooked, settings, taken, withheld
from . import frame as fr
from .frame import (
    F_END_HEADERS, F_END_STREAM, F_PADDED, HEADER_LEN, T_CONTINUATION, T_DATA, T_HEADERS, T_PING, T_RST_STREAM,
    T_SETTINGS, T_WINDOW_UPDATE, WHOLE_PLAIN, ErrorCode, Flag, FrameError, FrameType,
)
from .hpackpeek import HeaderReader
from .inbound import CLIENT_GRANT
from .msgsize import DATA_LENGTH_AT, LENGTH
from .window import detached

if TYPE_CHECKING:
    from .connection import FrameConnection

log = logging.getLogger(__name__)

BACKEND_GRANT = 4 * 1024 * 1024  # extra connection window given to the backend (bounds our queue)
MAX_HEADER_BLOCK = 256 * 1024  # a longer header block (frame headers counted) is a CONTINUATION flood
MAX_BLOCK_FRAMES = 128  # so is one in more frames (empty CONTINUATIONs cost a frame header each)
MAX_HELD = 1 << 20  # what may wait for the runtime's SETTINGS (outbound.py)
CLIENT_WINDOW = fr.DEFAULT_WINDOW + CLIENT_GRANT  # the most a client may have sent and not been given back


class ClientSide:
    def __init__(self, conn: FrameConnection) -> None:
        self.conn = conn
        self.preface = b""  # the client's preface, while incomplete
        self.carry = fr.Carry()  # an incomplete frame, completed from the next read
        self.block: list = []  # an open header block: [stream_id, raw frames, fragments, end_stream, bytes so far]
        self.prefaced = False
        self.granted = False  # the backend's extra window (BACKEND_GRANT) was given
        self.initial_window = fr.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        # The latest stream the client opened, refused ones too: those above are
        # idle. (Not the GOAWAY's last stream id, which stays put once one went.)
        self.opened = 0
        self.skipped = withheld.Skipped()  # ids below ``opened`` it never opened
        self.headers = HeaderReader(MAX_HEADER_BLOCK, "")
        self.restating: withheld.Restating | None = None  # blocks reach the runtime restated

    def feed(self, chunk: bytes) -> None:
        if not self.prefaced:
            self.preface += chunk
            if len(self.preface) < len(fr.PREFACE):
                return
            if not self.preface.startswith(fr.PREFACE):
                log.info("frames: not an HTTP/2 client",
                         extra={"preface": self.preface[:16].hex(), **self.conn.identity})
                self.conn.lost()
                return
            self.prefaced = True
            self.conn.backend.write(fr.PREFACE)
            chunk, self.preface = self.preface[len(fr.PREFACE) :], b""
        out: list[bytes | memoryview] = []
        start = 0
        if self.carry.buf:
            frame, start = self.carry.complete(chunk, self.conn.backend_frames.relay)
            if frame is None:
                return
            self._frames(frame, 0, out)
            self.write_backend(out)  # the rest of the read may then go as a view of it, uncopied
        pos = self._frames(chunk, start, out)
        if pos < len(chunk):
            self.carry.keep(memoryview(chunk)[pos:])
        self.write_backend(out)
        self.conn.out.flush()
        if self.conn.out.held > MAX_HELD:
            # The runtime has not spoken (a backlog it never accepts), and this
            # client's answers (PINGs, say) pile up for it.
            raise FrameError(ErrorCode.ENHANCE_YOUR_CALM, "too much to answer before the runtime's SETTINGS")

    def _frames(self, buf: bytes, pos: int, out: list[bytes | memoryview]) -> int:
        """Handle the whole frames of ``buf`` from ``pos``, adding what goes to
        the backend to ``out``; where the first incomplete one begins."""
        view = memoryview(buf)  # verbatim runs are views of what was read: written without a copy
        block = self.block
        conn = self.conn
        inbound, relayed, diverted = conn.inbound, conn.relayed, conn.diverted
        sizes_in = conn.sizes_in
        limit = sizes_in.limit
        max_frame = conn.backend_frames.relay
        end = len(buf)
        run = pos
        # Frames that pass verbatim (a relayed stream's DATA, a WINDOW_UPDATE
        # of any stream but a diverted one, PRIORITY, unknown types) stay in
        # the run, read from their header alone; a header block in one frame
        # goes to _header_block; the others are parsed by _client_frame.
        while end - pos >= HEADER_LEN:
            hi, lo, kind, flags, sid = _FRAME_HEADER(buf, pos)
            size = (hi << 16) | lo
            if size > max_frame:
                raise fr.oversized(size, max_frame)
            nxt = pos + HEADER_LEN + size
            if nxt > end:
                break
            sid &= 0x7FFFFFFF
            if not block:
                if kind == T_DATA and sid in relayed:
                    # Read in place (feed_at): a view only if padded, or queued.
                    payload = fr.unpadded(fr.Frame(kind, flags, sid, view[pos + HEADER_LEN : nxt])) if flags & F_PADDED else None
                    if payload is not None:
                        too_long = sizes_in.tracker(sid).feed(payload)
                    elif sid not in sizes_in and size >= 5 and size - 5 == LENGTH(buf, pos + DATA_LENGTH_AT)[0] <= limit:
                        too_long = None  # one whole message (a unary request's, nearly always): as feed_at reads it
                    else:
                        too_long = sizes_in.feed_at(sid, buf, pos + HEADER_LEN, size)
                    if too_long is None and inbound.take(size):
                        conn.credit_client(size)
                        pos = nxt  # the common case: stays in the verbatim run
                        continue
                    out.append(view[run:pos])
                    if too_long is None:  # the backend's window is closed: queued, in order
                        self.write_backend(out)
                        payload = view[pos + HEADER_LEN : nxt] if payload is None else payload
                        inbound.data(sid, bytes(payload), bool(flags & F_END_STREAM), credit=size)
                        if inbound.owed > CLIENT_WINDOW:  # RFC 9113 6.9.1: what bounds this queue
                            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, "DATA past the connection window")
                        if flags & F_PADDED and not flags & F_END_STREAM:
                            # Queued without its padding, whose stream window
                            # (end to end) the runtime never gives back.
                            conn.out.control(fr.window_update(sid, size - len(payload)))
                    else:
                        self.refuse_size(fr.Frame(kind, flags, sid, view[pos + HEADER_LEN : nxt]), too_long, out)
                    run = pos = nxt
                    continue
                if kind == T_HEADERS and flags & WHOLE_PLAIN == F_END_HEADERS:  # nearly every request's
                    if run < pos:  # (no empty view: a read's first frame, mostly)
                        out.append(view[run:pos])
                    if not sid & 1 or sid <= self.opened:  # (a new odd id passes: no call)
                        self._new_stream(sid, bool(flags & F_END_STREAM))
                    self._header_block(sid, [buf[pos:nxt]], buf[pos + HEADER_LEN : nxt],
                                       bool(flags & F_END_STREAM), out)
                    run = pos = nxt
                    continue
                if (kind == T_WINDOW_UPDATE and size == 4 and sid not in diverted
                        and (increment := _INCREMENT(buf, pos + HEADER_LEN)[0] & 0x7FFFFFFF)):
                    if sid:
                        # A stream's window is end to end (the proxy answers only
                        # diverted calls): so for one that ended, whose updates a
                        # gRPC client sends as it reads the answer, after the end.
                        pos = nxt
                        continue
                    if run < pos:
                        out.append(view[run:pos])  # the response direction's connection window is ours (outbound.py)
                    conn.out.grow(increment)
                    run = pos = nxt
                    continue
                if kind not in _CLIENT_SPECIAL:
                    pos = nxt
                    continue
            if run < pos:
                out.append(view[run:pos])
            self._client_frame(fr.Frame(kind, flags, sid, view[pos + HEADER_LEN : nxt]), buf[pos:nxt], out, block)
            if kind == T_SETTINGS:  # an ACK may have put a new frame size in force
                max_frame = conn.backend_frames.relay
            run = pos = nxt
        if run < pos:
            out.append(view[run:pos])
        return pos

    def write_backend(self, out: list[bytes | memoryview]) -> None:
        data = detached(out[0]) if len(out) == 1 else b"".join(out)
        out.clear()
        if data:
            self.conn.backend.write(data)

    def ordered(self, raw: bytes, out: list[bytes | memoryview]) -> None:
        """A frame that must follow DATA some of which may be queued (inbound.py):
        a RST_STREAM, a SETTINGS ACK, and every header block for the backend,
        trailers (after their stream's DATA) or not (its HPACK decoder reads
        the blocks in the order the client's encoder made them: none may
        overtake one queued). _header_block starts a relayed call with a copy
        of this inline (one call less per call): a change here is one there."""
        if self.conn.inbound.queued:
            self.write_backend(out)
            self.conn.inbound.ordered(raw)
        else:
            out.append(raw)

    def _client_frame(self, f: fr.Frame, raw: bytes, out: list[bytes | memoryview], block: list) -> None:
        sid = f.stream_id
        if block:
            if f.type != T_CONTINUATION or sid != block[0]:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
            block[1].append(raw)
            block[2].append(bytes(f.payload))
            block[4] += len(raw)
            if block[4] > MAX_HEADER_BLOCK or len(block[1]) > MAX_BLOCK_FRAMES:
                raise FrameError(ErrorCode.ENHANCE_YOUR_CALM, "header block too long")
            if f.has(Flag.END_HEADERS):
                self._header_block(block[0], block[1], b"".join(block[2]), block[3], out)
                block.clear()
            return
        if f.type == T_HEADERS:  # (a block in one plain frame is _frames')
            self._new_stream(sid, f.has(Flag.END_STREAM))
            block.extend([sid, [raw], [bytes(fr.unpadded(f))], f.has(Flag.END_STREAM), len(raw)])
            if f.has(Flag.END_HEADERS):
                self._header_block(block[0], block[1], b"".join(block[2]), block[3], out)
                block.clear()
        elif f.type == T_CONTINUATION:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        elif f.type == T_DATA:
            taken.client_data(self, f, out)
        elif f.type == T_WINDOW_UPDATE:
            increment = fr.window_increment(f)
            if increment == 0:
                if sid == 0 or sid > self.opened:
                    raise FrameError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
                self.stream_error(sid, out)  # on a stream, it ends that stream only (RFC 9113 6.9)
                return
            if sid == 0:
                self.conn.out.grow(increment)  # the response direction's window is ours
            elif sid in self.conn.diverted:
                call = self.conn.diverted[sid]
                if call.window + increment > fr.MAX_WINDOW:  # RFC 9113 6.9.1: that stream's error
                    self.stream_error(sid, out, ErrorCode.FLOW_CONTROL_ERROR)
                    return
                call.window += increment
                call.opened.set()
            else:
                out.append(raw)
        elif f.type == T_RST_STREAM:
            if sid in self.conn.ended:
                return
            dropped = self.conn.diverted.pop(sid, None)
            if dropped is not None:
                if dropped.task is not None:
                    dropped.task.cancel()
                self.conn.check_idle()
                return
            held = self.conn.hooked.get(sid)
            if held is not None:  # the backend has the stream: it ends there too
                self.conn.mark_ended(sid)
                held.answer(8, "cancelled by the client")
                held.cancel("cancelled by the client")
            self.conn.stream_done(sid, "CANCELLED")
            self.ordered(raw, out)
        elif f.type == T_SETTINGS:
            if not f.has(Flag.ACK):
                settings.from_client(self.conn, fr.settings(f.payload))
                out.append(raw)
            else:  # behind DATA queued for the backend's window, framed under the settings it acknowledges
                self.ordered(raw, out)
                settings.client_acknowledged(self.conn)
            if not self.granted:  # after the client's first SETTINGS, as the preface requires
                self.granted = True
                out.append(fr.window_update(0, BACKEND_GRANT))
        elif f.type == T_PING:
            if len(f.payload) != 8 or sid != 0:
                raise FrameError(ErrorCode.FRAME_SIZE_ERROR if len(f.payload) != 8 else ErrorCode.PROTOCOL_ERROR,
                                 "malformed PING")
            if f.has(Flag.ACK):
                return  # the proxy sends the client no ping of its own, nor passes the runtime's (downstream.py)
            else:
                # Answered here, per hop: a grpc client pings as answers arrive
                # (BDP), and for diverted calls those answers are the proxy's;
                # a grpc-go runtime counts pings it sent nothing for as abuse
                # (GOAWAY too_many_pings).
                self.conn.out.control(fr.serialize(T_PING, Flag.ACK, 0, bytes(f.payload)))
        else:  # PUSH_PROMISE
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def stream_error(self, sid: int, out: list[bytes | memoryview], code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        """The client broke the protocol on one stream: it is reset
        (``code``) and ended at the runtime as if the client reset it."""
        conn = self.conn
        if sid in conn.ended or not (sid in conn.relayed or sid in conn.hooked or sid in conn.diverted):
            return  # closed already: nothing left to end
        log.info("frames: stream reset for a protocol error of the client's",
                 extra={"stream": sid, "code": code.name, **conn.identity})
        cancel = fr.rst_stream(sid, ErrorCode.CANCEL)
        self._client_frame(fr.Frame(FrameType.RST_STREAM, 0, sid, memoryview(cancel)[HEADER_LEN:]), cancel, out, [])
        conn.out.frames(fr.rst_stream(sid, code))
        conn.mark_ended(sid)

    def _new_stream(self, sid: int, end_stream: bool) -> None:
        """HEADERS on ``sid``: refused on a stream a client cannot open, or one it opened (self.opened) and
        ended, unless they are trailers (END_STREAM), which may come after the stream's end (withheld.py)."""
        if sid == 0 or sid % 2 == 0:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        conn = self.conn
        if (sid <= self.opened and not end_stream and sid not in conn.relayed and sid not in conn.diverted
                and sid not in conn.hooked):
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"stream {sid} reused")

    def _header_block(self, sid: int, raws: list[bytes], data: bytes, end_stream: bool,
                      out: list[bytes | memoryview]) -> None:
        """A complete header block: ``raws`` its frames as received, ``data`` the block."""
        # None after a peek that left the table as it was (HeaderReader.every): read below when needed.
        headers: list[tuple[bytes, bytes]] | None
        conn = self.conn
        if sid <= self.opened and (sid in conn.ended or sid not in conn.relayed):
            withheld.late_block(self, sid, data, end_stream, out)  # on a stream the runtime does not have open
            return
        if self.restating is not None:
            peeked, headers = None, self.headers.decode(data)
            raws = self.restating.restate(sid, data, headers, conn.backend_frames.send, end_stream)
        else:
            peeked = self.headers.peek(data, _PATH)
            # None: the table is as it was before the block, which may be read again.
            headers = self.headers.decode(data) if peeked is None else self.headers.every
        if sid in conn.relayed:
            self.ordered(b"".join(raws), out)
            return
        # After the proxy (shutting down) or the runtime said it goes away, or
        # over --max-concurrent-streams (advertised in the backend's SETTINGS
        # as the client sees them): refused, as grpc's server does (a gRPC
        # client retries a refused stream, on a new connection once told to go
        # away); the backend's HPACK decoder still reads the block. After a
        # GOAWAY the last stream id stays as it said: a later one (the
        # connection's end) may not name a higher one.
        told_to_go = conn.backend_lost or conn.backend_going or conn.stopping
        first_new = self.opened + 2 if self.opened else 1  # (sid is above self.opened here)
        if sid > first_new:
            self.skipped.note(first_new, sid - 2)
        self.opened = sid
        if not told_to_go:
            conn.last_stream = sid
        at_limit = len(conn.relayed) + len(conn.hooked) + len(conn.diverted) >= conn.max_streams
        if told_to_go or (at_limit and conn.at_stream_limit()):  # (a call only there: the rare case)
            if not conn.backend_lost:
                self.ordered(b"".join(fr.without_end_stream(raws)) + fr.rst_stream(sid, ErrorCode.CANCEL), out)
            conn.out.frames(fr.rst_stream(sid, ErrorCode.REFUSED_STREAM))
            conn.mark_ended(sid)
            return
        path = (peeked if peeked is not None else dict(headers or ())).get(b":path", b"").decode("latin-1")
        routes = conn.routes
        if not routes.fast(path):
            if headers is None:  # all of them, for the proxy's own call; the table is as it was
                headers = self.headers.peek_all(data) or self.headers.decode(data)
            stages = routes.hooked(path)
            if stages is not None and not hooked.compressed(headers):
                taken.start_hooked(self, sid, path, headers, stages, raws, end_stream, out)
            else:
                taken.start_diverted(self, sid, path, headers, raws, end_stream, out)
            return
        raw = raws[0] if len(raws) == 1 else b"".join(raws)
        if conn.inbound.queued:  # (self.ordered, inline: once per call; a header block must go through it)
            self.write_backend(out)
            conn.inbound.ordered(raw)
        else:
            out.append(raw)
        conn.relayed.add(sid)
        conn.start_timing(sid, path)  # (its message size trackers come as needed: msgsize.StreamSizes)
        if routes.unary(path):
            conn.unary_open.add(sid)
            conn.busy()

    def refuse_size(self, f: fr.Frame, length: int, out: list[bytes | memoryview]) -> None:
        """A request message over the limit: the call ends RESOURCE_EXHAUSTED, its DATA dropped."""
        message = f"Received message larger than max ({length} vs. {self.conn.max_message})"
        log.info("call refused", extra={"code": "RESOURCE_EXHAUSTED", "error": message, "stream": f.stream_id,
                                        **self.conn.identity})
        self.ordered(self.conn.end_locally(f.stream_id, 8, message), out)
        self.conn.credit_client(len(f.payload))  # dropped, never seen by the backend


_PATH = frozenset({b":path"})
_FRAME_HEADER = fr.HEADER.unpack_from
_INCREMENT = fr.INCREMENT.unpack_from
_CLIENT_SPECIAL = frozenset({
    FrameType.HEADERS, FrameType.DATA, FrameType.WINDOW_UPDATE, FrameType.RST_STREAM,
    FrameType.SETTINGS, FrameType.CONTINUATION, FrameType.PUSH_PROMISE, FrameType.PING,
})
