"""The frames transport's listener: unix socket, connections, graceful stop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from runtimeproxy.host import unixsocket
from runtimeproxy.host.acceptor import bound_socket

from .calls import Limits, Route
from .connection import Connection


class FrameServer:
    """Serves ``routes`` (``:path`` -> handler) on a unix socket, as grpc.aio's server does."""

    def __init__(self, routes: Mapping[bytes, Route], *, max_receive: int, max_send: int) -> None:
        self._routes = dict(routes)
        self._limits = Limits(max_receive=max_receive, max_send=max_send)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[Connection] = set()
        self._idle = asyncio.Event()  # set while no connection is open
        self._idle.set()
        self._terminated = asyncio.Event()

    async def start(self, path: Path) -> unixsocket.SocketIdentity:
        """Listen on ``path`` (the caller has prepared it: see ``unixsocket.prepare``);
        which file it bound, read right after the bind: what is the caller's to remove."""
        loop = asyncio.get_running_loop()
        # Bound here: asyncio's own bind first removes any socket at the path,
        # a live one bound there since the caller's prepare too; this one fails EADDRINUSE.
        sock = bound_socket(str(path))
        identity = None
        try:
            identity = unixsocket.SocketIdentity.of(path)
            server = self._server = await loop.create_unix_server(self._connection, sock=sock, start_serving=False)
            await server.start_serving()
        except BaseException:
            # A cancel at the one await that serves (a stop signal while hook
            # run starts): no listener may outlive the start, nor our socket.
            if self._server is None:
                sock.close()
            else:
                self._server.close()
                self._server = None
            unixsocket.remove_own(path, identity)
            raise
        return identity

    def _connection(self) -> Connection:
        conn = Connection(self._routes, self._limits, self._lost)
        self._connections.add(conn)
        self._idle.clear()
        return conn

    def _lost(self, conn: Connection) -> None:
        self._connections.discard(conn)
        if not self._connections:
            self._idle.set()

    async def stop(self, grace: float | None) -> None:
        """No new connections or calls; the open calls get ``grace`` seconds,
        then are cancelled (None: at once, as grpc.aio's ``stop(None)``)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for conn in list(self._connections):
            conn.go_away()  # each closes once its last call is answered
        if grace:
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                pass
        for conn in list(self._connections):
            conn.abort()
            if not conn.made:  # accepted as the server closed: on 3.11 the loop drops it unmade (Server._attach
                self._lost(conn)  # asserts), connection_lost never comes; made later, it aborts at once
        await self._idle.wait()  # connection_lost has run for each: their handlers are cancelled
        await server.wait_closed()
        self._terminated.set()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Until ``stop`` has finished; True if ``timeout`` passed first (as grpc.aio's)."""
        if self._terminated.is_set():  # wait_for(..., 0) times out even on an event set: False at once, as grpc's
            return False
        try:
            await asyncio.wait_for(self._terminated.wait(), timeout)
        except TimeoutError:
            return True
        return False
