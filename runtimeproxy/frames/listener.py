"""The frames data path's listener: the proxy's socket (or systemd's), one relay per connection.

Each client connection gets its own backend connection (connection.py). A
connection that comes while the backend is not reachable or its versions
are not known yet is spliced as bytes to the proxy's own grpc.aio server,
which answers it as the grpc data path would (UNAVAILABLE, health), until
the runtime is back: then it is told to go away (splice.py), so that its
client's next calls come on a connection of their own, relayed. The runtime is
back when it is probed again, when another connection's dial reaches it, or,
for a connection spliced because its dial failed while the runtime may be fine
(EMFILE, its socket briefly replaced: no probe comes then), when the
listener's own re-dial reaches it (REDIAL_FIRST_S, doubling to REDIAL_MAX_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from grpc import aio

from ..host.acceptor import Acceptor, bound_socket
from ..host.unixsocket import grpc_target
from . import peerid, silent
from .connection import FrameConnection, Limits, Routes
from .routes import RouterRoutes
from .splice import Splice

log = logging.getLogger(__name__)

# The re-dial of the runtime while connections spliced after a failed dial remain.
REDIAL_FIRST_S = 1.0
REDIAL_MAX_S = 30.0


def redial_delays(first: float, most: float) -> Iterator[float]:
    """The waits before each re-dial: ``first``, doubling up to ``most``."""
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)


class _Side(asyncio.Protocol):
    """One socket of a relayed connection; hands what it reads to ``feed``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.feed: Callable[[bytes], None] | None = None
        self.pending: list[bytes] = []  # read before ``feed`` was set
        self.on_lost: Callable[[], None] | None = None
        self.on_writable: Callable[[bool], None] | None = None
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream's: a Transport (Protocol says BaseTransport)

    def data_received(self, data: bytes) -> None:
        if self.feed is None:
            self.pending.append(data)
        else:
            self.feed(data)

    def eof_received(self) -> bool:
        self._gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()

    def _gone(self) -> None:
        if not self.gone:
            self.gone = True
            if self.on_lost is not None:
                self.on_lost()

    def pause_writing(self) -> None:
        if self.on_writable is not None:
            self.on_writable(False)

    def resume_writing(self) -> None:
        if self.on_writable is not None:
            self.on_writable(True)

    def attach(self, feed: Callable[[bytes], None], on_lost: Callable[[], None],
               on_writable: Callable[[bool], None] | None = None) -> None:
        self.feed, self.on_lost, self.on_writable = feed, on_lost, on_writable
        pending, self.pending = self.pending, []
        for data in pending:
            feed(data)
        if self.gone:
            on_lost()


