"""A :class:`hooks.sdk.HookServer`'s handlers as each transport serves them
(both importable from :mod:`hooks.sdk`), and the handler's answer to one
call that both give (:func:`answer`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError, Message

from hooks import calllog
from hooks.cancelled import log_cancelled
from hooks.errors import HookAbort
from hooks.frameserver import CallError, Route, deadline_passed
from runtimeproxy.hookpath.points import HOOK_POINTS, HookPoint, HookType

if TYPE_CHECKING:
    from hooks.sdk import HookServer

__all__ = ["answer", "frame_routes", "service_handlers"]

logger = logging.getLogger("hooks.sdk")  # the SDK's: where its per-call lines go (hooks.calllog)


def service_handlers(server: HookServer) -> dict[str, grpc.RpcMethodHandler]:
    """One handler per hook point, keyed by RPC name; each calls ``server``."""

    def handler(point: HookPoint) -> grpc.RpcMethodHandler:
        async def call(request: Message, context: grpc.aio.ServicerContext) -> Message:
            try:
                return await answer(server, point.hook, request,
                                    lambda: (left := context.time_remaining()) is not None and left <= 0)
            except HookAbort as exc:
                await context.abort(exc.code, exc.details)
                raise  # unreachable: abort raises

        parse = point.request_type.FromString

        def decode(message: bytes) -> Message:  # grpc.aio answers a failure itself, unseen by the handler
            try:
                return parse(message)
            except DecodeError as exc:
                _undecodable(point, message, exc)
                raise

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=decode,
            response_serializer=point.response_type.SerializeToString,
        )

    return {point.rpc_name: handler(point) for point in HOOK_POINTS.values()}


def frame_routes(server: HookServer) -> dict[bytes, Route]:
    """The same handlers for the frames transport, keyed by ``:path``."""

    def route(point: HookPoint, parse: Callable[[bytes], Message]) -> Route:  # parse: request_type's, read once
        async def call(message: bytes) -> bytes:
            try:
                request = parse(message)
            except DecodeError as exc:  # what grpc answers for a request it cannot parse
                _undecodable(point, message, exc)
                raise CallError(grpc.StatusCode.INTERNAL, f"cannot decode the {point.rpc_name} request: {exc}") from exc
            try:
                response = await answer(server, point.hook, request)
            except HookAbort as exc:
                raise CallError(exc.code, exc.details) from exc
            return response.SerializeToString()

        return call

    return {point.full_method.encode(): route(point, point.request_type.FromString) for point in HOOK_POINTS.values()}


async def answer(server: HookServer, hook: HookType, request: Message,
                 past_deadline: Callable[[], bool] = deadline_passed) -> Message:
    """``server``'s handler's answer to one call, whatever the transport; a
    failure as HookAbort. Each call logged at debug (``hooks.calllog``)."""
    point = HOOK_POINTS[hook]
    started = time.monotonic()
    try:
        response = await server.handle(hook, request)
    except HookAbort as exc:
        if exc.code is grpc.StatusCode.OK:  # an abort that is no error: grpc.aio would never answer it
            _failed(hook, request, started, grpc.StatusCode.INTERNAL)
            raise HookAbort(grpc.StatusCode.INTERNAL, f"{hook.value} hook aborted with status OK") from exc
        _failed(hook, request, started, exc.code)
        raise
    except asyncio.CancelledError:  # else a handler too slow for its hook file's timeout fails unseen here
        ran_s, deadline = time.monotonic() - started, past_deadline()
        log_cancelled(logger, hook, ran_s, deadline)
        if logger.isEnabledFor(logging.DEBUG):
            calllog.log_call(logger, hook, request, ran_s, calllog.DEADLINE_EXCEEDED if deadline else calllog.CANCELLED)
        raise
    except Exception as exc:
        logger.exception("%s hook handler failed", hook.value, extra={"hook": hook.value})
        _failed(hook, request, started, grpc.StatusCode.INTERNAL)
        raise HookAbort(grpc.StatusCode.INTERNAL, f"{hook.value} hook failed: {exc}") from exc
    if response is None:
        response = point.response_type()
    elif not isinstance(response, point.response_type):
        logger.error(
            "%s hook handler returned %s, expected %s",
            hook.value,
            type(response).__name__,
            point.response_type.__name__,
            extra={"hook": hook.value},
        )
        _failed(hook, request, started, grpc.StatusCode.INTERNAL)
        raise HookAbort(
            grpc.StatusCode.INTERNAL,
            f"{hook.value} hook handler returned {type(response).__name__}, "
            f"expected {point.response_type.__name__}",
        )
    if logger.isEnabledFor(logging.DEBUG):  # the level's cached check: all an answered call costs while off
        calllog.log_call(logger, hook, request, time.monotonic() - started, calllog.ANSWERED)
    return response


def _undecodable(point: HookPoint, message: bytes, exc: DecodeError) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        calllog.log_undecodable(logger, point.hook, point.full_method, len(message), exc)


def _failed(hook: HookType, request: Message, started: float, code: grpc.StatusCode) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        calllog.log_call(logger, hook, request, time.monotonic() - started, calllog.ERROR, code)
