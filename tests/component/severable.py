"""A unix socket in front of a runtime that can be cut as a killed process's
would be: its connections closed with no HTTP/2 frame (a grpc server's stop
sends GOAWAY first, which a runtime killed with SIGKILL never does) and its
path gone, so nothing connects again until the runtime is restarted."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path


class Severable:
    """Bytes relayed both ways between ``socket`` and ``target``, until ``sever``."""

    def __init__(self, socket: Path, target: Path) -> None:
        self.socket = socket
        self.target = target
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Severable:
        self._server = await asyncio.start_unix_server(self._relay, path=str(self.socket))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sever()

    async def sever(self) -> None:
        """Close every connection at once, with nothing sent, and stop listening."""
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(self.target))
        except OSError:  # the runtime is not there: the client's connection ends as with none listening
            writer.transport.abort()
            return
        if self._server is None:
            # Severed while this connection was dialling on: sever() did not
            # see it, and a killed runtime's accepted connections all end.
            up_writer.transport.abort()
            writer.transport.abort()
            return
        self._writers += [writer, up_writer]
        pipes = [asyncio.ensure_future(_copy(reader, up_writer)), asyncio.ensure_future(_copy(up_reader, writer))]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            for w in (writer, up_writer):
                w.transport.abort()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.transport.abort()  # one side's end is the other's: no half-open connection
