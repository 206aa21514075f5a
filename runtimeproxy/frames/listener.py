"""The frames data path's listener: the proxy's socket, one relay per connection.

Each client connection gets its own backend connection (connection.py). A
connection that comes while the backend is not reachable or its versions
are not known yet is spliced as bytes to the proxy's own grpc.aio server,
which answers it as the grpc data path would (UNAVAILABLE, health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from grpc import aio

from .connection import READ_SIZE, FrameConnection, Routes
from .routes import RouterRoutes

log = logging.getLogger(__name__)


class FramesListener:
    def __init__(self, listen: Path, backend: Path, internal: Path, routes: RouterRoutes | Routes,
                 channel_options: list, max_message: int, max_send: int | None = None) -> None:
        self._listen = listen
        self._backend = backend
        self._internal = internal
        self._routes = routes
        self._options = channel_options
        self._max_message = max_message
        self._max_send = max_send
        self._server: asyncio.AbstractServer | None = None
        self._channel: aio.Channel | None = None
        self._connections: set[FrameConnection] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._channel = aio.insecure_channel(f"unix://{self._internal}", options=self._options)
        self._server = await asyncio.start_unix_server(self._serve, path=str(self._listen), limit=READ_SIZE)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            backend = None
            if self._routes.ready():  # type: ignore[union-attr]
                with contextlib.suppress(OSError):
                    backend = await asyncio.open_unix_connection(str(self._backend), limit=READ_SIZE)
            if backend is None:
                await self._splice(reader, writer)
                return
            assert self._channel is not None
            conn = FrameConnection((reader, writer), backend, self._routes, self._channel, self._max_message, self._max_send)
            self._connections.add(conn)
            try:
                await conn.run()
            finally:
                self._connections.discard(conn)
        except asyncio.CancelledError:
            writer.close()
        finally:
            self._handlers.discard(task)

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            inner_reader, inner_writer = await asyncio.open_unix_connection(str(self._internal), limit=READ_SIZE)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while chunk := await src.read(READ_SIZE):
                    dst.write(chunk)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, inner_writer), copy(inner_reader, writer))

    def stop_accepting(self) -> None:
        """Shutdown, step 1: no new connection, no new relayed call."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.begin_stop()

    async def drain(self, grace: float) -> None:
        """Shutdown, step 2: unary calls finish within ``grace``; then every connection ends."""
        waits = [asyncio.ensure_future(conn.idle.wait()) for conn in self._connections]
        if waits and grace > 0:
            await asyncio.wait(waits, timeout=grace)
        for wait in waits:
            wait.cancel()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=1.0)
        if self._channel is not None:
            await self._channel.close()
