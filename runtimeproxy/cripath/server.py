"""The proxy's gRPC server: socket, router, backend, shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..config import ProxyConfig
from ..frames.path import FramesPath
from ..grpcstart import start_server
from ..host import socketlock, unixsocket
from ..host.unixsocket import ListenError
from ..supervisor import STOP_ORDER, Supervisor, TaskName
from .activation import (
    ACCEPT_HOLD_S,
    ActivatedListener,
    clean_private_dir,
    private_socket_path,
)
from .backend import Backend, BackendInfo
from .callstats import CallSink
from .channelopts import channel_options
from .forward import GrpcRelay, Relay
from .health import HealthServicer
from .imagewatch import RESTART as IMAGE_RESTART
from .imagewatch import ImageWatch
from .limits import give_back_freed_memory, server_options
from .methods import ApiVersion
from .router import Router
from .stage import StageProvider

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660
READ_TIMEOUT = 10.0
QUIET_S = 0.05  # shutdown: no new call for this long, see Proxy._stop_accepting
HOLD_LIMIT_S = 1.0
DRAIN_FLOOR_S = 0.5  # shutdown: the frames drain's least time, however much of the grace is spent
SETTLE_AFTER_GRACE_S = 5.0  # shutdown: records and post hooks may go on this long past the grace
# A stop takes up to the grace period and about this much more (held calls,
# the frames drain's floor, records and post hooks, closing).
STOP_PAST_GRACE_S = HOLD_LIMIT_S + DRAIN_FLOOR_S + SETTLE_AFTER_GRACE_S + 1.0
ACCEPT_TASK = "activation-accept"


def prepare_socket_path(path: Path) -> None:
    """The shared rules (host/unixsocket.py): remove a stale socket, never
    anything else (a live one belongs to another running proxy)."""
    try:
        unixsocket.prepare(path)
    except unixsocket.UnixSocketError as exc:
        raise ListenError(str(exc)) from exc


async def claim_socket_path(path: Path, grace: float) -> socketlock.SocketLock:
    """The same rules under the path's lock (host/socketlock.py), held until
    the proxy has stopped: another proxy on the path is refused, naming its
    pid; or, stopping, waited for as long as a stop with ``grace`` may take,
    or its own stop, recorded in its lock file, when that is longer."""
    stop_s = grace + STOP_PAST_GRACE_S
    try:
        return await socketlock.claim(path, max(socketlock.LOCK_WAIT_S, stop_s), stop_s=stop_s)
    except unixsocket.UnixSocketError as exc:
        raise ListenError(str(exc)) from exc


class Proxy:
    """One running proxy. ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        config: ProxyConfig,
        stages: Sequence[StageProvider] = (),
        relay: Relay | None = None,
        tasks: Supervisor | None = None,
        calls: CallSink | None = None,
        listen_socket: socket.socket | None = None,
    ) -> None:
        """``listen_socket``: a listening socket from systemd (activation.py);
        without it the proxy binds ``config.listen`` itself."""
        if config.backend is None:
            raise ValueError("Proxy needs a backend socket")
        self.config = config
        options = channel_options(config.max_recv_message_bytes, config.max_send_message_bytes)
        self.backend = Backend(config.backend, config.image_backend, options, config.probe_max_interval)
        self.relay = relay or GrpcRelay(self.backend.unprobed, self.backend.probe_soon, self.backend.runtime_failed)
        self.router = Router(self.backend, self.relay, config.serve_versions, config.backend_version, stages, calls)
        self.health = HealthServicer()
        self.server = aio.server(options=server_options(options, config.max_concurrent_streams))
        self.server.add_generic_rpc_handlers((self.router,))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.tasks = tasks or Supervisor()
        self._socket: unixsocket.SocketIdentity | None = None
        self._path_lock: socketlock.SocketLock | None = None  # --listen's, from its bind until the end of stop
        self._bound: Path = config.listen  # the socket grpc listens on
        self._activated = listen_socket
        self._listener: ActivatedListener | None = None
        # A separate image service is watched too: health is SERVING only
        # while both serve (kubelet's pulls fail while it is away).
        self.images = (None if self.backend.image_channel is self.backend.runtime_channel
                       else ImageWatch(self.backend.image_socket, self.backend.image_channel))
        self._runtime_serving = False  # probed, and a plan to serve it: health's runtime half
        self.backend.on_change(self._on_backend)
        self.backend.on_lost(self._on_lost)
        if self.images is not None:
            self.images.on_change(lambda up: self._health_soon())
        self._frames = FramesPath.from_config(
            config, self.router, options, calls.frames_connection if calls is not None else None)

    async def start(self) -> None:
        """Listen at once; the backend is probed in the background. A start
        that fails or is cancelled leaves nothing serving and the path's lock
        free: its caller has no proxy to stop (app.py stops only a started one)."""
        await self._listen()  # undoes its own steps when it fails
        try:
            await self._set_health(self._health_now())  # all NOT_SERVING: nothing probed yet
            log.info("probing backend", extra={"backend": str(self.config.backend)})
            # Keeps routing and health current; restarted if it dies (a restart
            # probes again, so routing and health are brought up to date).
            self.tasks.keep_running(TaskName.MONITOR, self.backend.run)
            if self.images is not None:
                self.tasks.keep_running(TaskName.IMAGE_MONITOR, self.images.run, IMAGE_RESTART)
            accepting = self._listener or (self._frames if self._activated else None)
            if accepting is not None:
                self.tasks.spawn(ACCEPT_TASK, self._accept_when_probed(accepting), critical=True)
            # What a client that never read its answers held is freed when its
            # connection closes; this gives it back to the system (limits.py).
            self.tasks.spawn(TaskName.MEMORY, give_back_freed_memory())
        except BaseException:
            try:
                await self.stop(0)
            except Exception:  # the start's own failure is the one to raise
                log.warning("stopping after a failed start failed", exc_info=True)
            raise

    async def _listen(self) -> None:
        """grpc listens on --listen, or, with a socket from systemd, on a
        private socket that the activation relay feeds."""
        if self._activated is None:
            await self._bind(self.config.listen)
            return
        address = self._activated.getsockname()
        if os.path.realpath(address) != os.path.realpath(self.config.listen):  # noqa: ASYNC240 - /var/run is /run; lstat walks, once at start-up before serving
            log.warning(
                "the socket from systemd is not --listen; serving on the socket from systemd",
                extra={"socket": address, "listen": str(self.config.listen)},
            )
        public = Path(address)
        clean_private_dir(public)
        if self._frames is not None:  # it serves the socket itself, no relay in front (frames/path.py)
            await self._frames.start(self.server, public, self._activated)
            log.info("listening", extra={"socket": address, "from_systemd": True, "data_path": self._data_path})
            return
        try:
            private = private_socket_path(public)
        except OSError as exc:
            raise ListenError(f"cannot make the private directory beside {public}: {exc.strerror or exc}") from exc
        await self._bind(private, public=public)
        self._listener = ActivatedListener(self._activated, self._bound)

    @property
    def _data_path(self) -> str:
        """The data path serving, as the logs name it (what FramesPath.from_config chose)."""
        return "frames" if self._frames is not None else "grpc"

    async def _bind(self, path: Path, public: Path | None = None) -> None:
        """Listen on ``path``: --listen under its lock; or, with ``public`` (a
        socket from systemd), on its private socket, named by this process's
        pid in a 0700 directory: no other live proxy has that name to bind
        (in one pid namespace), so it takes no lock, and leaves no lock files
        there (clean_private_dir removes crashed instances' sockets)."""
        if public is not None:
            prepare_socket_path(path)
        else:
            self._path_lock = await claim_socket_path(path, self.config.grace_period)
        try:
            await self._bind_prepared(path)
        except BaseException:
            socketlock.release(self._path_lock)  # _bind_prepared stopped what it started
            raise

    async def _bind_prepared(self, path: Path) -> None:
        # The socket is created 0660, never briefly wider: under the umask
        # for its bind alone (the frames listener's bound_socket, grpc's
        # add_insecure_port, which binds and listens), not across an await.
        try:
            if self._frames is not None:  # --data-path frames: see runtimeproxy/frames/path.py
                await self._frames.start(self.server, path)
            else:
                with unixsocket.socket_umask():
                    try:
                        port = self.server.add_insecure_port(unixsocket.grpc_address(path))
                    except RuntimeError:  # grpc.aio's "Failed to bind" (its reason only in grpc's own log)
                        port = 0
                if port == 0:
                    raise ListenError(f"cannot listen on {path} (grpc could not bind it)")
                await start_server(self.server)  # stopped if cut short: its listener must not outlive the lock
        except OSError as exc:  # the bind itself (EPERM, EROFS...): the path's fault, said in one line
            raise ListenError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
        try:
            os.chmod(path, SOCKET_MODE)
            self._socket = unixsocket.SocketIdentity.of(path)
        except BaseException as exc:
            if self._frames is not None:  # started above: its temp dir and server must not outlive this
                await self._frames.abandon(self.server, exc)
            else:
                await self.server.stop(None)
            raise
        self._bound = path
        log.info("listening", extra={"socket": str(path), "mode": f"{SOCKET_MODE:04o}", "data_path": self._data_path})

    async def _accept_when_probed(self, listener: ActivatedListener | FramesPath) -> None:
        """Connections wait in the backlog until the backend answered (at
        most ACCEPT_HOLD_S): calls then find a proxy that can forward them."""
        try:
            await asyncio.wait_for(self.backend.ready.wait(), ACCEPT_HOLD_S)
        except TimeoutError:
            log.warning("backend not probed yet; accepting anyway", extra={"waited_s": ACCEPT_HOLD_S})
        await listener.start_accepting()

    def _on_backend(self, info: BackendInfo) -> None:
        serving = self._runtime_serving = bool(self.router.plan)
        if self.images is not None:  # the versions image calls are sent in may have changed: it warns of a lack
            plan = self.router.plan
            self.images.sent_in(frozenset(plan.routes.values()) if plan is not None else None)
        self._health_soon()
        if serving and self._frames is not None:  # after the router's rebuild: new connections are relayed
            self._frames.runtime_probed()

    def _on_lost(self) -> None:
        self._runtime_serving = False
        self._health_soon()

    def _health_now(self) -> dict[str, int]:
        """Health by service name: each CRI version's RuntimeService while the
        runtime is probed and served, its ImageService while the image service
        serves (the runtime, or a separate one: imagewatch.py), and the
        overall "" while both do (a node that cannot pull cannot start a pod
        whose image is missing), so a consumer can tell which side is down.
        A separate image service serves for "" only while it has a version
        image calls are sent in (``ImageWatch.usable``): one with none of
        them answers every image call UNIMPLEMENTED.

        A version the routing plan does not serve is NOT_SERVING (its calls
        are refused UNIMPLEMENTED), and so is the ImageService of one whose
        image calls a separate image service lacks the version of (they meet
        UNIMPLEMENTED there), not left unregistered (NOT_FOUND): with
        --serve-versions auto the served set follows the backend, and the
        health servicer cannot unregister a name once set, so a name's
        answer must not depend on whether it was ever served."""
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        runtime = self._runtime_serving
        images = runtime if self.images is None else self.images.usable
        served = self.router.plan.served if self.router.plan is not None else frozenset()
        statuses = {"": serving if runtime and images else not_serving}
        for version in ApiVersion:
            statuses[f"{version.package}.RuntimeService"] = serving if runtime and version in served else not_serving
            images_take = images and version in served and self._images_answer(version)
            statuses[f"{version.package}.ImageService"] = serving if images_take else not_serving
        return statuses

    def _images_answer(self, version: ApiVersion) -> bool:
        """Whether a separate image service has the version a served ``version``'s
        image calls reach it in (the plan's target): one it lacks answers them
        UNIMPLEMENTED, so its name is NOT_SERVING, as for a version the runtime lacks."""
        plan = self.router.plan
        if self.images is None or self.images.versions is None or plan is None:
            return True
        return plan.routes[version] in self.images.versions

    def _health_soon(self) -> None:
        """Health as it is now, set in a task."""
        # Critical: a proxy whose health can no longer change must not go on.
        self.tasks.spawn(TaskName.HEALTH, self._set_health(self._health_now()), critical=True)

    async def _set_health(self, statuses: dict[str, int]) -> None:
        for service, status in statuses.items():
            await self.health.set(service, status)

    async def read_runtime(self, method: str, request: bytes) -> bytes:
        """The proxy's own RuntimeService call (state reads), in the backend's version."""
        version = self.router.plan.backend_version if self.router.plan else ApiVersion.V1
        path = f"/{version.package}.RuntimeService/{method}"
        return await self.backend.runtime_channel.unary_unary(path)(request, timeout=READ_TIMEOUT)

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self.backend.ready.wait(), timeout)

    async def _stop_accepting(self, grace: float) -> None:
        """Shut the server down without a call ending CANCELLED.

        grpc's core cancels (CANCELLED, which kubelet does not retry) every
        call it has received but not yet handed to the proxy when the server
        shuts down. So new calls are first held (not answered) until none
        has come in for QUIET_S: by then each client is waiting on a held
        call and core holds none the proxy has not seen. Then the shutdown
        starts (grpc tells clients to go away) and the held calls are answered
        UNAVAILABLE. The wait is a quiet period, not an event: core does not
        say what it holds; at most min(grace, 1 s). With socket activation the
        relay sees the connections too: quiet also means no bytes on them and
        none still waiting for grpc's first (the calls of a client accepted
        just before would otherwise meet the shutdown); and a call a client
        sends once the shutdown started, before it read grpc's GOAWAY, is
        refused by the relay before core sees it, for a retry on the next
        instance (handover.py).
        """
        # With socket activation the held calls are served, not refused.
        listener = self._listener
        held = self.router.hold_new_calls(serve=self._activated is not None)
        loop = asyncio.get_running_loop()
        began = loop.time()
        if listener is None:
            await held.until_quiet(QUIET_S, min(grace, HOLD_LIMIT_S))
        else:
            await held.until_quiet(QUIET_S, min(grace, HOLD_LIMIT_S), listener.traffic.mark)
        quiet_after = loop.time() - began
        if listener is not None:  # calls sent from now on are retried on the next instance
            listener.refuse_new_streams()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await asyncio.sleep(0)  # the shutdown has begun: no new call reaches the router
        held.release()
        await stopping
        log.info("calls drained", extra={"held_calls": held.count, "held_served": self._activated is not None,
                                         "quiet_after_s": round(quiet_after, 3)})

    async def stop(self, grace: float | None = None) -> None:
        grace = self.config.grace_period if grace is None else grace
        log.info("shutting down", extra={"grace_s": grace})
        try:
            await self._stop(grace)
        finally:  # a stop that failed or was cut short too: the socket and the lock must not outlive it
            # grpc's server stopped first (it unlinks the path it bound), then
            # only our own socket removed (a newer instance may have replaced
            # it), last the lock: the next instance, waiting on it, binds now.
            await socketlock.release_once_stopped(
                lambda: self.server.stop(None), self._path_lock, self._bound, self._socket)
            self._socket = None
        log.info("stopped", extra={"socket": str(self.config.listen)})

    async def _stop(self, grace: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace  # one grace for the whole drain, whichever path carries the calls
        # 1. Stop accepting and drain the calls: unary calls get the grace
        #    period, streams end now (UNAVAILABLE, kubelet retries).
        if self._listener is not None:  # kubelet's next connections wait for the next instance
            self._listener.stop_accepting()
        self.relay.end_streams()
        await self.health.end_watches()
        if self._frames is not None:
            self._frames.stop_accepting()
        if grace > 0:
            await self._stop_accepting(grace)
        else:  # no grace: calls in flight are cancelled anyway
            await self.server.stop(0)
        if self._frames is not None:
            # What is left of the grace; a connection accepted at the last moment
            # still gets its server preface and GOAWAY (DRAIN_FLOOR_S).
            await self._frames.drain(max(deadline - loop.time(), min(grace, DRAIN_FLOOR_S)))
        if self._listener is not None:
            await self._listener.close()
        # 2. Finish recording the calls the runtime answered (this reads the
        #    backend), and let their post hooks finish: until the grace's end
        #    and SETTLE_AFTER_GRACE_S more at most, as chained hooks' timeouts
        #    (up to 120 s each) could outlast the unit's stop timeout (20 s),
        #    and a SIGKILL would lose the rest of this stop too.
        try:
            async with asyncio.timeout_at(max(deadline, loop.time()) + SETTLE_AFTER_GRACE_S):
                for stage in self.router.stages:
                    await stage.settle()
                await self.tasks.drain()
        except TimeoutError:
            log.warning(
                "post hooks or records still running at shutdown; cancelled (hook servers see the rest at their next reconcile)",
                extra={"after_grace_s": SETTLE_AFTER_GRACE_S, "tasks": self.tasks.draining()},
            )
        # 3. Stop what watches or reads the backend (STOP_ORDER)...
        await self.tasks.stop(STOP_ORDER)
        await self.tasks.close()
        # 4. ...and only then close its channels.
        await self.backend.close()