class FramesListener:
    def __init__(self, listen: Path, backend: Path, internal: Path, routes: RouterRoutes | Routes,
                 channel_options: list, limits: Limits,
                 on_connection: Callable[[str, bool], None] | None = None,
                 runtime_silent: silent.Silence | None = None) -> None:
        """``runtime_silent``: told when a runtime accepted a connection
        and sent no SETTINGS in time, and asked whether it is known silent
        (silent.Silences; None: silent.Unwatched)."""
        self._listen = listen
        self._runtime_silent = silent.Unwatched() if runtime_silent is None else runtime_silent
        # Told (path, True) when a client connection begins, (path, False) when
        # it ends; path "relayed" or "spliced": which path serves kubelet shows
        # in the metrics (a spliced connection costs more CPU per call).
        self._on_connection = on_connection
        self._backend = backend
        self._internal = internal
        self._routes = routes
        self._options = channel_options
        self._limits = limits
        self._acceptor: Acceptor | None = None
        self._channel: aio.Channel | None = None
        self._connections: set[FrameConnection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        # Accepted, their runtime connection not made yet: the drain waits for
        # them too, since each is owed a server preface and a GOAWAY.
        self._setting_up: set[asyncio.Future[None]] = set()
        self._transports: set[asyncio.BaseTransport] = set()
        # Connections answered by the proxy's own server, and their clients (peerid.py).
        self._splices: dict[Splice, dict[str, int | None]] = {}
        self._undialled: set[Splice] = set()  # of those, the ones spliced after a failed dial
        self._redial: asyncio.Task[None] | None = None  # re-dials the runtime while _undialled has any
        self._stopping = False
        self._systemd: str | None = None  # the address of a socket from systemd

    async def start(self, sock: socket.socket | None = None) -> None:
        """Listen on ``_listen``, or on ``sock``, a listening socket from
        systemd (cripath/activation.py): then connections are accepted only
        from ``start_accepting`` on, and wait in its backlog until then."""
        self._channel = aio.insecure_channel(grpc_target(self._internal), options=self._options)
        if sock is None:
            self._acceptor = Acceptor(bound_socket(str(self._listen)), self._accepted)
            self._acceptor.start()
        else:
            self._systemd = sock.getsockname()
            self._acceptor = Acceptor(sock, self._accepted)

    async def start_accepting(self) -> None:
        if self._acceptor is not None and not self._stopping:
            self._acceptor.start()
            log.info("accepting on the socket from systemd", extra={"socket": self._systemd})

    def _accepted(self, conn: socket.socket) -> None:
        set_up = asyncio.get_running_loop().create_future()
        self._setting_up.add(set_up)
        taken: list[bool] = []  # not empty once a transport owns the socket
        task = asyncio.ensure_future(self._serve(conn, set_up, taken))
        self._handlers.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._handlers.discard(task)
            self._setting_up.discard(set_up)
            if not set_up.done():  # it ended before its runtime connection was made
                set_up.set_result(None)
            if task.cancelled() and not taken:
                # Cancelled before its transport took the socket (maybe before its
                # first step): still ours to close. Once taken, only the transport
                # closes it: closed under a transport that still has writes
                # pending, its descriptor stays in the loop's selector, and the
                # next socket given that number could not be watched.
                conn.close()

        task.add_done_callback(done)

    async def _serve(self, conn: socket.socket, set_up: asyncio.Future[None], taken: list[bool]) -> None:
        try:
            _, client = await asyncio.get_running_loop().connect_accepted_socket(_Side, sock=conn)
        except OSError:  # the client is gone already
            conn.close()
            return
        taken.append(True)
        await self._relay(client, set_up)

    async def _relay(self, client: _Side, set_up: asyncio.Future[None]) -> None:
        """Relay ``client``'s connection; ``set_up`` is done once its runtime connection is made."""
        assert client.transport is not None
        self._transports.add(client.transport)
        loop = asyncio.get_running_loop()
        backend: _Side | None = None
        failed = False  # the dial failed: no probe may come, as the runtime itself may be fine
        identity = peerid.client_identity(client.transport)  # once: its lines' fields (peerid.py)
        if self._routes.ready():  # type: ignore[union-attr]  # any Routes given (tests') has ready(); only here is it asked
            try:
                _, backend = await loop.create_unix_connection(_Side, str(self._backend))
            except OSError as exc:
                failed = True
                log.debug("the runtime cannot be dialled: the proxy's own server answers this connection "
                          "until the runtime is back",
                          extra={"backend": str(self._backend), "error": str(exc), **identity})
        if backend is None:  # not known yet: the proxy's own server answers (UNAVAILABLE, health)
            with contextlib.suppress(OSError):
                _, backend = await loop.create_unix_connection(_Side, str(self._internal))
            if backend is None:
                client.transport.close()
                return
            self._splice(client, backend, failed, identity)
            return
        if self._splices:  # the runtime answers a dial again: their clients may come back relayed
            self.runtime_back()
        assert self._channel is not None and backend.transport is not None
        if client.gone or client.transport.is_closing():
            # The client left while the runtime was dialled: what the runtime sent
            # meanwhile (its SETTINGS) has nowhere to go, and uvloop refuses a
            # write to a closed transport.
            backend.transport.close()
            client.transport.close()
            self._transports.discard(client.transport)
            return
        self._transports.add(backend.transport)
        conn = FrameConnection(client.transport, backend.transport, self._routes, self._channel, self._limits,
                               identity)
        self._connections.add(conn)
        self._counted("relayed", True)
        log.debug("frames: client connection relayed to the runtime", extra=identity)
        try:
            backend.attach(conn.backend_data, conn.backend_gone, conn.backend_writable)
            client.attach(conn.client_data, conn.lost, conn.client_writable)
            if self._stopping:  # accepted just before the shutdown began: told to go away at once
                conn.begin_stop()
            silent.bound(conn, self._backend, self._runtime_silent)
            set_up.set_result(None)
            await conn.closed
        finally:  # cancelled too, by the drain
            self._counted("relayed", False)
            log.debug("frames: relayed client connection closed", extra=identity)
        self._connections.discard(conn)
        self._transports.discard(client.transport)
        self._transports.discard(backend.transport)

    def _counted(self, path: str, opened: bool) -> None:
        if self._on_connection is not None:
            self._on_connection(path, opened)

    def _splice(self, a: _Side, b: _Side, failed: bool, identity: dict[str, int | None]) -> None:
        """Client ``a`` (``identity``, peerid.py) to the proxy's own server ``b``, byte
        for byte; ``failed``: its dial of the runtime failed, so the runtime is re-dialled."""
        assert a.transport is not None and b.transport is not None
        ta, tb = a.transport, b.transport
        self._transports.add(tb)
        splice = Splice(ta)
        self._splices[splice] = identity
        self._counted("spliced", True)
        log.debug("frames: client connection spliced to the proxy's own server", extra=identity)
        ended: list[bool] = []  # not empty once closed: both sides report it
        if failed:
            self._undialled.add(splice)
            if self._redial is None and not self._stopping:
                # One of _handlers: the drain awaits its cancel with theirs.
                self._redial = asyncio.ensure_future(self._redialling())
                self._handlers.add(self._redial)
                self._redial.add_done_callback(self._handlers.discard)

        def close() -> None:
            if not ended:
                ended.append(True)
                self._counted("spliced", False)
                log.debug("frames: spliced client connection closed", extra=identity)
            ta.close()
            tb.close()
            self._transports.discard(ta)
            self._transports.discard(tb)
            self._splices.pop(splice, None)
            self._undialled.discard(splice)
            if not self._undialled:
                self._stop_redial()

        b.attach(splice.from_server, close)
        a.attach(tb.write, close)

    async def _redialling(self) -> None:
        """Dial the runtime until it answers, then tell the spliced connections
        (runtime_back); cancelled once none spliced after a failed dial is left."""
        loop = asyncio.get_running_loop()
        for delay in redial_delays(REDIAL_FIRST_S, REDIAL_MAX_S):
            await asyncio.sleep(delay)
            try:
                transport, _ = await loop.create_unix_connection(asyncio.Protocol, str(self._backend))
            except OSError as exc:
                log.debug("the runtime still cannot be dialled: connections made meanwhile stay on the proxy's own "
                          "server", extra={"backend": str(self._backend), "error": str(exc),
                                           "connections": len(self._undialled)})
                continue
            transport.close()
            break
        self._redial = None  # done: runtime_back must not cancel this task
        self.runtime_back()

    def _stop_redial(self) -> None:
        if self._redial is not None:
            self._redial.cancel()
            self._redial = None

    def runtime_back(self) -> None:
        """The runtime was probed, or answered a dial: the connections the
        proxy's own server answers meanwhile are told to go away (splice.py)."""
        if not self._splices or self._stopping:
            return
        log.info("connections made while the runtime could not be reached are told to reconnect, to be relayed",
                 extra={"connections": len(self._splices), "backend": str(self._backend)})
        for splice, identity in self._splices.items():
            log.debug("frames: spliced client connection told to reconnect", extra=identity)
            splice.go_away()
        self._splices.clear()  # each is told once
        self._undialled.clear()
        self._stop_redial()

    def stop_accepting(self) -> None:
        """Shutdown, step 1: no new connection, no new relayed call. A socket
        from systemd keeps what waits in its backlog for the next instance."""
        self._stopping = True
        self._stop_redial()  # no connection is told to go away from here on (runtime_back)
        if self._acceptor is not None:
            self._acceptor.close()  # a socket from systemd: closes our copy of it, systemd keeps its own
            if self._systemd is not None:
                log.info("stopped accepting; new connections wait in the backlog", extra={"socket": self._systemd})
        for conn in list(self._connections):
            conn.begin_stop()

    async def drain(self, grace: float) -> None:
        """Shutdown, step 2: unary calls finish within ``grace``, and every
        connection has had its GOAWAY; then every connection ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if self._setting_up and grace > 0:
            await asyncio.wait(list(self._setting_up), timeout=grace)
        waits = [_idle_or_closed(conn) for conn in self._connections]
        if waits and deadline > loop.time():
            await asyncio.wait(waits, timeout=deadline - loop.time())
        for wait in waits:
            wait.cancel()
        for conn in list(self._connections):
            conn.lost()
        for transport in list(self._transports):
            transport.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)
        if self._channel is not None:
            await self._channel.close()


def _idle_or_closed(conn: FrameConnection) -> asyncio.Future[None]:
    """Done once ``conn`` has no call left to finish, or is closed: calls of a
    closed connection can no longer be answered, so shutdown need not wait for them."""
    idle = asyncio.ensure_future(conn.wait_idle())
    conn.closed.add_done_callback(lambda _: idle.cancel())
    return idle
