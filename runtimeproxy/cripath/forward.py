"""Relaying one gRPC call to the backend as raw bytes.

This is the only place that issues backend calls. The router hands it a
backend path, the client's request bytes (or request stream) and the server
context; it never decodes a message. A frame-level fast path for unhooked
calls can replace :class:`GrpcRelay` behind the :class:`Relay` protocol
without touching routing or hooks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from typing import Any, NoReturn, Protocol

import grpc
from grpc import aio
from grpc._cython import cygrpc

from .stage import Send

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


def _reply_metadata(md: Iterable[tuple[str, str | bytes]] | None) -> tuple[tuple[str, str | bytes], ...]:
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


async def pass_error(context: aio.ServicerContext, err: aio.AioRpcError, path: str, outage: bool = False) -> NoReturn:
    """End the client's call with the backend's status, details and trailers.
    ``outage``: the runtime is known lost, its outage logged apart (backend.py):
    an UNAVAILABLE is then a debug line, not a warning per call."""
    if outage and err.code() == grpc.StatusCode.UNAVAILABLE:
        level = logging.DEBUG
    else:
        level = logging.WARNING if err.code() in _RUNTIME_TROUBLE else logging.INFO
    log.log(level, "call failed", extra={"method": path, "code": err.code().name, "error": err.details()})
    trailers = _reply_metadata(err.trailing_metadata())
    if trailers:
        context.set_trailing_metadata(trailers)
    await context.abort(err.code(), err.details() or "")
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


async def _pass_runtime_error(
    context: aio.ServicerContext, err: aio.AioRpcError, path: str, unprobed: Callable[[], bool],
    probe_soon: Callable[[], None],
) -> NoReturn:
    """``pass_error``, but UNIMPLEMENTED from a runtime lost and not probed
    again is UNAVAILABLE: a restarted runtime may no longer serve the CRI
    version the call is routed in (the re-probe routes it anew), and kubelet
    retries UNAVAILABLE. A probed runtime's UNIMPLEMENTED (a method it lacks)
    is passed on as it is. Only calls this relay re-issues: on the frames
    path a call relayed verbatim gets the runtime's own answer (routes.py).
    Either way the re-probe comes sooner (``probe_soon``: Backend.probe_soon)."""
    if err.code() == grpc.StatusCode.UNIMPLEMENTED and unprobed():
        probe_soon()
        log.info("call failed", extra={"method": path, "code": err.code().name, "error": err.details(),
                                       "answered": "UNAVAILABLE, the runtime is not probed since it was lost"})
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"runtime-proxy: the runtime is not probed since it was lost, and answered UNIMPLEMENTED: {err.details()}",
        )
    await pass_error(context, err, path, outage=unprobed())


# Set by a caller that must know when its unary backend call has been sent,
# not just scheduled (the hook path releases a stop's per-object order then).
# The relay calls it, in the task that makes the call, once grpc has written
# the request; a relay that never calls it only makes such a caller wait for
# the whole call.
call_issued: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "runtimeproxy_call_issued", default=None
)


async def issue(send: Send, request: bytes) -> asyncio.Task[bytes]:
    """Start the backend call and return once the relay has sent its request
    (``forward.call_issued``), or once it ended without getting there
    (refused, failed): whatever is sent on this object next reaches the
    runtime after it."""
    loop = asyncio.get_running_loop()
    issued: asyncio.Future[None] = loop.create_future()

    def notify() -> None:
        if not issued.done():
            issued.set_result(None)

    token = call_issued.set(notify)
    try:
        backend_call = asyncio.ensure_future(send(request))  # the task sees ``notify``
    finally:
        call_issued.reset(token)
    # Its end counts as issued too: one future awaited, not asyncio.wait's two.
    backend_call.add_done_callback(lambda _: notify())
    try:
        await issued
    except asyncio.CancelledError:
        backend_call.cancel()  # the client left before the stop was issued
        raise
    return backend_call


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

    def __init__(self, unprobed: Callable[[], bool] = lambda: False,
                 probe_soon: Callable[[], None] = lambda: None,
                 failed: Callable[[aio.Channel, aio.AioRpcError], None] = lambda channel, err: None) -> None:
        """``unprobed``: whether the runtime was lost and is not probed again yet (Backend.unprobed);
        ``probe_soon``: Backend.probe_soon; ``failed``: told each call that
        failed at the runtime, with its channel (Backend.runtime_failed)."""
        self._unprobed = unprobed
        self._probe_soon = probe_soon
        self._failed = failed
        # Open backend streams, so that shutdown can end them instead of
        # waiting out the grace period on calls that never finish.
        self._streams: set[aio.Call] = set()
        self._closing = False

    def end_streams(self) -> None:
        self._closing = True
        for call in list(self._streams):
            call.cancel()

    async def unary(self, channel: aio.Channel, path: str, request: bytes, context: aio.ServicerContext) -> bytes:
        notify = call_issued.get()
        if notify is not None:
            return await self._unary_telling_sent(channel, path, request, context, notify)
        call = channel.unary_unary(path)(
            request, metadata=client_metadata(context), timeout=context.time_remaining()
        )

        async def answer() -> bytes:
            return await call

        return await _unary_answer(call, answer(), path, context, self._unprobed, self._probe_soon,
                                   channel, self._failed)

    async def _unary_telling_sent(
        self, channel: aio.Channel, path: str, request: bytes, context: aio.ServicerContext, notify: Callable[[], None]
    ) -> bytes:
        """A unary call that tells ``notify`` once its request is sent.

        grpc.aio only says when a request has been written for a call that
        streams its requests, so this one is made as such: the same frames
        on the wire (headers, one message, end of stream), and grpc completes
        each write once it has gone to the connection. Calls on one
        connection reach the runtime in the order they were written.
        """
        call = channel.stream_stream(path)(metadata=client_metadata(context), timeout=context.time_remaining())

        async def answer() -> bytes:
            await send_requests(call, _just(request), path)
            notify()
            responses = [message async for message in call]
            if len(responses) != 1:
                await context.abort(
                    grpc.StatusCode.INTERNAL,
                    f"runtime-proxy: the runtime answered a unary call with {len(responses)} messages",
                )
            return responses[0]

        return await _unary_answer(call, answer(), path, context, self._unprobed, self._probe_soon,
                                   channel, self._failed)

    async def server_stream(
        self, channel: aio.Channel, path: str, request: bytes, context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        call = channel.unary_stream(path)(
            request, metadata=client_metadata(context), timeout=context.time_remaining()
        )
        async for message in self._relay_stream(call, channel, path, context):
            yield message

    async def stream_stream(
        self, channel: aio.Channel, path: str, requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        # No request iterator for grpc.aio: send_requests copies them (see there).
        call = channel.stream_stream(path)(metadata=client_metadata(context), timeout=context.time_remaining())
        sender = asyncio.ensure_future(send_requests(call, requests, path))
        try:
            async for message in self._relay_stream(call, channel, path, context):
                yield message
        finally:
            sender.cancel()

    async def _relay_stream(
        self, call: aio.Call, channel: aio.Channel, path: str, context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self._streams.add(call)
        try:
            if self._closing:  # started as shutdown began: end it like the others
                await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime-proxy is shutting down")
            await _pass_initial_metadata(call, context)
            async for message in call:
                yield message
            await _pass_reply_metadata(call, context)
        except aio.AioRpcError as err:
            if self._closing and err.code() == grpc.StatusCode.CANCELLED:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime-proxy is shutting down")
            self._failed(channel, err)
            await _pass_runtime_error(context, err, path, self._unprobed, self._probe_soon)
        except asyncio.CancelledError:
            # end_streams cancelled the backend call (grpc.aio raises
            # CancelledError for a locally cancelled call): tell the client to
            # retry. But if this handler itself is being cancelled (its
            # client left, or the server's grace period ran out), the
            # cancellation must go on: no answer, no swallowing it.
            task = asyncio.current_task()
            if self._closing and not context.cancelled() and not (task is not None and task.cancelling()):
                await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime-proxy is shutting down")
            raise
        finally:
            self._streams.discard(call)
            # Client gone, generator closed or shutdown: never leave the
            # backend stream running.
            call.cancel()


async def send_requests(call: aio.StreamStreamCall, requests: AsyncIterator[bytes], path: str) -> None:
    """Copy the client's messages to the backend call, then half-close it.

    Not grpc.aio's request-iterator consumer (nor ``call.write``): when the
    backend ends a call while a message is still on its way (a runtime that
    answers an unknown method UNIMPLEMENTED at once), the write fails, and
    grpc.aio then stamps INTERNAL "Internal error from Core" on the call; if
    that happens before the backend's own status is handed over, the relay
    reads INTERNAL instead of the backend's answer (grpc/grpc#36066). Writing
    through the call's core object, a failed write changes nothing: the
    backend's status arrives on the response side, as it was sent.
    """
    core_call = call._cython_call  # noqa: SLF001 - the write without the status stamp, see above
    try:
        await call.wait_for_connection()  # headers sent: messages may follow
        async for message in requests:
            await core_call.send_serialized_message(message)
        await core_call.send_receive_close()
    except (cygrpc.InternalError, aio.AioRpcError):
        # The backend ended the call (or it was cancelled): nothing more to
        # send, and the call's status says how it ended.
        return
    except Exception:  # the client's stream broke: end the backend call too
        log.debug("client request stream failed", extra={"method": path}, exc_info=True)
        call.cancel()


async def _unary_answer(
    call: aio.Call, answer: Coroutine[Any, Any, bytes], path: str, context: aio.ServicerContext,
    unprobed: Callable[[], bool], probe_soon: Callable[[], None],
    channel: aio.Channel, failed: Callable[[aio.Channel, aio.AioRpcError], None],
) -> bytes:
    """The backend's one answer, with its metadata, or its status passed on
    (``failed`` told first)."""
    try:
        response = await answer
    except aio.AioRpcError as err:
        failed(channel, err)
        await _pass_initial_metadata(call, context)
        await _pass_runtime_error(context, err, path, unprobed, probe_soon)
    except asyncio.CancelledError:
        call.cancel()  # the client went away: so does the backend call
        raise
    await _pass_initial_metadata(call, context)
    await _pass_reply_metadata(call, context)
    return response


async def _just(message: bytes) -> AsyncIterator[bytes]:
    yield message


async def _pass_initial_metadata(call: aio.Call, context: aio.ServicerContext) -> None:
    initial = _reply_metadata(await call.initial_metadata())
    if initial:
        await context.send_initial_metadata(initial)


async def _pass_reply_metadata(call: aio.Call, context: aio.ServicerContext) -> None:
    trailers = _reply_metadata(await call.trailing_metadata())
    if trailers:
        context.set_trailing_metadata(trailers)
