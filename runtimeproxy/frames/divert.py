"""Calls the proxy answers itself on a frames connection.

Health, refusals, translated versions, compressed hooked requests (inflated
here, messages.py, and passed on uncompressed): every call
the relay neither passes on verbatim nor hooks in place (routes.py) is
re-issued as a byte-level gRPC call to the proxy's own grpc.aio server (the
same router, stages and hooks as on the grpc data path: not a copy) and its
answer is framed back to the client. Only the client's request
header block is needed from the wire; the answer's header blocks are encoded
without indexing, so the client's HPACK table (shared with the backend's
encoder) is never touched by them.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import hpack
from grpc import aio

from ..cripath.forward import HOP_BY_HOP, send_requests
from . import frame as fr
from .frame import DEFAULT_MAX_FRAME, DEFAULT_WINDOW, ErrorCode, header_frames
from .messages import BadMessages, split_messages

if TYPE_CHECKING:
    from .connection import FrameConnection

log = logging.getLogger(__name__)

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str) -> float | None:
    """grpc-timeout (e.g. ``"4999910u"``) in seconds; None if malformed."""
    digits = value[:-1]
    # isascii: str.isdigit also takes digits int() refuses (a superscript two);
    # at most 8 digits (the gRPC spec): more overflow a float, or int() itself.
    if (not 2 <= len(value) <= 9 or value[-1] not in _TIMEOUT_UNITS
            or not (digits.isascii() and digits.isdigit())):
        return None
    return int(digits) * _TIMEOUT_UNITS[value[-1]]


def encode_headers(headers: list[tuple[str, str | bytes]]) -> bytes:
    """A header block that adds nothing to the peer's dynamic table."""
    encoder = hpack.Encoder()
    return encoder.encode([hpack.NeverIndexedHeaderTuple(k, _wire_value(k, v)) for k, v in headers])


def _wire_value(key: str, value: str | bytes) -> str | bytes:
    if key.endswith("-bin") and isinstance(value, bytes):
        return base64.b64encode(value).rstrip(b"=")
    return value


def call_metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    """The client's metadata as grpc takes it (-bin values decoded)."""
    out: list[tuple[str, str | bytes]] = []
    for raw_key, value in headers:
        key = raw_key.decode("latin-1")
        if key.startswith(":") or key in HOP_BY_HOP:
            continue
        if not key.endswith("-bin"):
            out.append((key, value.decode("latin-1")))
        elif value.startswith(b"\0"):  # true binary
            out.append((key, value[1:]))
        else:
            out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
    return tuple(out)


@dataclass
class Diverted:
    """One call the proxy answers; fed by the relay, answered by ``run``."""

    stream_id: int
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytearray = field(default_factory=bytearray)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    window: int = DEFAULT_WINDOW  # the client's receive window for this stream
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


Send = Callable[[bytes], None]  # whole frames, no window cost
SendData = Callable[[int, bytes, bool], Awaitable[None]]  # waits for the stream window


async def serve(conn: FrameConnection, call: Diverted) -> None:
    """Answer ``call`` on ``conn``, under the client's windows; its task's body."""

    def send_frames(raw: bytes) -> None:
        conn.out.frames(raw)
        conn.out.flush()

    async def send_data(sid: int, payload: bytes, end: bool) -> None:
        view = memoryview(payload)
        while view:
            if conn.closed.done():
                raise asyncio.CancelledError
            while call.window <= 0:
                call.opened.clear()
                await call.opened.wait()
            n = min(call.window, conn.client_frames.send, len(view))
            call.window -= n
            conn.out.data(sid, bytes(view[:n]), end and n == len(view))
            conn.out.flush()
            view = view[n:]
            await conn.client_can_write.wait()

    try:
        await answer(call, conn.local, lambda: conn.client_frames.send, send_frames, send_data, conn.max_message,
                     conn.table_update)
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("frames: diverted call failed", extra={"method": call.path, "stream": call.stream_id,
                                                             **conn.identity})
        conn.out.frames(fr.rst_stream(call.stream_id, ErrorCode.INTERNAL_ERROR))
        conn.out.flush()
    finally:
        conn.diverted_done(call.stream_id)


