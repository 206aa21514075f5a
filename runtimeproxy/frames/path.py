"""Wiring the frames data path into a Proxy (``--data-path frames``).

The proxy's grpc.aio server moves to a private socket and keeps serving
every call the frames connections divert (hooks, health, refusals); the
proxy's own socket gets the frames listener. So does a socket from systemd,
with no relay in front (cripath/activation.py's is for the grpc path): what
waits in its backlog when the proxy stops stays there for the next instance,
and a connection it accepted gets its server preface and a GOAWAY.
"""

from __future__ import annotations

import logging
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from grpc import aio

from ..config import ProxyConfig
from ..cripath.router import Router
from ..grpcstart import start_server
from ..host import unixsocket
from ..host.unixsocket import ListenError
from . import silent
from .connection import Limits
from .listener import FramesListener
from .privatedir import PrivateDir, make
from .routes import RouterRoutes

log = logging.getLogger(__name__)

# Where the internal socket's directory goes when TMPDIR's path has a comma.
COMMA_FREE_BASE = Path("/tmp")


def _private_dir() -> PrivateDir:
    """A new directory for the internal socket (0700: only the proxy), in
    TMPDIR; in ``COMMA_FREE_BASE`` when TMPDIR's path has a comma: grpc could
    not dial the socket there, and the start would fail on a path the operator
    never named. Those that killed proxies left there are removed (privatedir.py)."""
    tmpdir = base = Path(tempfile.gettempdir())
    if unixsocket.dial_problem(base) is not None:
        log.info("the temporary directory's path has a comma: the frames path's internal socket goes below "
                 f"{COMMA_FREE_BASE}", extra={"tmpdir": str(base)})
        base = COMMA_FREE_BASE
    try:
        return make(base)
    except OSError as exc:  # named here: the bind's handler would name the listen path, which is not at fault
        why = f" (TMPDIR {tmpdir} has a comma)" if base != tmpdir else ""
        raise ListenError(f"cannot make the frames path's private directory in {base}{why}: "
                          f"{exc.strerror or exc}") from exc


class FramesPath:
    """Nothing exists on disk until ``start``; a failed start removes what it made
    (the proxy is stopped only once started: app.py)."""

    def __init__(self, router: Router, backend: Path, image_backend: Path | None,
                 channel_options: list, limits: Limits,
                 on_connection: Callable[[str, bool], None] | None = None) -> None:
        self._backend = backend
        self._on_connection = on_connection  # counts client connections by path (metrics)
        self._routes = RouterRoutes(router, image_backend is not None and image_backend != backend)
        self._unready = router.unready
        self._channel_options = channel_options
        self._limits = limits
        self._dir: PrivateDir | None = None  # the internal socket's private directory, made by start
        self.listener: FramesListener | None = None

    @classmethod
    def from_config(cls, config: ProxyConfig, router: Router, options: list,
                    on_connection: Callable[[str, bool], None] | None = None) -> FramesPath | None:
        """The frames data path, or None for the grpc one (``--data-path``);
        ``on_connection(path, opened)`` as each client connection begins and ends."""
        if config.data_path != "frames":
            return None
        assert config.backend is not None
        limits = Limits(config.max_recv_message_bytes, config.max_send_message_bytes, config.max_concurrent_streams)
        return cls(router, config.backend, config.image_backend, options, limits, on_connection)

    async def start(self, server: aio.Server, listen: Path, sock: socket.socket | None = None) -> None:
        """Serve on ``listen``, or on ``sock`` from systemd (from ``start_accepting`` on)."""
        self._dir = _private_dir()
        internal = self._dir.path / "grpc.sock"
        self.listener = FramesListener(
            listen, self._backend, internal, self._routes, self._channel_options, self._limits,
            self._on_connection, silent.Silences(self._unready))
        serving = False
        try:
            if server.add_insecure_port(unixsocket.grpc_address(internal)) == 0:
                raise OSError(f"cannot listen on {internal}")
            serving = True  # from here on abandon stops it: a cancel in its start leaves it RUNNING
            await start_server(server)
            await self.listener.start(sock)
        except BaseException as exc:
            await self.abandon(server if serving else None, exc)
            raise

    async def abandon(self, server: aio.Server | None, error: BaseException) -> None:
        """Undo a start that failed, here or in the proxy's own steps after it."""
        made = None if self._dir is None else str(self._dir.path)
        log.info("frames path not started; removing what it made", extra={"dir": made, "error": str(error)})
        if server is not None:
            await server.stop(0)
        if self.listener is not None:
            await self.listener.drain(0)  # closes its channel to the internal socket
        self._remove_dir()

    async def start_accepting(self) -> None:
        if self.listener is not None:
            await self.listener.start_accepting()

    def stop_accepting(self) -> None:
        if self.listener is not None:
            self.listener.stop_accepting()

    def runtime_probed(self) -> None:
        """The runtime answered a probe: connections made while it could not be reached are told to reconnect."""
        if self.listener is not None:
            self.listener.runtime_back()

    async def drain(self, grace: float) -> None:
        if self.listener is not None:
            await self.listener.drain(grace)
        self._remove_dir()

    def _remove_dir(self) -> None:
        if self._dir is not None:
            self._dir.remove()
            self._dir = None
