"""One client connection of the frames transport: HTTP/2 as a gRPC server of unary calls.

HTTP/2 (RFC 9113), each rule per hop as a peer expects it:

- SETTINGS are acknowledged and the peer's followed (settings.py);
- flow control both ways: what arrives is given back in WINDOW_UPDATEs (after
  each read to each stream still sending its request, to the connection in
  batches: settings.py);
  what goes out waits for the peer's connection and stream windows, and for
  the transport's buffer (``pause_writing``; a peer that does not read is
  not read either once CONTROL_BACKLOG of answers to it waits, sending.py); a stream
  whose window is shut does not hold up the others;
- a header block is read whole, HEADERS and CONTINUATIONs, the peer's HPACK
  table followed (headers.py, which also makes the answers' blocks);
- PING is acknowledged; RST_STREAM cancels the call's handler; a peer's
  GOAWAY lets the open calls finish, then the connection closes;
- a stream error resets its stream; a connection error ends the connection
  with a GOAWAY carrying its code, and only that connection.

gRPC: one message each way (a request may be gzip or deflate), ``grpc-timeout``
(the handler is cancelled at the deadline: DEADLINE_EXCEEDED), message size
limits (RESOURCE_EXHAUSTED, a request refused as soon as it grows past the
limit), unknown methods (UNIMPLEMENTED) and the handler's own status (CallError).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import cast

import grpc
import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameError, FrameType

from .calls import CALL_DEADLINE, PREFIX, Call, CallError, Deadline, Limits, Route, one_message, within
from .headers import OK_HEADERS, OK_HEADERS_BLOCK, Block, HeaderBlocks, Read, request_head, trailers_only
from .sending import Sender
from .settings import CREDIT_BATCH, MAX_STREAMS, PeerSettings, announcement, grown

log = logging.getLogger(__name__)


CLOSED_MEMORY = 1024  # closed streams whose late frames are still known as such
# Read for every frame: an IntEnum class's attribute is a slow lookup (EnumType has a __getattr__), an int's is not.
_DATA, _HEADERS, _CONTINUATION = fr.T_DATA, fr.T_HEADERS, int(FrameType.CONTINUATION)
_PADDED, _END_STREAM = Flag.PADDED, Flag.END_STREAM  # read for every DATA frame: globals, not Flag's attributes


class Connection(asyncio.Protocol):
    def __init__(self, routes: Mapping[bytes, Route], limits: Limits, closed: Callable[[Connection], None]) -> None:
        self._routes = routes
        self._limits = limits
        self._closed = closed
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface = False
        self._blocks = HeaderBlocks()
        self._encoder = hpack.Encoder()
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._unacked = 0  # DATA bytes read and not yet given back, connection
        self._stream_unacked: dict[int, int] = {}  # the same per stream, within one read
        self._peer = PeerSettings()
        self._send = Sender(self._peer, self._encoder, self._calls.__contains__, self._close_stream)
        self._out = self._send.out  # frames queued this turn (sending.py writes them)
        self._going_away = False  # GOAWAY sent or received: no new calls, close once idle
        self._told: str | None = None  # "go away" or "abort", asked before connection_made
        self._made = False  # connection_made has run
        # Streams opened and since closed or reset: their late frames (request
        # trailers, say) are read for HPACK and dropped (section 5.1). A lower
        # stream id never opened is the peer's error.
        self._closed_streams: deque[int] = deque(maxlen=CLOSED_MEMORY)

    # -- asyncio.Protocol ----------------------------------------------------------

    @property
    def made(self) -> bool:
        """connection_made has run (its transport may be gone since)."""
        return self._made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._made = True
        self._transport = self._send.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.write(announcement())
        # The server may have stopped between making this protocol and the loop connecting it.
        if self._told == "abort":
            self._transport.abort()
        elif self._told == "go away":
            self.go_away()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            self._parse()
        except FrameError as exc:  # a bad header block too (COMPRESSION_ERROR, hpackpeek.HeaderReader)
            self._fail(exc.code, str(exc))
            return
        if self._unacked >= CREDIT_BATCH:  # not per read: a small call's answer then goes alone, one write
            self._out.append(fr.window_update(0, self._unacked))
            self._unacked = 0
        for sid, count in self._stream_unacked.items():
            call = self._calls.get(sid)
            if call is not None and call.receiving:
                self._out.append(fr.window_update(sid, count))
        self._stream_unacked.clear()
        self._pump()

    def pause_writing(self) -> None:
        self._send.pause()

    def resume_writing(self) -> None:
        self._send.resume()
        self._close_if_done()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = self._send.transport = None
        for call in self._calls.values():
            if call.task is not None:
                call.task.cancel()  # nobody is left to answer
        self._calls.clear()
        self._send.clear()
        self._closed(self)

    # -- the server's controls -------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self._calls

    def go_away(self) -> None:
        """Shutdown: refuse new calls, finish the open ones, then close."""
        if self._transport is None:
            self._told = self._told or "go away"
            return
        if self._going_away:
            return
        self._going_away = True
        self._out.append(fr.goaway(self._last_stream, ErrorCode.NO_ERROR, b"server stopping"))
        self._pump()

    def abort(self) -> None:
        """The grace is over: cancel the open calls and close, unsent data or not."""
        if self._transport is None:
            self._told = "abort"
        else:
            self._transport.abort()

    # -- reading -------------------------------------------------------------------

    def _parse(self) -> None:
        if not self._preface:
            if len(self._buf) < len(fr.PREFACE):
                if not fr.PREFACE.startswith(bytes(self._buf)):
                    raise FrameError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if bytes(self._buf[: len(fr.PREFACE)]) != fr.PREFACE:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            del self._buf[: len(fr.PREFACE)]
            self._preface = True
        pos = 0
        while self._transport is not None and pos < len(self._buf):  # (a read ends with a whole frame, nearly always)
            frame, end = fr.parse(self._buf, pos, fr.DEFAULT_MAX_FRAME)
            if frame is None:
                break
            self._on_frame(frame)
            pos = end
        frame = None  # its payload is a view of the buffer, which cannot shrink while it lives
        del self._buf[:pos]

    def _on_frame(self, frame: fr.Frame) -> None:
        kind, sid = frame.type, frame.stream_id
        if self._blocks.open and kind != _CONTINUATION:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
        if kind == _DATA:
            self._data(frame)
        elif kind == _HEADERS:
            self._header_block(self._blocks.headers(frame))
        elif kind == _CONTINUATION:
            self._header_block(self._blocks.continuation(frame))
        elif kind == FrameType.SETTINGS:
            if sid != 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS on stream {sid}")
            if not frame.has(Flag.ACK):
                self._settings(fr.settings(frame.payload))
                self._out.append(fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))
            elif frame.payload:
                raise FrameError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(sid, fr.window_increment(frame))
        elif kind == FrameType.PING:
            if len(frame.payload) != 8 or sid != 0:
                raise FrameError(ErrorCode.FRAME_SIZE_ERROR if sid == 0 else ErrorCode.PROTOCOL_ERROR, "bad PING")
            if not frame.has(Flag.ACK):
                self._out.append(fr.serialize(FrameType.PING, Flag.ACK, 0, bytes(frame.payload)))
        elif kind == FrameType.RST_STREAM:
            if len(frame.payload) != 4:
                raise FrameError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM length not 4")
            self._idle_is_an_error(sid, "RST_STREAM")
            self._drop(sid)
        elif kind == FrameType.GOAWAY:
            if sid != 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"GOAWAY on stream {sid}")
            self._going_away = True  # no new calls come; the open ones finish
        elif kind == FrameType.PUSH_PROMISE:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif kind == FrameType.PRIORITY:
            if sid == 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(frame.payload) != 5 and (call := self._calls.get(sid)) is not None:
                self._reset(call, ErrorCode.FRAME_SIZE_ERROR)  # a stream error (section 6.3)
        # PRIORITY and unknown frame types carry nothing a unary call needs (section 5.5).

    def _idle_is_an_error(self, sid: int, what: str) -> None:
        # Even ids are the server's, and it opens none (no push): all idle.
        if sid == 0 or sid > self._last_stream or sid % 2 == 0:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"{what} on stream {sid}, never opened")

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            if increment == 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self._send.window = grown(self._send.window, increment)
            return
        self._idle_is_an_error(sid, "WINDOW_UPDATE")
        call = self._calls.get(sid)
        if call is None:
            return  # a closed stream: the peer may not know yet
        if increment == 0:  # stream errors (section 6.9): the other calls go on
            self._reset(call, ErrorCode.PROTOCOL_ERROR)
        elif call.window + increment > fr.MAX_WINDOW:
            self._reset(call, ErrorCode.FLOW_CONTROL_ERROR)
        else:
            call.window += increment

    def _data(self, frame: fr.Frame) -> None:
        sid = frame.stream_id
        self._unacked += len(frame.payload)  # padding included: it counts against the window
        call = self._calls.get(sid)
        if call is None:
            self._idle_is_an_error(sid, "DATA")
            return  # a stream this side answered or reset: the peer may not know yet
        if not call.receiving:  # its request has ended (section 5.1, half-closed remote)
            self._reset(call, ErrorCode.STREAM_CLOSED)
            return
        call.body += fr.unpadded(frame) if frame.flags & _PADDED else frame.payload  # (not a view's view)
        if len(call.body) > self._limits.max_receive + PREFIX.size:
            # Answered at once; _close_stream asks the client to stop sending (section 8.1).
            self._end(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"request larger than the hook server's limit of {self._limits.max_receive} bytes")
            return
        if frame.flags & _END_STREAM:
            self._complete(call)
        elif frame.payload:
            self._stream_unacked[sid] = self._stream_unacked.get(sid, 0) + len(frame.payload)

    def _header_block(self, block: Block | None) -> None:
        if block is None:
            return  # CONTINUATIONs to come
        sid, read, end_stream = block
        call = self._calls.get(sid)
        if call is not None:  # a second block: the request's trailers
            if not (call.receiving and end_stream):
                self._reset(call, ErrorCode.PROTOCOL_ERROR)
            else:
                self._complete(call)
            return
        if sid <= self._last_stream and sid in self._closed_streams:  # never scanned for a new stream
            return
        if sid % 2 == 0 or sid <= self._last_stream:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}, not a new client stream")
        self._last_stream = sid
        if self._going_away or len(self._calls) >= MAX_STREAMS:
            self._out.append(fr.rst_stream(sid, ErrorCode.REFUSED_STREAM))  # the client may retry it elsewhere
            self._closed_streams.append(sid)
            return
        self._open(sid, read, end_stream)

    def _open(self, sid: int, read: Read, end_stream: bool) -> None:
        head = read.head
        if head is None:  # a block read for the first time (or one headers.py does not remember)
            head = read.head = request_head(read.headers, self._routes)
        route, timeout, encoding, status = head
        call = Call(sid, route, timeout, self._peer.initial_window, receiving=not end_stream, encoding=encoding)
        self._calls[sid] = call
        if status is not None:  # not a gRPC call: an HTTP answer
            self._out.extend(fr.header_frames(sid, self._encoder.encode([(b":status", status)]),
                                              self._peer.max_frame, True))
            self._close_stream(call)
            return
        if end_stream:
            self._complete(call)  # no message: refused there

    def _settings(self, values: dict[int, int]) -> None:
        delta = self._peer.apply(values, self._encoder)
        if delta:
            for call in self._calls.values():
                call.window = grown(call.window, delta)

    # -- calls ---------------------------------------------------------------------

    def _complete(self, call: Call) -> None:
        """The request has ended: run its route."""
        call.receiving = False
        body = call.body
        call.body = bytearray()
        if call.route is None:
            self._end(call, grpc.StatusCode.UNIMPLEMENTED, "unknown hook method")
            return
        message = one_message(body, call.encoding, self._limits.max_receive)
        if isinstance(message, CallError):
            self._end(call, message.code, message.details)
        else:
            self._dispatch(call, message)

    def _dispatch(self, call: Call, request: bytes) -> None:
        """Run the call's route on its request message; its answer goes when it is done."""
        call.task = asyncio.get_running_loop().create_task(self._run(call, request))

    async def _run(self, call: Call, request: bytes) -> None:
        assert call.route is not None
        # In this task (wait_for would start another), which _dispatch has set as call.task before it runs.
        deadline = None if call.timeout is None else Deadline(call.timeout, call.task)
        CALL_DEADLINE.set(deadline)  # this task's context only
        try:
            response = await within(deadline, call.route(request))  # a cancel not the deadline's: nobody to answer
        except CallError as err:
            self._end(call, err.code, err.details)
        except TimeoutError:  # the deadline's, or a route's own: answered as under asyncio.timeout
            self._end(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except Exception as exc:  # a route's own bug: its call fails, the server lives on
            log.exception("hook call failed", extra={"stream": call.sid})
            self._end(call, grpc.StatusCode.INTERNAL, f"hook server error: {exc}")
        else:
            self._reply(call, response)
        self._pump()

    def _reply(self, call: Call, response: bytes) -> None:
        if call.sid not in self._calls:
            return  # reset meanwhile
        if len(response) > self._limits.max_send:
            self._end(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"response of {len(response)} bytes over the hook server's limit of {self._limits.max_send}")
            return
        self._send.headers(call.sid, OK_HEADERS, OK_HEADERS_BLOCK, False)
        self._send.answer(call, PREFIX.pack(0, len(response)) + response)

    def _end(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        """A trailers-only answer: the call ends without a message."""
        if call.sid not in self._calls:
            return
        block = self._encoder.encode(trailers_only(code, details))
        self._out.extend(fr.header_frames(call.sid, block, self._peer.max_frame, True))
        self._close_stream(call)

    def _close_stream(self, call: Call) -> None:
        """This side's END_STREAM is queued: the stream is over for the server."""
        if call.receiving:  # answered before the request ended: it is reset, nothing more is read
            call.receiving = False
            self._out.append(fr.rst_stream(call.sid, ErrorCode.NO_ERROR))
        self._calls.pop(call.sid, None)
        self._closed_streams.append(call.sid)

    def _reset(self, call: Call, code: ErrorCode) -> None:
        self._out.append(fr.rst_stream(call.sid, code))
        self._drop(call.sid)

    def _drop(self, sid: int) -> None:
        call = self._calls.pop(sid, None)
        if call is None:
            return
        self._closed_streams.append(sid)
        if call.task is not None:
            call.task.cancel()
        self._send.forget(call)

    # -- writing -------------------------------------------------------------------

    def _pump(self) -> None:
        self._send.pump()
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self._going_away and not self._calls and self._transport is not None:
            self._transport.close()

    def _fail(self, code: ErrorCode, message: str) -> None:
        log.warning("hook client connection closed on a protocol error", extra={"code": code.name, "error": message})
        if self._transport is not None:
            self._transport.write(fr.goaway(self._last_stream, code, message.encode()[:256]))
            self._transport.close()
