"""One client connection relayed frame by frame to one backend connection.

Frames of calls that need nothing from the proxy pass verbatim both ways, so
the two hops behave as one end-to-end HTTP/2 connection: SETTINGS, PING,
GOAWAY, RST_STREAM and the request direction's WINDOW_UPDATEs keep their
meaning between client and backend. Header blocks are never altered, so the
HPACK state stays consistent; the proxy decodes the client's blocks only to
read ``:path``.

A unary call with hooks stays on this connection and runs the router's
stages in place (hooked.py). A call the proxy must answer itself (health,
refusals, translated versions, compressed hooked requests; see routes.py) is
*diverted*: its header block still goes to the backend (the backend's HPACK
decoder must see it) followed at once by RST_STREAM, and the call is
answered by the proxy's own grpc.aio server (divert.py).

Flow control per hop: the proxy owns both directions' connection windows
(outbound.py, inbound.py), since its own DATA (answers, re-framed hooked
requests) shares them with the relayed streams', and credits the client for
the DATA it consumed. Stream windows of relayed streams stay end to end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import hpack
from grpc import aio

import grpc

from ..cripath.stage import Stage
from . import frame as fr
from . import hooked
from .divert import Diverted, answer, encode_headers, percent_encode
from .downstream import BackendSide
from .frame import ErrorCode, Flag, FrameError, FrameType, Setting
from .inbound import Inbound
from .msgsize import MessageSizes
from .outbound import Outbound

log = logging.getLogger(__name__)

BACKEND_GRANT = 4 * 1024 * 1024  # extra connection window given to the backend (bounds our queue)
CREDIT_BATCH = 256 * 1024
MAX_HEADER_BLOCK = 256 * 1024  # a longer header block is a CONTINUATION flood


class Routes(Protocol):
    def fast(self, path: str) -> bool:
        """True if a call on ``path`` is relayed verbatim to the backend."""

    def unary(self, path: str) -> bool:
        """True for a known unary method (waited for on shutdown)."""

    def hooked(self, path: str) -> tuple[Stage, ...] | None:
        """The stages of a call run in place (hooked.py), or None."""


class FrameConnection:
    def __init__(
        self,
        client: asyncio.Transport,
        backend: asyncio.Transport,
        routes: Routes,
        local: aio.Channel,
        max_message: int,
        max_send: int | None = None,
    ) -> None:
        # Transports, fed by protocols (listener.py): no task switch per read.
        self._client_writer = client
        self.backend = backend
        self._client_buf = b""
        self._client_block: list = []  # an open header block: [stream_id, raw frames, fragments, end_stream]
        self._prefaced = False
        self._backend_side = BackendSide(self)
        self.closed = asyncio.get_running_loop().create_future()
        self._client_writable = asyncio.Event()
        self._client_writable.set()
        self._routes = routes
        self._local = local
        self._max_message = max_message
        self.max_response = min(max_message, max_send or max_message)
        self._sizes_in: dict[int, MessageSizes] = {}
        self.sizes_out: dict[int, MessageSizes] = {}
        self.responded: set[int] = set()  # relayed streams whose response headers went out
        self.ended: set[int] = set()  # relayed streams the proxy ended itself
        self.out = Outbound(self._client_writer, self.credit_backend)
        self.inbound = Inbound(backend, self.credit_client)
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = MAX_HEADER_BLOCK
        self.last_stream = 0
        self.relayed: set[int] = set()  # open relayed streams
        self.unary_open: set[int] = set()  # of those, known unary calls
        self.diverted: dict[int, Diverted] = {}
        self.hooked: dict[int, hooked.Hooked] = {}
        self.backend_initial_window = fr.DEFAULT_WINDOW  # the backend's SETTINGS_INITIAL_WINDOW_SIZE
        self.client_max_frame = fr.DEFAULT_MAX_FRAME  # what the client accepts
        self.backend_max_frame = fr.DEFAULT_MAX_FRAME  # what the backend accepts
        self._client_initial_window = fr.DEFAULT_WINDOW
        self._granted = False
        self._uncredited = 0
        self._client_uncredited = 0
        self.stopping = False
        self.idle = asyncio.Event()  # no unary or diverted call left (shutdown waits)
        self.idle.set()

    # -- running ---------------------------------------------------------

    def client_data(self, chunk: bytes) -> None:
        self._guard(self._client_chunk, chunk, "client")

    def backend_data(self, chunk: bytes) -> None:
        self._guard(self._backend_side.feed, chunk, "backend")

    def client_writable(self, writable: bool) -> None:
        """The client's transport buffer is full (or drained again): hold the backend."""
        if writable:
            self._client_writable.set()
            self.backend.resume_reading()
        else:
            self._client_writable.clear()
            self.backend.pause_reading()

    def backend_writable(self, writable: bool) -> None:
        if writable:
            self._client_writer.resume_reading()
        else:
            self._client_writer.pause_reading()

    def lost(self) -> None:
        """Either side closed: so does the other; the proxy's own answers stop."""
        for call in [*self.diverted.values(), *self.hooked.values()]:
            if call.task is not None:
                call.task.cancel()
        self._close()

    def _guard(self, feed: Callable[[bytes], None], chunk: bytes, side: str) -> None:
        if self.closed.done():
            return
        try:
            feed(chunk)
        except FrameError as exc:
            code = exc.code if side == "client" else ErrorCode.INTERNAL_ERROR
            log.warning("frames: connection error", extra={"side": side, "code": code.name, "error": str(exc)})
            self.out.control(fr.goaway(self.last_stream, code, str(exc).encode()[:200]))
            self.out.flush()
            self.lost()

    def _close(self) -> None:
        for writer in (self._client_writer, self.backend):
            writer.close()
        self._client_writable.set()  # a diverted call waiting to send finds the connection gone
        if not self.closed.done():
            self.closed.set_result(None)
        self._check_idle()

    def begin_stop(self) -> None:
        """Shutdown: no new stream is relayed; the client is told to go away."""
        self.stopping = True
        self.out.control(fr.goaway(self.last_stream, ErrorCode.NO_ERROR))
        # Streams end now, as on the grpc path (kubelet retries UNAVAILABLE);
        # unary calls get the grace period.
        for sid in sorted(self.relayed - self.unary_open):
            self.inbound.ordered(self.end_locally(sid, 14, "runtime-proxy is shutting down"))
        self.out.flush()

    def end_locally(self, sid: int, status: int, message: str) -> bytes:
        """End a relayed call with a status of the proxy's; the RST_STREAM for the backend is returned."""
        ending = [("grpc-status", str(status)), ("grpc-message", percent_encode(message))]
        if sid not in self.responded:
            ending = [(":status", "200"), ("content-type", "application/grpc"), *ending]
        self.out.frames(b"".join(fr.header_frames(sid, encode_headers(ending), self.client_max_frame, True)))
        self.ended.add(sid)
        self.stream_done(sid)
        call = self.hooked.get(sid)
        if call is not None:
            call.answer(status, message)
        return fr.rst_stream(sid, ErrorCode.CANCEL)

    def end_hooked(self, sid: int, code: grpc.StatusCode, message: str) -> None:
        """A hooked call refused before its request was sent: the client gets the status."""
        if sid in self.ended or self.closed.done():
            return
        log.info("call refused", extra={"code": code.name, "error": message})
        self.inbound.ordered(self.end_locally(sid, code.value[0], message))
        self.out.flush()

    def hooked_done(self, call: hooked.Hooked) -> None:
        self.hooked.pop(call.stream_id, None)
        self._check_idle()

    def credit_client(self, amount: int) -> None:
        """The client's DATA, consumed: its connection window (ours, see inbound.py) grows again."""
        self._client_uncredited += amount
        if self._client_uncredited >= CREDIT_BATCH:
            self.out.control(fr.window_update(0, self._client_uncredited))
            self._client_uncredited = 0

    def credit_backend(self, amount: int) -> None:
        # Batched: the backend still has BACKEND_GRANT - CREDIT_BATCH of window
        # at least, and a small call costs no extra frame.
        self._uncredited += amount
        if self._uncredited >= CREDIT_BATCH:
            self.backend.write(fr.window_update(0, self._uncredited))
            self._uncredited = 0

    def _check_idle(self) -> None:
        if not self.unary_open and not self.diverted and not self.hooked:
            self.idle.set()
        else:
            self.idle.clear()

    # -- client -> backend -------------------------------------------------

    def _client_chunk(self, chunk: bytes) -> None:
        if not self._prefaced:
            self._client_buf += chunk
            if len(self._client_buf) < len(fr.PREFACE):
                return
            if not self._client_buf.startswith(fr.PREFACE):
                log.info("frames: not an HTTP/2 client", extra={"preface": self._client_buf[:16].hex()})
                self.lost()
                return
            self._prefaced = True
            self.backend.write(fr.PREFACE)
            chunk, self._client_buf = self._client_buf[len(fr.PREFACE) :], b""
        buf = self._client_buf + chunk if self._client_buf else chunk
        block = self._client_block
        inbound = self.inbound
        pos, run, out = 0, 0, []
        while True:
            f, nxt = fr.parse(buf, pos, self.backend_max_frame)
            if f is None:
                break
            if block or f.type in _CLIENT_SPECIAL:
                if f.type == FrameType.DATA and f.stream_id in self.relayed and not block:
                    sizes = self._sizes_in[f.stream_id]
                    payload = fr.unpadded(f) if f.has(Flag.PADDED) else f.payload
                    too_long = sizes.feed(payload)
                    size = len(f.payload)
                    if too_long is None and inbound.fits(size):
                        inbound.spend(size)
                        self.credit_client(size)
                        pos = nxt  # the common case: stays in the verbatim run
                        continue
                    out.append(buf[run:pos])
                    if too_long is None:  # the backend's window is closed: queued, in order
                        self._write_backend(out)
                        inbound.data(f.stream_id, bytes(payload), f.has(Flag.END_STREAM), credit=size)
                    else:
                        self._refuse_size(f, too_long, out)
                    run = pos = nxt
                    continue
                out.append(buf[run:pos])
                self._client_frame(f, buf[pos:nxt], out, block)
                run = nxt
            pos = nxt
        out.append(buf[run:pos])
        self._client_buf = buf[pos:]
        self._write_backend(out)
        self.out.flush()

    def _write_backend(self, out: list[bytes]) -> None:
        data = b"".join(out)
        out.clear()
        if data:
            self.backend.write(data)

    def _ordered(self, raw: bytes, out: list[bytes]) -> None:
        """A frame that must follow its stream's DATA, some of which may be queued."""
        if self.inbound.queued:
            self._write_backend(out)
            self.inbound.ordered(raw)
        else:
            out.append(raw)

    def _client_frame(self, f: fr.Frame, raw: bytes, out: list[bytes], block: list) -> None:
        sid = f.stream_id
        if block:
            if f.type != FrameType.CONTINUATION or sid != block[0]:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
            block[1].append(raw)
            block[2].append(bytes(f.payload))
            if sum(map(len, block[2])) > MAX_HEADER_BLOCK:
                raise FrameError(ErrorCode.ENHANCE_YOUR_CALM, "header block too long")
            if f.has(Flag.END_HEADERS):
                self._header_block(block, out)
                block.clear()
            return
        if f.type == FrameType.HEADERS:
            if sid == 0 or sid % 2 == 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}")
            if sid <= self.last_stream and sid not in self.relayed and sid not in self.diverted:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"stream {sid} reused")
            block.extend([sid, [raw], [bytes(fr.unpadded(f))], f.has(Flag.END_STREAM)])
            if f.has(Flag.END_HEADERS):
                self._header_block(block, out)
                block.clear()
        elif f.type == FrameType.CONTINUATION:
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        elif f.type == FrameType.DATA:
            self._client_data(f, raw, out)
        elif f.type == FrameType.WINDOW_UPDATE:
            increment = fr.window_increment(f)
            if increment == 0:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            if sid == 0:
                self.out.grow(increment)  # the response direction's window is ours
            elif sid in self.diverted:
                call = self.diverted[sid]
                call.window += increment
                call.opened.set()
            else:
                out.append(raw)
        elif f.type == FrameType.RST_STREAM:
            if sid in self.ended:
                return
            call = self.diverted.pop(sid, None)
            if call is not None:
                if call.task is not None:
                    call.task.cancel()
                self._check_idle()
                return
            held = self.hooked.get(sid)
            if held is not None:  # the backend has the stream: it ends there too
                self.ended.add(sid)
                held.answer(8, "cancelled by the client")
                if held.task is not None:
                    held.task.cancel()
            self.stream_done(sid)
            self._ordered(raw, out)
        elif f.type == FrameType.SETTINGS:
            if not f.has(Flag.ACK):
                self._client_settings(fr.settings(f.payload))
            out.append(raw)
            if not self._granted:  # after the client's first SETTINGS, as the preface requires
                self._granted = True
                out.append(fr.window_update(0, BACKEND_GRANT))
        elif f.type == FrameType.PING:
            if len(f.payload) != 8 or sid != 0:
                raise FrameError(ErrorCode.FRAME_SIZE_ERROR if len(f.payload) != 8 else ErrorCode.PROTOCOL_ERROR,
                                 "malformed PING")
            if f.has(Flag.ACK):  # the answer to a backend's ping
                out.append(raw)
            else:
                # Answered here, per hop: a grpc client pings as answers arrive
                # (BDP), and for diverted calls those answers are the proxy's;
                # a grpc-go runtime counts pings it sent nothing for as abuse
                # (GOAWAY too_many_pings).
                self.out.control(fr.serialize(FrameType.PING, Flag.ACK, 0, bytes(f.payload)))
        else:  # PUSH_PROMISE
            raise FrameError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _client_settings(self, values: dict[int, int]) -> None:
        if Setting.HEADER_TABLE_SIZE in values:  # the backend's encoder may use that much
            self._backend_side.decoder.max_allowed_table_size = values[Setting.HEADER_TABLE_SIZE]
        if Setting.MAX_FRAME_SIZE in values:
            size = values[Setting.MAX_FRAME_SIZE]
            if not fr.DEFAULT_MAX_FRAME <= size <= fr.MAX_FRAME_LIMIT:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"MAX_FRAME_SIZE {size}")
            self.client_max_frame = size
        if Setting.INITIAL_WINDOW_SIZE in values:
            size = values[Setting.INITIAL_WINDOW_SIZE]
            if size > fr.MAX_WINDOW:
                raise FrameError(ErrorCode.FLOW_CONTROL_ERROR, f"INITIAL_WINDOW_SIZE {size}")
            delta, self._client_initial_window = size - self._client_initial_window, size
            for call in self.diverted.values():
                call.window += delta
                call.opened.set()

    def _header_block(self, block: list, out: list[bytes]) -> None:
        sid, raws, fragments, end_stream = block
        try:
            # raw: a -bin value may be true binary (grpc's 0xfe03 setting)
            headers = self.decoder.decode(b"".join(fragments), raw=True)
        except hpack.HPACKError as exc:
            raise FrameError(ErrorCode.COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        if sid in self.diverted:  # trailers of a diverted call: the backend's decoder still reads them
            out.extend(raws)
            if end_stream:
                self.diverted[sid].ended.set()
            return
        if sid in self.hooked:  # gRPC clients send no request trailers; nor may anyone here
            out.extend(_without_end_stream(raws))
            self._write_backend(out)
            self.end_hooked(sid, grpc.StatusCode.INTERNAL, "runtime-proxy: request trailers on a hooked call")
            return
        if sid in self.relayed:
            self._ordered(b"".join(raws), out)
            return
        self.last_stream = sid
        path = next((v for k, v in headers if k == b":path"), b"").decode("latin-1")
        if self.stopping or not self._routes.fast(path):
            stages = None if self.stopping else self._routes.hooked(path)
            if stages is not None and not _compressed(headers):
                self._hook(sid, path, headers, stages, raws, end_stream, out)
            else:
                self._divert(sid, path, headers, raws, end_stream, out)
            return
        out.extend(raws)
        self.relayed.add(sid)
        self._sizes_in[sid] = MessageSizes(self._max_message)
        self.sizes_out[sid] = MessageSizes(self.max_response)
        if self._routes.unary(path):
            self.unary_open.add(sid)
            self.idle.clear()

    def _hook(self, sid: int, path: str, headers: list, stages: tuple[Stage, ...], raws: list[bytes],
              end_stream: bool, out: list[bytes]) -> None:
        out.extend(_without_end_stream(raws))  # the request follows, from the stages
        call = hooked.Hooked(sid, path, headers, stages, window=self.backend_initial_window)
        if end_stream:
            call.ended.set()
        self.hooked[sid] = call
        self._sizes_in[sid] = MessageSizes(self._max_message)
        self.sizes_out[sid] = MessageSizes(self.max_response)
        self.unary_open.add(sid)
        self.idle.clear()
        call.task = asyncio.ensure_future(hooked.run(self, call))

    def _divert(self, sid: int, path: str, headers: list, raws: list[bytes], end_stream: bool, out: list[bytes]) -> None:
        out.extend(_without_end_stream(raws))  # a backend handler must never see a complete (empty) request
        out.append(fr.rst_stream(sid, ErrorCode.CANCEL))
        call = Diverted(sid, path, headers, window=self._client_initial_window)
        if end_stream:
            call.ended.set()
        self.diverted[sid] = call
        self.idle.clear()
        call.task = asyncio.ensure_future(self._answer(call))

    async def _answer(self, call: Diverted) -> None:
        try:
            await answer(call, self._local, lambda: self.client_max_frame, self._send_frames,
                         self._send_data, self._max_message)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("frames: diverted call failed", extra={"method": call.path})
            self.out.frames(fr.rst_stream(call.stream_id, ErrorCode.INTERNAL_ERROR))
            self.out.flush()
        finally:
            self.diverted.pop(call.stream_id, None)
            self._check_idle()

    def _send_frames(self, raw: bytes) -> None:
        self.out.frames(raw)
        self.out.flush()

    async def _send_data(self, sid: int, payload: bytes, end: bool) -> None:
        call = self.diverted[sid]
        view = memoryview(payload)
        while view:
            if self.closed.done():
                raise asyncio.CancelledError
            while call.window <= 0:
                call.opened.clear()
                await call.opened.wait()
            n = min(call.window, self.client_max_frame, len(view))
            call.window -= n
            self.out.data(sid, bytes(view[:n]), end and n == len(view))
            self.out.flush()
            view = view[n:]
            await self._client_writable.wait()

    def _refuse_size(self, f: fr.Frame, length: int, out: list[bytes]) -> None:
        message = f"Received message larger than max ({length} vs. {self._max_message})"
        log.info("call refused", extra={"code": "RESOURCE_EXHAUSTED", "error": message})
        self._ordered(self.end_locally(f.stream_id, 8, message), out)
        self.credit_client(len(f.payload))  # dropped, never seen by the backend

    def _client_data(self, f: fr.Frame, raw: bytes, out: list[bytes]) -> None:
        sid = f.stream_id
        call = self.diverted.get(sid)
        if sid in self.ended:  # the proxy ended it: the backend never sees the rest
            self.credit_client(len(f.payload))
            return
        held = self.hooked.get(sid)
        if held is not None:
            self._hooked_data(held, f, out)
            return
        if call is None:
            if sid == 0 or sid > self.last_stream:
                raise FrameError(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            out.append(raw)  # a closed stream: the backend answers it
            return
        size = len(f.payload)
        if len(call.body) <= self._max_message + 5:
            call.body += fr.unpadded(f)
        self._consumed(sid, size, f.has(Flag.END_STREAM), call.ended)

    def _hooked_data(self, call: hooked.Hooked, f: fr.Frame, out: list[bytes]) -> None:
        payload = fr.unpadded(f)
        too_long = self._sizes_in[call.stream_id].feed(payload)
        if too_long is not None:
            if call.task is not None:
                call.task.cancel()
            self._refuse_size(f, too_long, out)
            return
        call.body += payload
        self._consumed(call.stream_id, len(f.payload), f.has(Flag.END_STREAM), call.ended)

    def _consumed(self, sid: int, size: int, end_stream: bool, ended: asyncio.Event) -> None:
        """DATA the proxy took, never seen by the backend: it credits the client itself."""
        self.credit_client(size)
        if end_stream:
            ended.set()
        elif size:
            self.out.control(fr.window_update(sid, size))

    def stream_done(self, sid: int) -> None:
        self.relayed.discard(sid)
        self.responded.discard(sid)
        self._sizes_in.pop(sid, None)
        self.sizes_out.pop(sid, None)
        if sid in self.unary_open:
            self.unary_open.discard(sid)
            self._check_idle()

    # -- backend -> client -------------------------------------------------


def _without_end_stream(raws: list[bytes]) -> list[bytes]:
    first = bytearray(raws[0])
    first[4] &= ~Flag.END_STREAM
    return [bytes(first), *raws[1:]]


def _compressed(headers: list[tuple[bytes, bytes]]) -> bool:
    encoding = next((v for k, v in headers if k == b"grpc-encoding"), b"identity")
    return encoding != b"identity"


_CLIENT_SPECIAL = frozenset({
    FrameType.HEADERS, FrameType.DATA, FrameType.WINDOW_UPDATE, FrameType.RST_STREAM,
    FrameType.SETTINGS, FrameType.CONTINUATION, FrameType.PUSH_PROMISE, FrameType.PING,
})
