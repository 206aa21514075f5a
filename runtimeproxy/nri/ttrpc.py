"""ttrpc over one multiplexed connection: framing, a server and a client.

A ttrpc frame is ``u32 BE length | u32 BE stream id | u8 type | u8 flags``
and the body (at most 4 MiB). Unary calls only: a request frame carries a
``ttrpc.Request``, the response frame (same stream id) a ``ttrpc.Response``
with either a payload or a status. Client stream ids are odd.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from cri_api.ttrpc import request_pb2 as ttrpc_pb

from .mux import MuxConn

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
MAX_BODY = 4 * 1024 * 1024
TYPE_REQUEST, TYPE_RESPONSE, TYPE_DATA = 1, 2, 3

# gRPC status codes, as ttrpc uses them.
UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, FAILED_PRECONDITION, UNIMPLEMENTED, UNAVAILABLE = 2, 3, 4, 9, 12, 14
RESOURCE_EXHAUSTED = 8

# When the peer stops waiting for the request being answered (loop time), from
# its timeout_nano; None if it sent none. Set in each request's own task.
REQUEST_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("ttrpc_request_deadline", default=None)

M = TypeVar("M", bound=Message)
Handler = Callable[[bytes], Awaitable[bytes]]


class TtrpcError(Exception):
    """A call answered with a status, or one we answer with a status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code, self.message = code, message

    def __str__(self) -> str:
        return f"ttrpc status {self.code}: {self.message}"


@dataclass(frozen=True)
class Frame:
    stream_id: int
    type: int
    flags: int
    body: bytes


def encode_frame(stream_id: int, type_: int, body: bytes, flags: int = 0) -> bytes:
    if len(body) > MAX_BODY:
        raise TtrpcError(INVALID_ARGUMENT, f"message of {len(body)} bytes is over ttrpc's {MAX_BODY}")
    return HEADER.pack(len(body), stream_id, type_, flags) + body


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame, or None at the end of the stream."""
    try:
        length, stream_id, type_, flags = HEADER.unpack(await reader.readexactly(HEADER.size))
        if length > MAX_BODY:
            raise ConnectionError(f"ttrpc frame of {length} bytes is over the limit")
        return Frame(stream_id, type_, flags, await reader.readexactly(length))
    except asyncio.IncompleteReadError:
        return None


class Server:
    """Serves unary methods to the peer on one connection."""

    def __init__(self, conn: MuxConn, handlers: Mapping[tuple[str, str], Handler]) -> None:
        self._conn = conn
        self._handlers = handlers
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        try:
            while (frame := await read_frame(self._conn.reader)) is not None:
                if frame.type != TYPE_REQUEST:
                    log.warning("unexpected ttrpc frame type", extra={"type": frame.type, "stream": frame.stream_id})
                    continue
                task = asyncio.get_running_loop().create_task(self._answer(frame), name=f"ttrpc-{frame.stream_id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _answer(self, frame: Frame) -> None:
        response = ttrpc_pb.Response()
        try:
            request = ttrpc_pb.Request.FromString(frame.body)
            if request.timeout_nano > 0:
                REQUEST_DEADLINE.set(asyncio.get_running_loop().time() + request.timeout_nano / 1e9)
            handler = self._handlers.get((request.service, request.method))
            if handler is None:
                raise TtrpcError(UNIMPLEMENTED, f"{request.service}/{request.method} is not served")
            response.payload = await handler(request.payload)
        except TtrpcError as err:
            response.status.code, response.status.message = err.code, err.message
        except DecodeError as err:
            response.status.code, response.status.message = INVALID_ARGUMENT, f"cannot decode request: {err}"
        except Exception as err:  # one failed call is that call's answer, never the connection's end
            log.exception("NRI request handler failed", extra={"stream": frame.stream_id})
            response.status.code, response.status.message = UNKNOWN, f"{type(err).__name__}: {err}"
        try:
            data = encode_frame(frame.stream_id, TYPE_RESPONSE, response.SerializeToString())
        except TtrpcError as err:  # an answer over ttrpc's limit: the runtime gets why, not silence
            log.error("NRI answer too large to send", extra={"stream": frame.stream_id, "error": err.message})
            failed = ttrpc_pb.Response()
            failed.status.code, failed.status.message = RESOURCE_EXHAUSTED, f"runtime-proxy: {err.message}"
            data = encode_frame(frame.stream_id, TYPE_RESPONSE, failed.SerializeToString())
        with contextlib.suppress(ConnectionError):
            await self._conn.send(data)


class Client:
    """Calls unary methods of the peer on one connection."""

    def __init__(self, conn: MuxConn) -> None:
        self._conn = conn
        self._ids = itertools.count(1, 2)
        self._pending: dict[int, asyncio.Future[ttrpc_pb.Response]] = {}
        self._closed = False

    async def run(self) -> None:
        """Read responses until the connection ends; then pending calls fail."""
        try:
            while (frame := await read_frame(self._conn.reader)) is not None:
                future = self._pending.pop(frame.stream_id, None)
                if future is None or future.done():
                    log.warning("ttrpc response for no pending call", extra={"stream": frame.stream_id})
                    continue
                try:
                    future.set_result(ttrpc_pb.Response.FromString(frame.body))
                except DecodeError as err:
                    future.set_exception(TtrpcError(UNKNOWN, f"cannot decode response: {err}"))
        finally:
            self._closed = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionResetError("NRI connection closed"))
            self._pending.clear()

    async def call(self, service: str, method: str, request: Message, response_type: type[M], timeout: float) -> M:
        if self._closed:
            raise ConnectionResetError("NRI connection closed")
        stream_id = next(self._ids)
        future: asyncio.Future[ttrpc_pb.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        envelope = ttrpc_pb.Request(
            service=service, method=method, payload=request.SerializeToString(), timeout_nano=int(timeout * 1e9)
        )
        try:
            await self._conn.send(encode_frame(stream_id, TYPE_REQUEST, envelope.SerializeToString()))
            async with asyncio.timeout(timeout):
                response = await future
        except TimeoutError:
            raise TtrpcError(DEADLINE_EXCEEDED, f"{service}/{method}: no answer within {timeout:g}s") from None
        finally:
            self._pending.pop(stream_id, None)
        if response.HasField("status") and response.status.code != 0:
            raise TtrpcError(response.status.code, response.status.message)
        return response_type.FromString(response.payload)
