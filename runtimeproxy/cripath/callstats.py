"""Counting and timing every CRI call where the router hands it to its handler.

The router wraps each handler once, when its table is built, so the hot path
pays a clock read, a gauge step and one counter increment per call; nothing
is decoded. The status code is what the handler ended the call with: OK,
the code it aborted with (the backend's, a hook's, a refusal's), CANCELLED
when the client left (also when it left while the handler's status was being
sent: grpc raises ExecuteBatchError for that send), UNKNOWN for an unexpected
exception (what grpc sends).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from grpc import aio
from grpc._cython import cygrpc

from .methods import MethodRef


class CallSink(Protocol):
    """Where measured calls go (runtimeproxy.metrics.CriCallMetrics)."""

    def started(self) -> None: ...

    def recorder(self, ref: MethodRef) -> Callable[[str, float], None]:
        """A function ``(code, seconds)`` for one method and client version
        (labelled as ``methods.metric_ref`` says), bound once per routing
        table (label lookups stay off the hot path)."""
        ...

    def frames_connection(self, path: str, opened: bool) -> None:
        """A client connection of the frames data path began (``opened``) or
        ended: ``path`` ``relayed`` (a runtime connection of its own) or
        ``spliced`` (the proxy's own server answers it: the runtime could not
        be reached)."""
        ...


def _code(context: aio.ServicerContext, default: str) -> str:
    code = context.code()  # set by abort() and set_code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return default


def measured(handler: grpc.RpcMethodHandler, ref: MethodRef, sink: CallSink) -> grpc.RpcMethodHandler:
    """``handler`` with every call counted by method, version and code."""
    record = sink.recorder(ref)
    started = sink.started

    # The router's handlers are stream-unary (its unary methods: it reads their
    # request stream itself) or stream-stream (the rest, refusals included).
    if handler.stream_unary is not None:
        inner = handler.stream_unary

        async def unary(request: Any, context: aio.ServicerContext) -> Any:
            started()
            begin = time.perf_counter()
            code = "UNKNOWN"
            try:
                reply = await inner(request, context)
                code = _code(context, "OK")
                return reply
            except aio.AbortError:
                code = _code(context, "UNKNOWN")
                raise
            except (asyncio.CancelledError, cygrpc.ExecuteBatchError):
                code = "CANCELLED"
                raise
            finally:
                record(code, time.perf_counter() - begin)

        return grpc.stream_unary_rpc_method_handler(unary)

    def wrap_stream(inner: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def stream(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            started()
            begin = time.perf_counter()
            code = "UNKNOWN"
            try:
                async for message in inner(request, context):
                    yield message
                code = _code(context, "OK")
            except aio.AbortError:
                code = _code(context, "UNKNOWN")
                raise
            except (asyncio.CancelledError, GeneratorExit, cygrpc.ExecuteBatchError):
                code = "CANCELLED"
                raise
            finally:
                record(code, time.perf_counter() - begin)

        return stream

    return grpc.stream_stream_rpc_method_handler(wrap_stream(handler.stream_stream))
