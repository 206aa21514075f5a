"""The backend -> client direction of a frames connection (connection.py).

Backend frames go to the client through the connection's window queue
(outbound.py), DATA under the client's connection window, header blocks whole;
frames for streams the backend no longer has (diverted or ended by the
proxy) are dropped, their window given back. Every header block is decoded
(HPACK is one state per direction) so that a hooked call's status is known;
its DATA is teed for the stages and its answer held, from its first block,
until they are done (hooked.py). A relayed call's blocks are read only after
the frames read with them were written (``_settle``). The backend's
connection window updates are the proxy's own (inbound.py), and so are those
of hooked streams.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from ..cripath.unready import FAILED_STATUSES
from . import frame as fr
from . import settings
from .frame import (
    F_END_HEADERS, F_END_STREAM, F_PADDED, HEADER_LEN, T_CONTINUATION, T_DATA, T_GOAWAY, T_HEADERS, T_PING,
    T_RST_STREAM, T_SETTINGS, T_WINDOW_UPDATE, WHOLE_PLAIN, ErrorCode, Flag, FrameError,
)
from .hooked import RESET, grpc_status, status_name
from .hpackpeek import HeaderReader
from .msgsize import DATA_LENGTH_AT, LENGTH

_STATUS = frozenset({b"grpc-status", b"grpc-message"})
GATE_LIMIT_S = 1.0  # how long a hooked call's answer waits for its stages, at most
# The runtime's header blocks are bounded as its HPACK decoder bounds their
# headers (the client's own limit, 16 MiB), and in frames, so that a runtime
# gone wrong (an endless CONTINUATION run) costs bounded memory.
MAX_RUNTIME_BLOCK = (1 << 24) + 64 * 1024
MAX_RUNTIME_BLOCK_FRAMES = 4096
NEVER_OPENED = 2  # a stream id only a server could open: never a gRPC call's (see _stray)
_FRAME_HEADER = fr.HEADER.unpack_from

# How a gRPC client reports a stream the server reset (the code it counts as).
_RESET_AS: dict[int, str] = {ErrorCode.CANCEL: "CANCELLED", ErrorCode.REFUSED_STREAM: "UNAVAILABLE"}

if TYPE_CHECKING:
    from .connection import FrameConnection

log = logging.getLogger(__name__)


class BackendSide:
    def __init__(self, conn: FrameConnection) -> None:
        self.conn = conn
        self.carry = fr.Carry()  # an incomplete frame, completed from the next read
        self.block: list[bytes | memoryview] = []  # an open header block, sent once complete
        self.fragments: list[bytes] = []  # its header block fragments
        self.block_sid = 0
        self.block_ends = False
        self.block_bytes = 0  # frame headers included
        self.headers = HeaderReader(1 << 24, " from the backend")  # the list's size: the client's limit to enforce
        self.preface_sent = False  # its first SETTINGS, the client's server preface, went (settings.py)
        # Header blocks of relayed calls, passed on but not read yet: read
        # once this read's frames are written (see _settle).
        self._unread: list[tuple[int, bytes, bool]] = []

    def feed(self, chunk: bytes) -> None:
        start = 0
        try:
            if self.carry.buf:
                frame, start = self.carry.complete(chunk, self.conn.client_frames.relay)
                if frame is None:
                    return
                self._frames(frame, 0)
            pos = self._frames(chunk, start)
        except FrameError:
            # The answers read before the bad frame still go out (with the
            # GOAWAY, connection.py): their calls ended as they were read.
            with contextlib.suppress(FrameError):
                self._settle()
            raise
        if pos < len(chunk):
            self.carry.keep(memoryview(chunk)[pos:])
        self.conn.out.flush()
        self._settle()

    def _frames(self, buf: bytes, pos: int) -> int:
        """Handle the whole frames of ``buf`` from ``pos``; where the first incomplete one begins.

        A relayed call's DATA and single-frame header blocks pass in verbatim
        runs, written as one view of the read (nearly everything a runtime
        sends); every other frame goes through ``_frame``."""
        conn = self.conn
        out = conn.out
        relayed, sizes_out = conn.relayed, conn.sizes_out
        limit = sizes_out.limit
        block = self.block  # (changed in place)
        view = memoryview(buf)
        max_frame = conn.client_frames.relay
        end_buf = len(buf)
        run = pos
        while end_buf - pos >= HEADER_LEN:
            hi, lo, t, flags, sid = _FRAME_HEADER(buf, pos)
            size = (hi << 16) | lo
            if size > max_frame:
                raise fr.oversized(size, max_frame)
            nxt = pos + HEADER_LEN + size
            if nxt > end_buf:
                break
            sid &= 0x7FFFFFFF
            if sid in relayed and not block:  # never hooked or diverted too (upstream._header_block)
                if t == T_DATA and not flags & F_PADDED:
                    sizes = sizes_out.get(sid)
                    if sizes is not None and sizes.remaining >= size:  # within one message's body
                        sizes.remaining -= size
                        too_long = None
                    elif sizes is None and size >= 5 and size - 5 == LENGTH(buf, pos + DATA_LENGTH_AT)[0] <= limit:
                        too_long = None  # one whole message (a unary answer's, nearly always): as feed_at reads it
                    else:
                        too_long = sizes_out.feed_at(sid, buf, pos + HEADER_LEN, size)
                    if too_long is None and out.take(size):
                        pos = nxt
                        if flags & F_END_STREAM:
                            conn.stream_done(sid, "UNKNOWN")  # a gRPC answer ends with trailers
                        continue
                    if run < pos:
                        out.frames(view[run:pos])
                    if too_long is None:  # the client's window is closed: queued, in order
                        out.data(sid, view[pos + HEADER_LEN : nxt], bool(flags & F_END_STREAM), credit=size)
                        if flags & F_END_STREAM:
                            conn.stream_done(sid, "UNKNOWN")
                    else:
                        self._too_long(sid, too_long, size)
                    run = pos = nxt
                    continue
                if t == T_HEADERS and flags & WHOLE_PLAIN == F_END_HEADERS and out.flowing:
                    # A relayed answer's block in one frame (nearly all of them): passed
                    # on as it came; what it says (the status) is read once this read's
                    # frames are written (_settle), off the answer's path.
                    conn.responded.add(sid)
                    self._unread.append((sid, buf[pos + HEADER_LEN : nxt], bool(flags & F_END_STREAM)))
                    pos = nxt
                    continue
            if run < pos:
                out.frames(view[run:pos])
            self._frame(t, flags, sid, view[pos:nxt], view[pos + HEADER_LEN : nxt])
            if t == T_SETTINGS:  # an ACK may have put a new frame size in force
                max_frame = conn.client_frames.relay
            run = pos = nxt
        if run < pos:
            out.frames(view[run:pos])
        return pos

    def _too_long(self, sid: int, length: int, size: int) -> None:
        conn = self.conn
        message = f"Received message larger than max ({length} vs. {conn.max_response})"
        log.info("call failed", extra={"code": "RESOURCE_EXHAUSTED", "error": message, "stream": sid, **conn.identity})
        conn.inbound.ordered(conn.end_locally(sid, 8, message))
        conn.credit_backend(size)

    def _frame(self, t: int, flags: int, sid: int, raw: memoryview, payload: memoryview | bytes) -> None:
        """One frame that is not part of a verbatim run."""
        conn = self.conn
        out = conn.out
        block = self.block
        size = len(payload)
        if block and t != T_CONTINUATION:  # RFC 9113 6.10: only its CONTINUATIONs may follow
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "header block from the backend interrupted")
        if t == T_DATA:
            if sid in conn.diverted or sid in conn.ended:
                conn.credit_backend(size)
                return
            body = fr.unpadded(fr.Frame(t, flags, sid, payload)) if flags & Flag.PADDED else payload
            sizes = conn.sizes_out.tracker(sid) if sid in conn.relayed else conn.sizes_out.get(sid)  # (msgsize.py)
            if sizes is not None:
                too_long = sizes.feed(body)
                if too_long is not None:
                    self._too_long(sid, too_long, size)
                    return
            end = bool(flags & Flag.END_STREAM)
            call = conn.hooked.get(sid)
            if call is not None:
                call.reply += body
                if end:
                    call.runtime_ended(2, "the runtime ended the call without a status")
            if flags & Flag.PADDED:
                out.data(sid, bytes(body), end, credit=size)
                if not end:
                    # Padding costs stream window, which is end to end: the
                    # client never sees this, so never gives it back.
                    conn.backend.write(fr.window_update(sid, size - len(body)))
            else:
                out.data(sid, payload, end, credit=size, raw=raw)
            if call is not None and call.gate is not None and not call.gate.is_open:
                call.held += size
                call.release_if_stalled(conn.client_side.initial_window)
            if end:
                conn.stream_done(sid, "UNKNOWN")  # a gRPC answer ends with trailers
        elif t in (T_HEADERS, T_CONTINUATION):
            if t == T_HEADERS:
                if (flags & WHOLE_PLAIN == F_END_HEADERS and not block and sid in conn.relayed
                        and sid not in conn.hooked):
                    # As in _frames' run, behind the DATA queued for the client's window.
                    conn.responded.add(sid)
                    out.frames(raw)
                    self._unread.append((sid, bytes(payload), bool(flags & Flag.END_STREAM)))
                    return
                block[:] = [raw]
                self.block_bytes = len(raw)
                if flags & (Flag.PADDED | Flag.PRIORITY):
                    payload = fr.unpadded(fr.Frame(t, flags, sid, payload))
                self.fragments[:] = [bytes(payload)]
                self.block_sid = sid
                self.block_ends = bool(flags & Flag.END_STREAM)
            else:
                if not block or sid != self.block_sid:
                    raise FrameError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION outside a header block")
                block.append(raw)
                self.fragments.append(bytes(payload))
                self.block_bytes += len(raw)
                if self.block_bytes > MAX_RUNTIME_BLOCK or len(block) > MAX_RUNTIME_BLOCK_FRAMES:
                    raise FrameError(ErrorCode.ENHANCE_YOUR_CALM,
                                     f"header block from the backend over {len(block)} frames, {self.block_bytes} bytes")
            if flags & Flag.END_HEADERS:
                self._header_block()
        elif sid in conn.diverted or sid in conn.ended:
            # RST_STREAM/WINDOW_UPDATE for a stream the backend no longer has. (Its
            # header blocks, above, still go out: the client decodes and drops them.)
            return
        else:
            if t == T_RST_STREAM or t == T_GOAWAY or t == T_SETTINGS:
                # What they end must be up to date, and the blocks before a
                # SETTINGS ACK read under the table size it ends. Not so for a
                # PING or a WINDOW_UPDATE read with an answer: its blocks are
                # read after the answer went (feed), off its path.
                self._settle()
            f = fr.Frame(t, flags, sid, payload)
            if t == T_SETTINGS:
                if f.has(Flag.ACK):
                    # Behind the DATA queued for the client's window: that DATA
                    # was framed under the settings this acknowledges (a client
                    # lowering its MAX_FRAME_SIZE takes larger frames until then).
                    out.frames(raw)
                    settings.backend_acknowledged(conn)
                else:
                    settings.from_backend(conn, fr.settings(f.payload), raw)
                return
            if t == T_WINDOW_UPDATE:
                if self._window_update(sid, fr.window_increment(f)):
                    return
            elif t == T_GOAWAY:
                if len(f.payload) < 8:
                    raise FrameError(ErrorCode.FRAME_SIZE_ERROR, "short GOAWAY from the backend")
                conn.backend_goaway(int.from_bytes(f.payload[:4], "big") & 0x7FFFFFFF,
                                    int.from_bytes(f.payload[4:8], "big"), f.payload[8:])
                return
            elif t == T_PING:
                if len(f.payload) != 8 or sid != 0:
                    raise FrameError(ErrorCode.PROTOCOL_ERROR, "malformed PING from the backend")
                if not flags & Flag.ACK:
                    # Answered here, per hop, as the client's are (upstream.py): the
                    # runtime pings as requests arrive (grpc-go's BDP estimate), and what
                    # it sizes is its connection to the proxy, whose windows the proxy
                    # owns (inbound.py). Relayed, each call cost a client a ping to
                    # answer ahead of its answer, and the proxy two more frames to pass.
                    # Answered a little later (pings.py): one ping per delay, not per call.
                    conn.backend_pings.ping(bytes(f.payload))
                return  # an ACK: the proxy sends the runtime no ping, nor does any client reach it
            elif t == T_RST_STREAM:
                call = conn.hooked.get(sid)
                if call is not None:
                    call.runtime_ended(RESET, "reset by the runtime")
                conn.stream_done(sid, _RESET_AS.get(int.from_bytes(f.payload[:4], "big"), "INTERNAL"))
                out.frames(raw)  # after the stream's queued DATA
                return
            out.control(raw)

    def _header_block(self) -> None:
        conn, sid = self.conn, self.block_sid
        data = b"".join(self.fragments)
        raw = b"".join(self.block)
        self.block.clear()
        if sid in conn.relayed and sid not in conn.hooked:
            # A relayed call's block goes out as it came, with this read's
            # other frames; what it says (the status) is read after they are
            # written, off the answer's path.
            conn.responded.add(sid)  # (only now: an end of the proxy's before it carries :status)
            conn.out.frames(raw)
            self._unread.append((sid, data, self.block_ends))
            return
        self._settle()  # HPACK: blocks are read in the order they came
        headers = self._read(data)
        if sid in conn.diverted or sid in conn.ended:
            # (ended by the proxy before its block was complete: the client has its end)
            self._stray(sid, data)
            return
        if sid in conn.hooked:
            conn.responded.add(sid)
        call = conn.hooked.get(sid)
        held = call is not None and not call.finished and sid not in conn.ended
        if held and call is not None and call.gate is None:  # (call is not None: held says so)
            # A hooked call's answer, from its first block, is released once
            # the stages are done (hooked.py): the client gets it whole, in one
            # write. The gate holds every answer behind it on this connection
            # (HPACK order): a stage slow to record (a runtime read-back) holds
            # them GATE_LIMIT_S at most.
            call.gate = conn.out.gate(raw, GATE_LIMIT_S, call.wants_data)
        else:
            conn.out.frames(raw)  # behind the gate, if its call has one
        if not self.block_ends:
            return
        status, message = grpc_status(headers)
        if status in FAILED_STATUSES:  # containerd not initialised yet, maybe (Routes.runtime_failed_status)
            conn.routes.runtime_failed_status(status, message)
        if held and call is not None:
            call.runtime_ended(status, message)
        conn.stream_done(sid, status_name(status))

    def _read(self, data: bytes) -> dict[bytes, bytes]:
        headers = self.headers.peek(data, _STATUS)
        return dict(self.headers.decode(data)) if headers is None else headers

    def _settle(self) -> None:
        """Read the relayed blocks passed on so far, in order: the HPACK
        table stays in step, and a call's status ends its stream."""
        if not self._unread:
            return
        unread, self._unread = self._unread, []
        reader = self.headers
        for sid, data, ends in unread:  # (_read inline: two blocks a call)
            headers = reader.peek(data, _STATUS)
            if headers is None:
                headers = dict(reader.decode(data))
            if ends:
                status, message = grpc_status(headers)
                if status in FAILED_STATUSES:  # containerd not initialised yet, maybe
                    self.conn.routes.runtime_failed_status(status, message)
                self.conn.stream_done(sid, status_name(status))

    def _stray(self, sid: int, block: bytes) -> None:
        """The backend answered a stream the proxy answers itself (diverted),
        before it read the stream's RST_STREAM: grpc-go answers an unknown
        method (a v1 call to a v1alpha2-only runtime) at once. Or one the
        proxy ended (shutdown, a refusal) before the block was complete.

        The client's HPACK decoder must read the block all the same (the
        backend's encoder may have indexed its headers), on a stream where it
        changes nothing, never the diverted one, which is still open: one
        already closed at the client or, before any closed, an even stream id
        that a client never opens. gRPC clients (grpc-go, C-core) decode
        header blocks on such streams and drop them."""
        conn = self.conn
        # Debug: with a v1alpha2-only runtime, any translated call may race so.
        log.debug("runtime answered a call the proxy answers or ended itself; its header block is passed on a closed stream",
                  extra={"stream": sid, "method": conn.diverted[sid].path if sid in conn.diverted else "",
                         **conn.identity})
        target = conn.closed_at_client or NEVER_OPENED
        conn.out.frames(b"".join(fr.header_frames(target, block, conn.client_frames.send, False)))

    def _window_update(self, sid: int, increment: int) -> bool:
        """True if the update is not for the client (the proxy's own, or no one's)."""
        conn = self.conn
        if increment == 0:
            if sid == 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 from the backend")
            if sid in conn.relayed or sid in conn.hooked:  # a stream error (RFC 9113 6.9): that call only
                conn.inbound.ordered(conn.end_locally(sid, 13, "runtime-proxy: the runtime broke HTTP/2 flow control",
                                                      ErrorCode.PROTOCOL_ERROR))
            return True
        if sid == 0:
            conn.inbound.grow(increment)
            return True
        if sid in conn.relayed:
            return False  # a relayed stream's window is end to end
        # A hooked call's is the proxy's (it sends the request), to its end and
        # after; once a stream is over at the runtime (answered or reset), so
        # is its call for a gRPC client, which sends nothing more on it.
        call = conn.hooked.get(sid)
        if call is not None:
            call.window += increment
            call.window_grew()
        return True
