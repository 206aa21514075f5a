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
                registration.unlink(missing_ok=True)  # (under run(), the server's stop removed it)

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
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, final

import grpc

from hooks import listen, releasestep, runscope, stopping, unregistered
from hooks.errors import HookAbort, HookServerError, SocketPathError
from hooks.frameserver import FrameServer
from hooks.handlers import HookHandlers, check_handlers, handled_hooks
from hooks.routes import frame_routes, service_handlers  # the SDK's own names too
from hooks.registration import write_hook_config
from hooks.sharedrun import SharedRun
from runtimeproxy import eventloop, logs
from runtimeproxy.hookpath.points import HookType
from runtimeproxy.host import socketlock, unixsocket

if TYPE_CHECKING:  # imported when asked for (__getattr__ below); named here for linters and type checkers
    from hooks.answercheck import check_answer
    from hooks.chaincheck import ChainHook, check_chain

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

# A stop's timings (stopping.py), importable from here as before they moved.
STOP_PAST_GRACE_S, DEFAULT_DRAIN_S = stopping.STOP_PAST_GRACE_S, stopping.DEFAULT_DRAIN_S

# The listeners' (listen.py), importable from here as before it was.
MAX_MESSAGE_BYTES, DEFAULT_OPTIONS = listen.MAX_MESSAGE_BYTES, listen.DEFAULT_OPTIONS


