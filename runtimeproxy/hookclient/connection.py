"""One HTTP/2 connection to a hook server, carrying unary gRPC calls.

The proxy's side of a hook call, without grpc.aio: no poller thread to wake
and hand the answer over, no call object and metadata to build. What it keeps
of HTTP/2 (RFC 9113) is what a client must: the peer's SETTINGS, windows in
both directions (a 16 MiB request waits for the server's credit, an answer
gets ours back as it is read), PING answers, GOAWAY and RST_STREAM, and an
HPACK decoder in step with the server's encoder. A connection error sends a
GOAWAY and fails the calls on it; it never reaches the proxy's loop.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import grpc

from ..frames import frame as fr
from ..frames.frame import T_DATA, T_HEADERS, ErrorCode, Flag, FrameError, FrameType, Setting
from ..frames.hpackpeek import HeaderReader
from .peer import ServerLimits
from .receive import CONNECTION_WINDOW, LAST_STREAM_ID, MAX_DECODED_HEADERS, MAX_HEADER_LIST, STREAM_WINDOW, ServerFrames
from .stream import Stream, Unprocessed
from .transport import CallFailed

if TYPE_CHECKING:
    from .endpointtrust import Peer, SocketSeen

log = logging.getLogger(__name__)
_FRAME_HEADER = fr.HEADER.unpack_from

MAX_QUEUED_CONTROL = 1000  # frames answered while the socket's buffer is full, then ENHANCE_YOUR_CALM
FLUSH_S = 1.0  # how long a closed connection may take to write what it has buffered

_OUR_SETTINGS = fr.serialize(
    FrameType.SETTINGS, 0, 0,
    struct.pack(">HIHIHI", Setting.ENABLE_PUSH, 0, Setting.INITIAL_WINDOW_SIZE, STREAM_WINDOW,
                Setting.MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
)


class ClientConnection(ServerFrames, asyncio.Protocol):
    """A connection's calls share its windows; ``call`` is all a user needs."""

    def __init__(self, endpoint: str, max_message: int, on_closed: Callable[[ClientConnection], None]) -> None:
        self.endpoint = endpoint
        self._max_message = max_message
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        self._reader = HeaderReader(MAX_DECODED_HEADERS, " from the hook server")
        self._rest = b""  # the start of a frame that the next read completes
        self._prefaced = False  # the server's SETTINGS came
        self._streams: dict[int, Stream] = {}
        self._next_id = 1
        # A header block in CONTINUATIONs: stream, END_STREAM, bytes, frames.
        self._block: tuple[int, bool, bytearray, int] | None = None
        self._server = ServerLimits()
        self._handling = self._handlers()
        self._recv_window = CONNECTION_WINDOW  # what the server may still send us
        self._recv_unacked = 0
        self._waiters: list[asyncio.Future[None]] = []  # calls waiting for window, a stream slot or the socket
        self._paused = False  # the socket's buffer is full (pause_writing)
        self._going_away = False  # GOAWAY sent or received: no new calls
        self._control_queued = 0  # control frames answered while the socket's buffer is full
        # Set by the pool (pool.py) as it dials: the socket as judged then
        # (endpointtrust.py), the server found listening on it, and the hook
        # file owners both were found trusted for.
        self.socket: SocketSeen | None = None
        self.peer: Peer | None = None
        self.trusted_for: set[int | None] = set()
        self.closed = False
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # done at connection_lost
        self._closed_error: tuple[grpc.StatusCode, str] | None = None  # why calls on it fail, once closing
        self._table_update = False  # the server shrank HPACK's table: say ours is empty, in the next block
        self._flush_timer: asyncio.TimerHandle | None = None  # set at close: aborts a flush too slow

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream's: the writes below; a cast, not a check, as uvloop's is no asyncio.Transport subclass.
        self._transport = stream = cast(asyncio.Transport, transport)
        stream.write(fr.PREFACE + _OUR_SETTINGS + fr.window_update(0, CONNECTION_WINDOW - fr.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._flush_timer is not None:  # the socket is closed: nothing is left to abort
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._closed_error is None:
            self._closed_error = (
                grpc.StatusCode.UNAVAILABLE, f"hook server closed the connection{f': {exc}' if exc else ''}"
            )
        self._fail_all()
        if not self.lost.done():
            self.lost.set_result(None)
        self._on_closed(self)

    def _fail_all(self) -> None:
        assert self._closed_error is not None
        for stream in self._streams.values():
            stream.fail(CallFailed(*self._closed_error))
        self._streams.clear()
        self._wake()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._control_queued = 0
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self._rest:
            data = self._rest + data  # only a frame begun in the last read is copied
        pos = 0
        size = len(data)
        view = memoryview(data)  # each frame's payload is a view of it
        try:
            while size - pos >= fr.HEADER_LEN:  # (fr.parse, inline: no call nor view per frame)
                hi, lo, kind, flags, sid = _FRAME_HEADER(data, pos)
                length = (hi << 16) | lo
                if length > fr.DEFAULT_MAX_FRAME:
                    raise fr.oversized(length, fr.DEFAULT_MAX_FRAME)
                end = pos + fr.HEADER_LEN + length
                if end > size:
                    break
                frame = fr.Frame(kind, flags, sid & 0x7FFFFFFF, view[pos + fr.HEADER_LEN : end])
                pos = end
                self._frame(frame)
                if self.closed or self._transport is None or self._transport.is_closing():
                    return
        except FrameError as err:
            self._connection_error(err.code, str(err))
            return
        except Exception as err:  # noqa: BLE001 - whatever a server sends must not reach the loop
            self._connection_error(ErrorCode.PROTOCOL_ERROR, f"unreadable frame ({type(err).__name__}: {err})")
            return
        finally:
            # Bytes, never a bytearray cut in place: payloads handed on are views of it.
            self._rest = data[pos:] if pos < len(data) else b""

    # -- calls

    @property
    def usable(self) -> bool:
        """New calls may start here."""
        return not (self.closed or self._going_away) and self._next_id < LAST_STREAM_ID

    async def call(self, block: bytes, message: bytes) -> bytes:
        """One call: ``block`` its request headers (``headers.with_timeout``),
        ``message`` its request; the answer's message. The caller's cancel (its
        deadline) resets the stream."""
        while self._server.full(len(self._streams)) and self.usable:
            await self._wait()
        if not self.usable:
            raise Unprocessed(grpc.StatusCode.UNAVAILABLE, "hook server connection is closing")
        sid = self._next_id
        self._next_id += 2
        stream = Stream(sid, self._server.stream_window, asyncio.get_running_loop().create_future(), self._max_message)
        self._streams[sid] = stream
        try:
            payload = struct.pack(">BI", 0, len(message)) + message
            if not self._send_whole(stream, block, payload):
                await self._send(stream, block, payload)
            return await stream.answer
        except asyncio.CancelledError:
            if sid in self._streams:
                self._finished(stream, remote_closed=False)  # reset: the server stops
            raise
        finally:
            if not stream.answer.done():
                stream.answer.cancel()
            elif not stream.answer.cancelled():
                stream.answer.exception()  # retrieved: a failure after a cancel is not "never retrieved"

    def _send_whole(self, stream: Stream, block: bytes, payload: bytes) -> bool:
        """``_send`` when both windows take the whole request now (nearly every
        call): the same frames in one write, without a coroutine. False if not."""
        size = len(payload)
        server = self._server
        if self._paused or size > stream.window or size > server.send_window:
            return False
        if self._table_update:
            block = b"\x20" + block  # as _send
            self._table_update = False
        stream.window -= size
        server.send_window -= size
        sid, max_frame = stream.id, server.max_frame
        if len(block) <= max_frame and size <= max_frame:  # one frame each (as header_frames, data_frames)
            self._write(fr.serialize(T_HEADERS, Flag.END_HEADERS, sid, block)
                        + fr.serialize(T_DATA, Flag.END_STREAM, sid, payload))
        else:
            self._write(b"".join(fr.header_frames(sid, block, max_frame, end_stream=False)
                                 + fr.data_frames(sid, payload, max_frame, end_stream=True)))
        stream.request_sent = True
        return True

    async def _send(self, stream: Stream, block: bytes, payload: bytes) -> None:
        """Headers, then the message within both windows, in as few writes as the windows allow."""
        if self._table_update:
            block = b"\x20" + block  # a dynamic table size update to 0 (RFC 7541 section 6.3)
            self._table_update = False
        out = fr.header_frames(stream.id, block, self._server.max_frame, end_stream=False)
        view = memoryview(payload)
        while True:
            if stream.answer.done():
                return  # answered (or reset) before all was sent: the rest is not wanted
            # A window may be below 0 (the server lowered INITIAL_WINDOW_SIZE): nothing may go then.
            n = 0 if self._paused else max(0, min(len(view), stream.window, self._server.send_window))
            if n or not view:
                stream.window -= n
                self._server.send_window -= n
                last = n == len(view)
                out += fr.data_frames(stream.id, bytes(view[:n]), self._server.max_frame, end_stream=last)
                view = view[n:]
                if last:
                    self._write(b"".join(out))
                    stream.request_sent = True
                    return
            if out:
                self._write(b"".join(out))
                out = []
            await self._wait()

    async def _wait(self) -> None:
        """Until a window grows, a stream ends, the socket drains (resume_writing) or the connection closes."""
        if self.closed:
            raise CallFailed(*(self._closed_error or (grpc.StatusCode.UNAVAILABLE, "hook server connection closed")))
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _control(self, data: bytes) -> None:
        """A frame the server's own frames call for (ACKs, resets): a server
        that sends them without reading ours is cut off, not buffered for."""
        if self._paused:
            self._control_queued += 1
            if self._control_queued > MAX_QUEUED_CONTROL:
                self._connection_error(ErrorCode.ENHANCE_YOUR_CALM, "too many frames to answer while not reading ours")
                return
        self._write(data)

    def _finished(self, stream: Stream, *, remote_closed: bool, code: ErrorCode = ErrorCode.CANCEL) -> None:
        """The stream is over for us (answered, failed or reset). Unless both
        sides have ended it (our END_STREAM sent, the server's come), the server
        is told with a RST_STREAM: an upload it answered early stops, an answer
        we gave up on is not sent."""
        if self._streams.pop(stream.id, None) is not None:
            if not (remote_closed and stream.request_sent):
                self._control(fr.rst_stream(stream.id, code))
            self._wake()
        if self._going_away and not self._streams:
            self.close()

    # -- closing

    def go_away(self) -> None:
        """No new calls; the connection closes once the last one is answered."""
        if not self._going_away:
            self._going_away = True
            self._write(fr.goaway(0, ErrorCode.NO_ERROR))
        if not self._streams:
            self.close()

    def close(self, error: tuple[grpc.StatusCode, str] | None = None, *, abort: bool = False) -> None:
        """Close now: calls still under way fail at once with ``error``
        (CANCELLED by default). What is buffered is still written (a GOAWAY)
        unless ``abort``, and for at most ``FLUSH_S``: a server that stopped
        reading does not keep the socket open."""
        self._going_away = True
        if self._closed_error is None:
            self._closed_error = error or (grpc.StatusCode.CANCELLED, "hook connection closed by the proxy")
        self._fail_all()
        transport = self._transport
        if transport is None or self.closed or (transport.is_closing() and not abort):
            return
        if abort:
            transport.abort()
            return
        transport.close()
        self._flush_timer = asyncio.get_running_loop().call_later(FLUSH_S, transport.abort)

    def _connection_error(self, code: ErrorCode, message: str) -> None:
        log.warning("hook server broke HTTP/2; connection closed",
                    extra={"endpoint": self.endpoint, "error": message, "code": code.name})
        self._write(fr.goaway(0, code, message.encode()[:256]))
        self.close((grpc.StatusCode.UNAVAILABLE, f"hook server connection error ({code.name}): {message}"))
