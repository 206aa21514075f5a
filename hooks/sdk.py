"""A small SDK to write a hook server (the hook service of ``runtimeproxy.hookpath.points``).

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

    async def main():  # README's "Writing a hook server" also stops it on SIGTERM
        async with CpuSharesHook("/run/cpushares-hook.sock") as server:
            registration = write_hook_config("/etc/runtime/hookserver.d", "cpushares", server.socket_path,
                                             ["PreCreateContainer"], failure_policy="Fail", timeout="1s")
            try:
                await server.wait_for_termination()
            finally:  # a registration left behind has a Fail hook refuse every call
                registration.unlink()

    run(main())  # on uvloop when it is installed, as the proxy; asyncio.run(main()) works too

Handlers are ``async def name(self, request) -> Response | None``; ``None``
means an empty response. A plain ``def`` handler, or a method named as a gRPC
servicer's (``PreCreateContainerHook``) or as the hook point, which the SDK
would never call, is a ``TypeError`` when the class is defined.  Raise :class:`HookAbort` to answer a specific gRPC
status; any other exception answers ``INTERNAL`` with the exception text.
To handle every hook generically, override :meth:`HookServer.handle` instead.

The server speaks gRPC on the SDK's own HTTP/2 transport (``hooks.frameserver``,
``transport="frames"``, the default): about half of grpc.aio's CPU per
call, which on a small node is taken from the runtime while pods start.
``transport="grpc"`` serves on grpc.aio instead; handlers see no difference.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from cri_api.hookapi import api_pb2
from hooks import calllog, runscope, unregistered
from hooks.cancelled import log_cancelled
from hooks.errors import HookAbort, HookServerError, SocketPathError
from hooks.frameserver import FrameServer, deadline_passed
from hooks.handlers import check_handlers, handled_hooks
from hooks.routes import frame_routes, service_handlers
from hooks.registration import write_hook_config
from runtimeproxy import eventloop, logs
from runtimeproxy.grpcstart import start_server
from runtimeproxy.hookpath.points import HOOK_POINTS, SERVICE_NAME, HookType
from runtimeproxy.host import socketlock, unixsocket

__all__ = [
    "HookAbort",
    "HookServer",
    "HookServerError",
    "SocketPathError",
    "TRANSPORTS",
    "ChainHook",
    "check_answer",
    "check_chain",
    "frame_routes",
    "run",
    "service_handlers",
    "write_hook_config",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)


TRANSPORTS = ("frames", "grpc")

# A stop takes its grace and at most about this much more (closing the
# connections, then the listener); ``hook run``'s --drain comes before it,
# while the socket still answers (a new server is refused then, not waiting).
STOP_PAST_GRACE_S = 1.0


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
    chmod-ed to ``socket_mode``. From ``start`` to the end of ``stop`` it
    holds the path's lock (``runtimeproxy.host.socketlock``): another server
    starting on the path is refused naming this one's pid, or, while this one
    stops, waits for it: as long as a stop with the constructor's ``grace``
    may take (recorded in the lock file, and again by a ``stop`` passed a
    longer one), when that is longer than its own wait.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        socket_mode: int = 0o660,
        grace: float | None = 1.0,
        options: Sequence[tuple[str, Any]] | None = None,
        transport: str = "frames",
    ) -> None:
        self._server: grpc.aio.Server | FrameServer | None = None
        self.transport = transport  # checked there
        self._socket_path = Path(socket_path).absolute()
        unixsocket.check_path_length(self._socket_path)  # a ValueError
        if (problem := unixsocket.dial_problem(self._socket_path)) is not None:  # the proxy dials it: now, not once bound
            raise unixsocket.UndialablePath(f"cannot serve hooks at {self._socket_path}: {problem}")
        self._socket_mode = socket_mode
        self._grace = grace
        # Later options win: the caller's replace the defaults. The frames
        # transport reads the two message limits of them; the rest are grpc's.
        self._options = list({**dict(DEFAULT_OPTIONS), **dict(options or ())}.items())
        self._socket_identity: unixsocket.SocketIdentity | None = None
        self._path_lock: socketlock.SocketLock | None = None
        self._run_scope: runscope.RunScope | None = None  # started under hooks.sdk.run: told as it stops

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Misnamed or plain ``def`` handlers: a ``TypeError`` now, not at each call (``hooks.handlers``)."""
        super().__init_subclass__(**kwargs)
        check_handlers(cls, HookServer)

    @property
    def handled_hooks(self) -> tuple[HookType, ...]:
        """The hook points whose handlers this class defines, for its hook file (none with ``handle`` alone)."""
        return tuple(handled_hooks(type(self), HookServer))

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
        return unixsocket.grpc_target(self._socket_path)

    @property
    def transport(self) -> str:
        """``frames`` or ``grpc``; settable until the server starts."""
        return self._transport

    @transport.setter
    def transport(self, value: str) -> None:
        if value not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {value!r}")
        if self._server is not None:
            raise HookServerError("the transport of a serving hook server cannot change")
        self._transport = value

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            raise HookServerError("hook server already started")
        path = self._socket_path
        try:
            lock = await socketlock.claim(path, stop_s=(self._grace or 0.0) + STOP_PAST_GRACE_S)
        except unixsocket.UnusablePath as exc:
            raise SocketPathError(str(exc)) from exc
        except unixsocket.UnixSocketError as exc:
            raise HookServerError(str(exc)) from exc
        try:
            server = await (self._start_frames(path) if self._transport == "frames" else self._start_grpc(path))
            try:
                os.chmod(path, self._socket_mode)
                self._socket_identity = unixsocket.SocketIdentity.of(path)
            except OSError:
                await server.stop(None)
                raise
        except BaseException:
            lock.release()
            raise
        self._path_lock = lock
        self._server = server
        logger.info("hook server listening on %s", path, extra={"socket": str(path), "transport": self._transport})
        unregistered.serving(str(path), handled_hooks(type(self), HookServer))  # a handler no hook file lists: warned
        self._run_scope = runscope.served(str(path))  # under hooks.sdk.run: its hook files removed as it stops

    async def _start_grpc(self, path: Path) -> grpc.aio.Server:
        server = grpc.aio.server(options=self._options)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, service_handlers(self)),))
        try:
            if server.add_insecure_port(unixsocket.grpc_address(path)) == 0:  # older grpcio signal failure this way
                raise RuntimeError("bind failed")
        except RuntimeError as exc:
            raise HookServerError(f"cannot listen on {path}: {exc}") from exc
        # A start cut short stops it: its listener must not outlive it (nor grpc's unlink at its end).
        await start_server(server)
        return server

    async def _start_frames(self, path: Path) -> FrameServer:
        options = dict(self._options)
        server = FrameServer(
            frame_routes(self),
            max_receive=_limit(options.get("grpc.max_receive_message_length")),
            max_send=_limit(options.get("grpc.max_send_message_length")),
        )
        try:
            await server.start(path)
        except OSError as exc:
            raise HookServerError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
        return server

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving; in-flight calls get ``grace`` seconds (default: the constructor's)."""
        server, self._server = self._server, None
        if server is None:
            return
        unregistered.stopped(str(self._socket_path))
        scope, self._run_scope = self._run_scope, None
        if scope is not None:  # first, listener open and lock held: the proxy stops calling before we stop answering
            scope.stopping(str(self._socket_path))
        grace = self._grace if grace is None else grace
        if self._path_lock is not None:  # a longer grace than the constructor's: a waiting server waits as long
            self._path_lock.record_longer_stop((grace or 0.0) + STOP_PAST_GRACE_S)
        try:
            await server.stop(grace)
        finally:  # a stop that failed or was cut short (a caller's timeout) too: a second stop does nothing
            # The server stopped for sure (grpc unlinks the path it bound as it
            # stops), then our socket removed, unless someone else has replaced
            # it, last the lock: a server waiting on it binds now.
            await socketlock.release_once_stopped(
                lambda: server.stop(None), self._path_lock, self._socket_path, self._socket_identity)
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
        try:
            return await self._answer(hook, request, lambda: (left := context.time_remaining()) is not None and left <= 0)
        except HookAbort as exc:
            await context.abort(exc.code, exc.details)
            raise  # unreachable: abort raises

    async def _answer(self, hook: HookType, request: Message, past_deadline: Callable[[], bool] = deadline_passed
                      ) -> Message:
        """The handler's answer to one call, whatever the transport; a failure
        as HookAbort. Each call logged at debug (``hooks.calllog``)."""
        point = HOOK_POINTS[hook]
        started = time.monotonic()
        try:
            response = await self.handle(hook, request)
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


def run(main: Coroutine[Any, Any, T], event_loop: str = "auto") -> T:
    """``asyncio.run(main)``, on uvloop when it is installed (``event_loop``:
    auto, asyncio or uvloop): a hook call then costs the server about a quarter
    less CPU, taken from the runtime while pods start. Lines no handler takes
    go to stderr at info, in the proxy's format (logs.unless_configured). The
    hook files written during it for a server started during it are removed
    as that server stops, or as ``run`` ends (``hooks.runscope``)."""
    with logs.unless_configured(), runscope.scope():
        return eventloop.run(main, event_loop)


def __getattr__(name: str) -> Any:
    if name == "check_answer":  # imported when asked for: the proxy's hook path, which a server never needs
        from hooks.answercheck import check_answer
        return check_answer
    if name in ("check_chain", "ChainHook"):
        from hooks import chaincheck
        return getattr(chaincheck, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _failed(hook: HookType, request: Message, started: float, code: grpc.StatusCode) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        calllog.log_call(logger, hook, request, time.monotonic() - started, calllog.ERROR, code)


def _limit(value: object) -> int:
    """A grpc message-length option as the frames transport takes it (-1, grpc's "no limit", is 2^31-1)."""
    size = int(value) if isinstance(value, int) else MAX_MESSAGE_BYTES
    return (1 << 31) - 1 if size < 0 else size
