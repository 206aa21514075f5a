"""A :class:`hooks.sdk.HookServer`'s handlers as each transport serves them
(both importable from :mod:`hooks.sdk`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError, Message

from hooks import calllog
from hooks.errors import HookAbort
from hooks.frameserver import CallError, Route
from runtimeproxy.hookpath.points import HOOK_POINTS, HookPoint

if TYPE_CHECKING:
    from hooks.sdk import HookServer

__all__ = ["frame_routes", "service_handlers"]

logger = logging.getLogger("hooks.sdk")  # the SDK's: where its per-call lines go (hooks.calllog)


def service_handlers(server: HookServer) -> dict[str, grpc.RpcMethodHandler]:
    """One handler per hook point, keyed by RPC name; each calls ``server``."""

    def handler(point: HookPoint) -> grpc.RpcMethodHandler:
        async def call(request: Message, context: grpc.aio.ServicerContext) -> Message:
            return await server._dispatch(point.hook, request, context)

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
                response = await server._answer(point.hook, request)
            except HookAbort as exc:
                raise CallError(exc.code, exc.details) from exc
            return response.SerializeToString()

        return call

    return {point.full_method.encode(): route(point, point.request_type.FromString) for point in HOOK_POINTS.values()}


def _undecodable(point: HookPoint, message: bytes, exc: DecodeError) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        calllog.log_undecodable(logger, point.hook, point.full_method, len(message), exc)