async def answer(
    call: Diverted, channel: aio.Channel, max_frame: Callable[[], int], send: Send, send_data: SendData,
    max_message: int, table_update: Callable[[], bytes] = lambda: b"",
) -> None:
    """Issue ``call`` on the proxy's own server and frame its answer back
    (``table_update``: what each of its header blocks starts with, see
    FrameConnection.table_update). A unary call without its one request
    message is the server's to answer too: INTERNAL if its method is served
    (router._one_request), else the refusal, which no message count changes."""
    status, details, trailers = grpc.StatusCode.OK, "", ()
    started = False

    def head(metadata: tuple[tuple[str, str | bytes], ...], end: bool) -> None:
        block = table_update() + encode_headers([(":status", "200"), ("content-type", "application/grpc"), *metadata])
        send(b"".join(header_frames(call.stream_id, block, max_frame(), end)))

    await call.ended.wait()
    headers = dict(call.headers)
    messages = (
        split_messages(bytes(call.body), headers.get(b"grpc-encoding", b"identity"), max_message)
        if len(call.body) <= max_message + 5
        else BadMessages("request too large", grpc.StatusCode.RESOURCE_EXHAUSTED)
    )
    if isinstance(messages, BadMessages):
        status, details = messages.code, str(messages)
    else:
        metadata = call_metadata(call.headers)
        timeout = headers.get(b"grpc-timeout")
        rpc = channel.stream_stream(call.path)(
            metadata=metadata, timeout=parse_timeout(timeout.decode()) if timeout else None
        )
        # Not grpc.aio's request iterator: a server that answers before it read
        # the request would be reported INTERNAL (see forward.send_requests).
        sender = asyncio.ensure_future(send_requests(rpc, _iterate(messages), call.path))
        try:
            initial = tuple(await rpc.initial_metadata() or ())
            async for message in rpc:
                if not started:
                    head(initial, False)
                    started = True
                await send_data(call.stream_id, struct.pack(">BI", 0, len(message)) + message, False)
            trailers = tuple(await rpc.trailing_metadata() or ())
            if not started:
                head(initial, False)
                started = True
        except aio.AioRpcError as err:
            status, details, trailers = err.code(), err.details() or "", tuple(err.trailing_metadata() or ())
            if not started and err.initial_metadata():
                head(tuple(err.initial_metadata()), False)
                started = True
        except asyncio.CancelledError:
            rpc.cancel()
            raise
        finally:
            sender.cancel()
    send(status_frames(call.stream_id, status.value[0], details, max_frame(), trailers_only=not started,
                       trailers=trailers, table_update=table_update()))


def status_frames(
    stream_id: int, status: int, message: str, max_frame: int, trailers_only: bool,
    trailers: tuple[tuple[str, str | bytes], ...] = (), table_update: bytes = b"",
) -> bytes:
    """The header block that ends a call the proxy answers: its trailers, or,
    before any answer headers went out, a trailers-only response."""
    ending = [("grpc-status", str(status)), *((("grpc-message", percent_encode(message)),) if message else ()),
              *trailers]
    if trailers_only:
        ending = [(":status", "200"), ("content-type", "application/grpc"), *ending]
    return b"".join(header_frames(stream_id, table_update + encode_headers(ending), max_frame, True))


async def _iterate(messages: list[bytes]) -> AsyncIterator[bytes]:
    for message in messages:
        yield message


def percent_encode(text: str) -> str:
    """grpc-message percent-encoding (gRPC over HTTP/2 spec)."""
    out = []
    for byte in text.encode():
        out.append(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}")
    return "".join(out)


__all__ = ["Diverted", "answer", "parse_timeout", "encode_headers", "status_frames", "DEFAULT_MAX_FRAME"]
