"""The frames a hook server sends, as one connection reads them (RFC 9113).

``ServerFrames`` is the reading half of ``connection.ClientConnection``,
which holds the state both halves share and says how to write and close.
Every rule a server breaks here is a connection error (``FrameError``, a
GOAWAY from the caller) or, for one call, a stream error (RST_STREAM).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable

import grpc

from ..frames import frame as fr
from ..frames.frame import (
    T_CONTINUATION, T_PING, T_PRIORITY, T_PUSH_PROMISE, T_SETTINGS, ErrorCode, Flag, FrameError, FrameType, Setting,
)
from ..frames.hpackpeek import HeaderReader
from .headers import WANTED, http_failure
from .peer import ServerLimits
from .stream import Stream, Unprocessed
from .transport import CallFailed

log = logging.getLogger(__name__)

STREAM_WINDOW = 1 << 20  # what a server may send on one call before our WINDOW_UPDATE
CONNECTION_WINDOW = 16 << 20
MAX_HEADER_BLOCK = 1 << 20  # as MAX_DECODED_HEADERS (below): a longer one ends the connection
MAX_BLOCK_FRAMES = 128  # CONTINUATIONs of one header block (an empty one adds nothing to its size)
LAST_STREAM_ID = (1 << 31) - 1
_SETTINGS_ACK = fr.serialize(FrameType.SETTINGS, Flag.ACK, 0)
_RESET_AS: dict[int, grpc.StatusCode] = {ErrorCode.ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
             ErrorCode.INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED}
# Decoded header lists are bounded here (beyond it the HPACK state cannot be
# trusted: the connection ends); over MAX_HEADER_LIST, what we advertise,
# only that call fails, RESOURCE_EXHAUSTED, as in grpc.
MAX_DECODED_HEADERS = 1 << 20
MAX_HEADER_LIST = 16 << 10
PEEKED_BLOCK = 1024  # header blocks up to this long are peeked (see _header_block)


class ServerFrames:
    endpoint: str
    _streams: dict[int, Stream]
    _next_id: int
    _prefaced: bool
    _going_away: bool
    _table_update: bool
    _block: tuple[int, bool, bytearray, int] | None
    _server: ServerLimits
    _reader: HeaderReader
    _recv_window: int
    _recv_unacked: int
    _handling: dict[int, Callable[[fr.Frame], None]]  # _handlers(), built once per connection
    _write: Callable[[bytes], None]
    _control: Callable[[bytes], None]
    _wake: Callable[[], None]
    close: Callable[[], None]

    def _finished(self, stream: Stream, *, remote_closed: bool, code: ErrorCode = ErrorCode.CANCEL) -> None:
        raise NotImplementedError

    def _handlers(self) -> dict[int, Callable[[fr.Frame], None]]:
        return {
            FrameType.DATA: self._data, FrameType.HEADERS: self._headers, FrameType.CONTINUATION: self._continuation,
            FrameType.SETTINGS: self._settings, FrameType.WINDOW_UPDATE: self._window_update, FrameType.PING: self._ping,
            FrameType.RST_STREAM: self._rst_stream, FrameType.GOAWAY: self._goaway,
        }

    def _frame(self, frame: fr.Frame) -> None:
        kind = frame.type
        if self._block is not None and kind != T_CONTINUATION:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "header block interrupted by another frame")
        if not self._prefaced and kind != T_SETTINGS:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"server preface is not SETTINGS (frame type {kind})")
        handler = self._handling.get(kind)
        if handler is not None:
            handler(frame)
        elif kind == T_PUSH_PROMISE:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE, though push is disabled")
        elif kind == T_PRIORITY and frame.stream_id == 0:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        # PRIORITY otherwise, and frame types we do not know, are ignored (RFC 9113 section 4.1).

    def _ping(self, frame: fr.Frame) -> None:
        if frame.stream_id or len(frame.payload) != 8:
            raise FrameError(ErrorCode.PROTOCOL_ERROR if frame.stream_id else ErrorCode.FRAME_SIZE_ERROR, "bad PING")
        if not frame.has(Flag.ACK):
            self._control(fr.serialize(T_PING, Flag.ACK, 0, bytes(frame.payload)))

    def _server_stream(self, frame: fr.Frame) -> Stream | None:
        """The call a frame belongs to; None for a stream already closed on our side."""
        sid = frame.stream_id
        if sid == 0 or sid % 2 == 0 or sid >= self._next_id:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, f"frame type {frame.type} on stream {sid}, which we never opened")
        return self._streams.get(sid)

    def _data(self, frame: fr.Frame) -> None:
        size = len(frame.payload)  # padding included: it counts against the window
        if size > self._recv_window:
            raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= size
        self._recv_unacked += size
        if self._recv_unacked >= CONNECTION_WINDOW // 2:
            self._write(fr.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        stream = self._server_stream(frame)
        if stream is None:
            return
        if stream.headers is None:
            self._stream_error(stream, ErrorCode.PROTOCOL_ERROR, "DATA before the answer's headers")
            return
        stream.received += size
        if stream.received > STREAM_WINDOW:
            self._stream_error(stream, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream window")
            return
        end_stream = frame.flags & Flag.END_STREAM
        if not stream.take(fr.unpadded(frame)):
            self._finished(stream, remote_closed=bool(end_stream))
            return
        if end_stream:
            stream.fail(CallFailed(grpc.StatusCode.INTERNAL, "hook server ended the call without trailers"))
            self._finished(stream, remote_closed=True)
        elif stream.received >= STREAM_WINDOW // 2:
            self._write(fr.window_update(stream.id, stream.received))
            stream.received = 0

    def _headers(self, frame: fr.Frame) -> None:
        self._server_stream(frame)  # a connection error for a stream we never opened
        block = bytes(fr.unpadded(frame))
        end_stream = bool(frame.flags & Flag.END_STREAM)
        if frame.flags & Flag.END_HEADERS:
            self._header_block(frame.stream_id, end_stream, block)
        else:
            self._block = (frame.stream_id, end_stream, bytearray(block), 1)

    def _continuation(self, frame: fr.Frame) -> None:
        if self._block is None or self._block[0] != frame.stream_id:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        sid, end_stream, block, frames = self._block
        block += frame.payload
        self._block = (sid, end_stream, block, frames + 1)
        if len(block) > MAX_HEADER_BLOCK or frames + 1 > MAX_BLOCK_FRAMES:
            raise FrameError(ErrorCode.ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes or {MAX_BLOCK_FRAMES} frames")
        if frame.has(Flag.END_HEADERS):
            self._block = None
            self._header_block(sid, end_stream, bytes(block))

    def _header_block(self, sid: int, end_stream: bool, block: bytes) -> None:
        # Decoded even for a stream we closed: the decoder must stay in step.
        # A long block is decoded whole, to size all its metadata; a short
        # one (every answer's) is peeked for what we read, and sized by that.
        peeked = self._reader.peek(block, WANTED) if len(block) <= PEEKED_BLOCK else None
        every: Iterable[tuple[bytes, bytes]] = peeked.items() if peeked is not None else self._reader.decode(block)
        headers = peeked if peeked is not None else dict(every)
        stream = self._streams.get(sid)
        if stream is None:
            return
        size = 0
        for name, value in every:  # (a loop, not a generator: two blocks a call)
            size += len(name) + len(value) + 32
        if size > MAX_HEADER_LIST:
            stream.fail(CallFailed(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"hook server sent {size} bytes of metadata, over the limit of {MAX_HEADER_LIST}"))
            self._finished(stream, remote_closed=end_stream)
            return
        if stream.headers is None:
            stream.headers = headers
            failure = http_failure(headers, end_stream)
            if failure is not None:
                stream.fail(CallFailed(*failure))
                self._finished(stream, remote_closed=end_stream)
                return
            if not end_stream:
                return
        elif not end_stream:
            self._stream_error(stream, ErrorCode.PROTOCOL_ERROR, "a second header block that does not end the call")
            return
        stream.finish(headers)
        self._finished(stream, remote_closed=True)

    def _stream_error(self, stream: Stream, code: ErrorCode, message: str) -> None:
        stream.fail(CallFailed(grpc.StatusCode.INTERNAL, f"hook server broke the call ({code.name}): {message}"))
        self._finished(stream, remote_closed=False, code=code)

    def _settings(self, frame: fr.Frame) -> None:
        if frame.stream_id:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if frame.has(Flag.ACK):
            if frame.payload:
                raise FrameError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        values = self._server.settings(frame.payload, self._streams.values())
        if Setting.HEADER_TABLE_SIZE in values and values[Setting.HEADER_TABLE_SIZE] < 4096:
            self._table_update = True
        self._prefaced = True
        self._control(_SETTINGS_ACK)
        self._wake()

    def _window_update(self, frame: fr.Frame) -> None:
        increment = fr.window_increment(frame)
        if frame.stream_id == 0:
            self._server.grow(increment)
        else:
            stream = self._server_stream(frame)
            if stream is None:
                return
            if increment == 0:
                self._stream_error(stream, ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
                return
            stream.window += increment
            if stream.window > fr.MAX_WINDOW:
                self._stream_error(stream, ErrorCode.FLOW_CONTROL_ERROR, "stream window over 2^31-1")
                return
        self._wake()

    def _rst_stream(self, frame: fr.Frame) -> None:
        if len(frame.payload) != 4:
            raise FrameError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM length not 4")
        stream = self._server_stream(frame)
        if stream is None:
            return
        code = int.from_bytes(frame.payload, "big")
        if code == ErrorCode.REFUSED_STREAM:
            stream.fail(Unprocessed(grpc.StatusCode.UNAVAILABLE, "hook server refused the call (REFUSED_STREAM)"))
        elif code == ErrorCode.CANCEL:
            stream.fail(CallFailed(grpc.StatusCode.CANCELLED, "hook server cancelled the call"))
        else:  # as grpc maps a reset (its HTTP/2 spec)
            status = _RESET_AS.get(code, grpc.StatusCode.INTERNAL)
            stream.fail(CallFailed(status, f"hook server reset the call ({_error_name(code)})"))
        stream.request_sent = True  # nothing more is sent on a reset stream
        self._finished(stream, remote_closed=True)

    def _goaway(self, frame: fr.Frame) -> None:
        if frame.stream_id or len(frame.payload) < 8:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "bad GOAWAY")
        last, code = struct.unpack_from(">II", frame.payload)
        last &= LAST_STREAM_ID
        self._going_away = True
        for stream in [s for s in self._streams.values() if s.id > last]:
            stream.fail(Unprocessed(grpc.StatusCode.UNAVAILABLE, "hook server is going away (GOAWAY)"))
            stream.request_sent = True  # the server ignores the stream: no RST_STREAM
            self._finished(stream, remote_closed=True)
        if code != ErrorCode.NO_ERROR:
            log.warning("hook server sent GOAWAY with an error", extra={
                "endpoint": self.endpoint, "code": code, "debug": bytes(frame.payload[8:]).decode("latin-1")[:200]})
        if not self._streams:
            self.close()
        self._wake()


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"{code:#x}"
