"""Relaying one gRPC call to the backend as raw bytes.

This is the only place that issues backend calls. The router hands it a
backend path, the client's request bytes (or request stream) and the server
context; it never decodes a message. A frame-level fast path for unhooked
calls can replace :class:`GrpcRelay` behind the :class:`Relay` protocol
without touching routing or hooks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import NoReturn, Protocol

import grpc
from grpc import aio

log = logging.getLogger(__name__)

# Headers that belong to one HTTP/2 hop or that grpc sets itself; the rest of
# the client's metadata (including -bin keys) reaches the backend unchanged.
HOP_BY_HOP = frozenset(
    {
        "te",
        "content-type",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "grpc-status",
        "grpc-message",
        "user-agent",
        "connection",
        "keep-alive",
        "host",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
    }
)


def client_metadata(context: aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    return tuple(
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if key not in HOP_BY_HOP and not key.startswith(":")
    )


def _reply_metadata(md: object) -> tuple[tuple[str, str | bytes], ...]:
    return tuple((k, v) for k, v in (md or ()) if k not in HOP_BY_HOP and not k.startswith(":"))


# Codes that say the runtime (not the caller) is in trouble: worth a warning.
_RUNTIME_TROUBLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DATA_LOSS,
    }
)


async def pass_error(context: aio.ServicerContext, err: aio.AioRpcError, path: str) -> NoReturn:
    """End the client's call with the backend's status, details and trailers."""
    (log.warning if err.code() in _RUNTIME_TROUBLE else log.info)(
        "call failed", extra={"method": path, "code": err.code().name, "error": err.details()}
    )
    trailers = _reply_metadata(err.trailing_metadata())
    if trailers:
        context.set_trailing_metadata(trailers)
    await context.abort(err.code(), err.details() or "")
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class Relay(Protocol):
    def end_streams(self) -> None:
        """Shutdown: end every open stream now (clients see UNAVAILABLE)."""
    async def unary(self, channel: aio.Channel, path: str, request: bytes, context: aio.ServicerContext) -> bytes: ...

    def server_stream(
        self, channel: aio.Channel, path: str, request: bytes, context: aio.ServicerContext
    ) -> AsyncIterator[bytes]: ...

    def stream_stream(
        self, channel: aio.Channel, path: str, requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]: ...


class GrpcRelay:
    """Re-issues each call on a grpc.aio channel with identity (de)serializers."""

    def __init__(self) -> None:
        # Open backend streams, so that shutdown can end them instead of
        # waiting out the grace period on calls that never finish.
        self._streams: set[aio.Call] = set()
        self._closing = False

    def end_streams(self) -> None:
        self._closing = True
        for call in list(self._streams):
            call.cancel()

    async def unary(self, channel: aio.Channel, path: str, request: bytes, context: aio.ServicerContext) -> bytes:
        call = channel.unary_unary(path)(
            request, metadata=client_metadata(context), timeout=context.time_remaining()
        )
        try:
            response = await call
        except aio.AioRpcError as err:
            await _pass_initial_metadata(call, context)
            await pass_error(context, err, path)
        except asyncio.CancelledError:
            call.cancel()  # the client went away: so does the backend call
            raise
        await _pass_initial_metadata(call, context)
        await _pass_reply_metadata(call, context)
        return response

    async def server_stream(
        self, channel: aio.Channel, path: str, request: bytes, context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        call = channel.unary_stream(path)(
            request, metadata=client_metadata(context), timeout=context.time_remaining()
        )
        async for message in self._relay_stream(call, path, context):
            yield message

    async def stream_stream(
        self, channel: aio.Channel, path: str, requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        call = channel.stream_stream(path)(
            requests, metadata=client_metadata(context), timeout=context.time_remaining()
        )
        async for message in self._relay_stream(call, path, context):
            yield message

    async def _relay_stream(self, call: aio.Call, path: str, context: aio.ServicerContext) -> AsyncIterator[bytes]:
        self._streams.add(call)
        try:
            if self._closing:  # started as shutdown began: end it like the others
                await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime-proxy is shutting down")
            await _pass_initial_metadata(call, context)
            async for message in call:  # type: ignore[attr-defined]
                yield message
            await _pass_reply_metadata(call, context)
        except aio.AioRpcError as err:
            if self._closing and err.code() == grpc.StatusCode.CANCELLED:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime-proxy is shutting down")
            await pass_error(context, err, path)
        except asyncio.CancelledError:
            if self._closing and not context.cancelled():
                await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime-proxy is shutting down")
            raise
        finally:
            self._streams.discard(call)
            # Client gone, generator closed or shutdown: never leave the
            # backend stream running.
            call.cancel()


async def _pass_initial_metadata(call: aio.Call, context: aio.ServicerContext) -> None:
    initial = _reply_metadata(await call.initial_metadata())
    if initial:
        await context.send_initial_metadata(initial)


async def _pass_reply_metadata(call: aio.Call, context: aio.ServicerContext) -> None:
    trailers = _reply_metadata(await call.trailing_metadata())
    if trailers:
        context.set_trailing_metadata(trailers)