class HookServer(HookHandlers):
    """A ``RuntimeHookService`` server on a unix socket.

    Override the handlers of :class:`hooks.handlers.HookHandlers` (or :meth:`handle`).  Lifecycle: ``await
    start()`` / ``await stop(grace)``, or ``async with``; ``start`` again
    once a stop has ended (while one is under way it is refused); a start
    while another is under way waits for it and shares its outcome, as a
    second stop waits for the first.  A stop of a server
    registered under :func:`run` removes its hook file, keeps answering new
    calls for ``drain`` seconds while the proxy notices (so does any server
    whose ``drain`` is set), then closes its listener and gives the calls in
    flight ``grace`` seconds (:meth:`stop`).  ``start`` follows
    the proxy's socket rules (``runtimeproxy.host.unixsocket``): it removes a
    stale socket file (one nobody listens on) but refuses a live socket, one
    whose state a connect cannot tell, or a non-socket file; the socket is
    chmod-ed to ``socket_mode``. From ``start`` to the end of ``stop`` it
    holds the path's lock (``runtimeproxy.host.socketlock``): another server
    starting on the path is refused naming this one's pid, or, while this one
    stops, waits for it: as long as a stop with the constructor's ``grace``
    may take (recorded in the lock file, and again by a ``stop`` passed a
    longer one), when that is longer than its own wait.

    Two steps run under that lock, for a server that keeps state on disk
    (files another instance of it, waiting on the lock, reads at its start):
    :meth:`_before_serving`, once the lock is claimed and before the socket
    is bound (read the state, clean up what a killed instance left), and
    :meth:`_before_release`, once the server has stopped (or a start failed
    after :meth:`_before_serving`) and before the lock goes (finish the
    state writes: one landing later could overwrite, or be removed by, the
    next instance's), cut past ``release_step_timeout`` seconds (``hooks.releasestep``)."""

    release_step_timeout: float = releasestep.RELEASE_STEP_TIMEOUT_S

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        socket_mode: int = 0o660,
        grace: float | None = 1.0,
        drain: float | None = None,
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
        self._drain = stopping.checked_drain(drain)  # None: DEFAULT_DRAIN_S when run registered it, else none
        # Later options win: the caller's replace the defaults. The frames
        # transport reads the two message limits of them; the rest are grpc's.
        self._options = list({**dict(DEFAULT_OPTIONS), **dict(options or ())}.items())
        self._socket_identity: unixsocket.SocketIdentity | None = None
        self._path_lock: socketlock.SocketLock | None = None
        self._run_scope: runscope.RunScope | None = None  # started under hooks.sdk.run: told as it stops
        self._stopping: asyncio.Future[None] | None = None  # done once the stop under way has ended
        self._starting = SharedRun(f"the start of the hook server on {self._socket_path}")  # one claims the lock
        self._last_step = releasestep.LastStep()  # its bound, and a write the last stop's lock waits for

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Misnamed or plain ``def`` handlers: a ``TypeError`` now, not at each call (``hooks.handlers``)."""
        super().__init_subclass__(**kwargs)
        check_handlers(cls, HookServer)
        if cls.stop is not HookServer.stop:  # its checks come first (a negative drain): an override would stop
            # before them. Not `"stop" in vars(cls)`: a mixin's stop, listed before HookServer, overrides too.
            raise TypeError(f"{cls.__qualname__}.stop overrides HookServer.stop: override _before_stop or "
                            "_after_stop instead (each runs at every stop, whatever the rest did)")

    @property
    def handled_hooks(self) -> tuple[HookType, ...]:
        """The hook points whose handlers this class defines, for its hook file (none with ``handle`` alone)."""
        return tuple(handled_hooks(type(self), HookServer))

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
        await self._starting.run(self._start)  # a start under way: this one waits for it, and shares its outcome

    async def _start(self) -> None:
        if self._server is not None:
            raise HookServerError("hook server already started")
        if self._stopping is not None and not self._stopping.done():  # it holds the path's lock until it ends
            raise HookServerError(f"hook server on {self._socket_path} is still stopping: start it again once its "
                                  "stop has ended (await stop() or wait_for_termination() first)")
        kept = self._last_step.kept
        if kept is not None and (not kept.done() or kept.cancelled()):
            raise HookServerError(f"hook server on {self._socket_path} keeps its socket's lock until a write of "
                                  "its last release step (at a stop or a failed start), or a read its cut start left "
                                  "running, has ended (logged then; a write cancelled, not ended: until this "
                                  "process exits)")
        path = self._socket_path
        try:
            lock = await socketlock.claim(path, stop_s=stopping.stop_bound(self._grace, self.release_step_timeout))
        except unixsocket.UnusablePath as exc:
            raise SocketPathError(str(exc)) from exc
        except unixsocket.UnixSocketError as exc:
            raise HookServerError(str(exc)) from exc
        self._last_step.handed = None
        try:
            await self._before_serving()
        except BaseException:
            # A read it started in a thread and handed over (cut by a stop: no cancel cuts a thread's read)
            # keeps the lock until it ends; a start again is refused until then, as after a kept last write.
            kept = self._last_step.kept = releasestep.keep(self._last_step.handed, type(self).__name__, str(path),
                                                           releasestep.AT_FAILED_START)
            await socketlock.release_once_stopped(None, lock, path, None, kept=lambda: kept)
            raise
        try:
            server, identity = await listen.open_listener(self, self._transport, path, self._options, self._socket_mode)
        except BaseException:
            # Listener undone, state prepared: finish it under the lock as a stop does (bounded). A stop
            # from now on waits for that, and does not cut it: a stop's own release step is not cut either.
            self._starting.finishing()
            await self._release(lock, None, None, releasestep.AT_FAILED_START)
            raise
        self._socket_identity = identity
        self._path_lock = lock
        self._server = server
        logger.info("hook server listening on %s", path, extra={"socket": str(path), "transport": self._transport})
        unregistered.serving(str(path), handled_hooks(type(self), HookServer))  # a handler no hook file lists: warned
        self._run_scope = runscope.served(str(path))  # under hooks.sdk.run: its hook files removed as it stops

    @final
    async def stop(self, grace: float | None = None, *, drain: float | None = None) -> None:
        """Stop serving, in three steps (``grace`` and ``drain`` default to the constructor's):

        1. Under :func:`run`, the hook files it wrote naming this socket are
           removed (``hooks.runscope``): the proxy stops calling.
        2. If one was (removed now, or by the script before this stop, as
           README's example does), the server keeps answering new calls for
           ``drain`` seconds (unset: :data:`DEFAULT_DRAIN_S`), its listener
           open: calls the proxy started before it noticed the file gone get
           their answers, not a refusal. Otherwise only for a ``drain`` set
           (here, the constructor): the SDK cannot know a proxy calls a server
           whose hook file it did not write (an operator's, plain asyncio.run).
        3. The listener closes and the calls in flight get ``grace`` seconds
           to answer; what outlives it is cancelled (None: at once).

        A stop while another is under way waits for it, shielded (its return
        must not let ``main`` end, whose end cancels the first's drain). A
        stop cancelled cuts its drain and grace short, and closes all the same.
        A stop while a start is under way (waiting on the socket's lock, say)
        cancels that start, which then raises :class:`HookServerError` (``...
        was cancelled by a stop``) and lets the lock go, and returns once it
        has ended: else the start would serve after the stop, for good. A
        start that failed on its own and runs its release step is not cut:
        the stop waits for that step (bounded) and the start raises its error."""
        stopping.checked_drain(drain)  # before anything: a stop that raises later would leave the lock held
        try:
            await self._before_stop()
        finally:  # each step runs whatever the one before did: the socket's lock goes in any case
            try:
                await self._stop_serving(grace, drain)
            finally:
                await self._after_stop()

    async def _before_stop(self) -> None:
        """Override to stop what serves beside the hook server (a status
        socket): it runs first at each :meth:`stop`, once its arguments are
        checked; its failure does not keep the server from stopping."""

    async def _after_stop(self) -> None:
        """Override to close what the server used (a runtime client): it runs
        last at each :meth:`stop`, however the stop ended (failed, cancelled)."""

    async def _stop_serving(self, grace: float | None, drain: float | None) -> None:
        await self._starting.cancel("a stop")  # (none under way: nothing)
        ending = self._stopping
        if ending is not None and not ending.done():
            await asyncio.shield(ending)
            return
        server, self._server = self._server, None
        if server is None:
            return
        ending = self._stopping = asyncio.get_running_loop().create_future()
        try:
            await self._stop(server, grace, drain)
        finally:
            ending.set_result(None)

    async def _stop(self, server: grpc.aio.Server | FrameServer, grace: float | None, drain: float | None) -> None:
        unregistered.stopped(str(self._socket_path))
        scope, self._run_scope = self._run_scope, None
        registered = False
        if scope is not None:  # first, listener open and lock held: the proxy stops calling before we stop answering
            registered = scope.stopping(str(self._socket_path))
        grace = self._grace if grace is None else grace
        drain = stopping.drain_for(self._drain if drain is None else drain, registered)
        if self._path_lock is not None:  # a longer grace than the constructor's: a waiting server waits as long
            self._path_lock.record_longer_stop(stopping.stop_bound(grace, self.release_step_timeout))
        try:
            # In the try: a stop cancelled while it drains still closes the server.
            await stopping.drain(drain, registered, str(self._socket_path))
            await server.stop(grace)
        finally:  # a stop that failed or was cut short (a caller's timeout) too: a second stop waits for this
            # The server stopped for sure (grpc unlinks the path it bound as it
            # stops), then our socket removed, unless someone else has replaced
            # it, last the lock: a server waiting on it binds now.
            await self._release(self._path_lock, lambda: server.stop(None), self._socket_identity, releasestep.AT_STOP)
            self._socket_identity = None

    async def _release(self, lock: socketlock.SocketLock | None, stop: Callable[[], Awaitable[object]] | None,
                       identity: unixsocket.SocketIdentity | None, at: releasestep.At) -> None:
        """``stop()`` (None: no listener left), :meth:`_before_release` bounded, the socket removed, ``lock`` let go."""
        step = functools.partial(self._last_step.run, self._before_release, self.release_step_timeout,
                                 type(self).__name__, str(self._socket_path), at)
        await socketlock.release_once_stopped(stop, lock, self._socket_path, identity, last_step=step,
                                              kept=lambda: self._last_step.kept)

    def _keep_lock_until(self, write: releasestep.Pending) -> None:
        """For :meth:`_before_release`: ``write`` (a thread's, which nothing
        cuts) keeps the socket's lock until it ends, even when the step is
        then cut (its bound, a cancelled stop) or fails; call it as the write
        starts, before the step awaits anything else. For :meth:`_before_serving`
        cut (a stop) or failed: a read or write of its own it leaves running
        in a thread keeps the lock so (hand it over as it is cut)."""
        self._last_step.hand_over(write)

    async def _before_serving(self) -> None:
        """Override to prepare state the handlers need, under the socket's
        lock: it runs in :meth:`start` once the lock is claimed and before
        the socket is bound, so no other instance of the server is running
        (one refused as the path is in use never gets here). An exception
        fails the start and lets the lock go (once a thread's read or write it
        handed over, :meth:`_keep_lock_until`, has ended). A start that fails (or is cut
        by a stop) after it returned runs :meth:`_before_release` too,
        bounded, before the lock goes."""

    async def _before_release(self) -> releasestep.Pending | None:
        """Override to finish state writes (the place for them): it runs in
        :meth:`stop` once the server has stopped (no handler runs any more),
        or in a :meth:`start` that failed after :meth:`_before_serving` ran,
        and before the socket's lock is let go, so a write lands before the
        next instance, waiting on the lock, starts and reads the state.
        Keep it bounded: past ``release_step_timeout`` it is cut and the lock
        goes anyway; an exception is logged, the lock goes all the same. A
        write it cannot cut (a thread's) it returns, still running: the stop
        ends, the lock stays until that write ends (``hooks.releasestep``)."""
        return None

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Wait until the server has stopped: until the end of its stop (the
        one under way, or the next), its drain and grace included, its
        socket removed and its lock let go (unless kept for a write its last
        step handed back). Returns at once when it neither serves nor stops;
        True on timeout (like grpc)."""
        server = self._server
        try:
            async with asyncio.timeout(timeout):
                if server is not None:
                    await server.wait_for_termination()  # ends as a stop closes it: that stop has begun
                ending = self._stopping
                if ending is not None and not ending.done():
                    await asyncio.shield(ending)  # a waiter cancelled must not cut the stop short
        except TimeoutError:
            return True
        return False

    async def __aenter__(self) -> HookServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


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
