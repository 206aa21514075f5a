"""A small SDK to write a hook server (the hook service of ``runtimeproxy.hookpath.points``) on grpc.aio.

Subclass :class:`HookServer` and override the handlers of the hooks you care
about; every other hook answers an empty response, which means "no change"::

    from cri_api.hookapi import api_pb2
    from hooks.sdk import HookServer, write_hook_config

    class CpuSharesHook(HookServer):
        async def pre_create_container(self, request):
            resources = api_pb2.LinuxContainerResources()
            resources.CopyFrom(request.container_resources)
            resources.cpu_shares = 512
            return api_pb2.ContainerResourceHookResponse(container_resources=resources)

    async def main():
        async with CpuSharesHook("/run/cpushares-hook.sock") as server:
            write_hook_config("/etc/runtime/hookserver.d", "cpushares", server.socket_path,
                              ["PreCreateContainer"], failure_policy="Fail", timeout="1s")
            await server.wait_for_termination()

Handlers are ``async def name(self, request) -> Response | None``; ``None``
means an empty response.  Raise :class:`HookAbort` to answer a specific gRPC
status; any other exception answers ``INTERNAL`` with the exception text.
To handle every hook generically, override :meth:`HookServer.handle` instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2
from hooks.registration import write_hook_config
from runtimeproxy.hookpath.points import HOOK_POINTS, SERVICE_NAME, HookPoint, HookType
from runtimeproxy.host import unixsocket

__all__ = [
    "HookAbort",
    "HookServer",
    "HookServerError",
    "service_handlers",
    "write_hook_config",
]

logger = logging.getLogger(__name__)


class HookAbort(Exception):
    """Raise from a handler to answer the call with a specific gRPC status."""

    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.INTERNAL, details: str = "") -> None:
        super().__init__(details or code.name)
        self.code = code
        self.details = details


class HookServerError(RuntimeError):
    """The hook server could not start (socket in use, bad path...)."""


def service_handlers(server: HookServer) -> dict[str, grpc.RpcMethodHandler]:
    """One handler per hook point, keyed by RPC name; each calls ``server``."""

    def handler(point: HookPoint) -> grpc.RpcMethodHandler:
        async def call(request: Message, context: grpc.aio.ServicerContext) -> Message:
            return await server._dispatch(point.hook, request, context)

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=point.request_type.FromString,
            response_serializer=point.response_type.SerializeToString,
        )

    return {point.rpc_name: handler(point) for point in HOOK_POINTS.values()}


# A hook request is as large as the CRI call it comes from, and kubelet sends
# up to 16 MiB: grpc's default of 4 MiB would fail a Fail hook's pods.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)


class HookServer:
    """A ``RuntimeHookService`` server on a unix socket.

    Override the handlers below (or :meth:`handle`).  Lifecycle: ``await
    start()`` / ``await stop(grace)``, or ``async with``.  ``start`` follows
    the proxy's socket rules (``runtimeproxy.host.unixsocket``): it removes a
    stale socket file (one nobody listens on) but refuses a live socket, one
    whose state a connect cannot tell, or a non-socket file; the socket is
    chmod-ed to ``socket_mode``.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        socket_mode: int = 0o660,
        grace: float | None = 1.0,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        self._socket_path = Path(socket_path).absolute()
        unixsocket.check_path_length(self._socket_path)  # a ValueError
        self._socket_mode = socket_mode
        self._grace = grace
        # Later options win: the caller's replace the defaults.
        self._options = list({**dict(DEFAULT_OPTIONS), **dict(options or ())}.items())
        self._server: grpc.aio.Server | None = None
        self._socket_identity: unixsocket.SocketIdentity | None = None

    # -- handlers: override the ones you need ----------------------------------

    async def pre_run_pod_sandbox(self, request: api_pb2.PodSandboxHookRequest) -> api_pb2.PodSandboxHookResponse | None:
        return None

    async def post_stop_pod_sandbox(
        self, request: api_pb2.PodSandboxHookRequest
    ) -> api_pb2.PodSandboxHookResponse | None:
        return None

    async def pre_create_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def pre_start_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def post_start_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def post_stop_container(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def pre_update_container_resources(
        self, request: api_pb2.ContainerResourceHookRequest
    ) -> api_pb2.ContainerResourceHookResponse | None:
        return None

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        """Generic entry point of every call; by default dispatches to the handler method."""
        return await getattr(self, HOOK_POINTS[hook].handler_name)(request)

    # -- lifecycle ---------------------------------------------------------------

    @property
    def socket_path(self) -> str:
        """The absolute socket path (what goes into a hook file's "remote-endpoint")."""
        return str(self._socket_path)

    @property
    def target(self) -> str:
        """The gRPC target to dial this server: ``unix:///path``."""
        return f"unix://{self._socket_path}"

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            raise HookServerError("hook server already started")
        path = self._socket_path
        try:
            unixsocket.prepare(path)
        except unixsocket.UnixSocketError as exc:
            raise HookServerError(str(exc)) from exc

        server = grpc.aio.server(options=self._options)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, service_handlers(self)),))
        try:
            if server.add_insecure_port(self.target) == 0:  # older grpcio signal failure this way
                raise RuntimeError("bind failed")
        except RuntimeError as exc:
            raise HookServerError(f"cannot listen on {path}: {exc}") from exc
        await server.start()
        try:
            os.chmod(path, self._socket_mode)
            self._socket_identity = unixsocket.SocketIdentity.of(path)
        except OSError:
            await server.stop(None)
            raise
        self._server = server
        logger.info("hook server listening on %s", path, extra={"socket": str(path)})

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving; in-flight calls get ``grace`` seconds (default: the constructor's)."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(self._grace if grace is None else grace)
        # Remove our socket, unless someone else has replaced it meanwhile.
        unixsocket.remove_own(self._socket_path, self._socket_identity)
        self._socket_identity = None

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Wait until the server stops; returns True on timeout (like grpc)."""
        if self._server is None:
            return False
        return await self._server.wait_for_termination(timeout)

    async def __aenter__(self) -> HookServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- dispatch ------------------------------------------------------------------

    async def _dispatch(self, hook: HookType, request: Message, context: grpc.aio.ServicerContext) -> Message:
        point = HOOK_POINTS[hook]
        try:
            response = await self.handle(hook, request)
        except HookAbort as exc:
            await context.abort(exc.code, exc.details)
            raise  # unreachable: abort raises
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("%s hook handler failed", hook.value, extra={"hook": hook.value})
            await context.abort(grpc.StatusCode.INTERNAL, f"{hook.value} hook failed: {exc}")
            raise  # unreachable
        if response is None:
            return point.response_type()
        if not isinstance(response, point.response_type):
            logger.error(
                "%s hook handler returned %s, expected %s",
                hook.value,
                type(response).__name__,
                point.response_type.__name__,
                extra={"hook": hook.value},
            )
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"{hook.value} hook handler returned {type(response).__name__}, "
                f"expected {point.response_type.__name__}",
            )
        return response
