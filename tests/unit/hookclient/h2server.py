"""A hook server written frame by frame, for what real servers never send."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import hpack
import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import CallFailed

from ...headerblocks import decoded

PREFACE = fr.PREFACE
METHOD = "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook"


async def call(transport: FramesTransport, sock: Path, message: bytes = b"req", timeout: float = 5.0) -> bytes:
    return await transport.call(str(sock), METHOD, message, timeout, owner_uid=None)


async def failed(transport: FramesTransport, sock: Path, timeout: float = 5.0) -> CallFailed:
    with pytest.raises(CallFailed) as err:
        await call(transport, sock, timeout=timeout)
    return err.value




@dataclass
class Call:
    stream_id: int
    headers: dict[str, str]
    message: bytes


@dataclass
class Peer:
    """The server's side of one connection."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)
    decoder: hpack.Decoder = field(default_factory=hpack.Decoder)
    seen: list[tuple[int, int, int, bytes]] = field(default_factory=list)  # (type, flags, stream, payload)
    window: int = fr.DEFAULT_WINDOW  # what the client lets us send on the connection
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # its handler returned (or failed)

    async def frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        length = int.from_bytes(head[:3], "big")
        sid = int.from_bytes(head[5:], "big") & 0x7FFFFFFF
        got = (head[3], head[4], sid, await self.reader.readexactly(length))
        self.seen.append(got)
        if got[0] == FrameType.WINDOW_UPDATE and sid == 0:
            self.window += int.from_bytes(got[3], "big")
        return got

    def send(self, kind: int, flags: int, sid: int, payload: bytes = b"") -> None:
        self.writer.write(fr.serialize(kind, flags, sid, payload))

    async def handshake(self, settings: dict[int, int] | None = None) -> None:
        assert await self.reader.readexactly(len(PREFACE)) == PREFACE
        payload = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        self.send(FrameType.SETTINGS, 0, 0, payload)

    async def call(self, grant: Callable[[int], int | None] | None = None) -> Call:
        """Frames until one call's request is complete; ``grant(received)``
        says what WINDOW_UPDATE to send the stream after each DATA frame."""
        headers: dict[str, str] | None = None
        body = bytearray()
        while True:
            kind, flags, sid, payload = await self.frame()
            if kind == FrameType.SETTINGS and not flags & Flag.ACK:
                self.send(FrameType.SETTINGS, Flag.ACK, 0)
            elif kind == FrameType.HEADERS:
                headers = decoded(self.decoder, payload)
            elif kind == FrameType.DATA:
                body += payload
                if grant is not None and (more := grant(len(payload))):
                    self.send(FrameType.WINDOW_UPDATE, 0, sid, struct.pack(">I", more))
                    self.send(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", more))
                if flags & Flag.END_STREAM:
                    assert headers is not None
                    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
                    return Call(sid, headers, bytes(body[5:]))

    def answer_headers(self, sid: int, extra: Sequence[tuple[str, str]] = (), end: bool = False) -> None:
        block = self.encoder.encode([(":status", "200"), ("content-type", "application/grpc"), *extra])
        self.send(FrameType.HEADERS, Flag.END_HEADERS | (Flag.END_STREAM if end else 0), sid, block)

    def trailers(self, sid: int, status: int = 0, message: str = "") -> None:
        pairs = [("grpc-status", str(status))] + ([("grpc-message", message)] if message else [])
        self.send(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, self.encoder.encode(pairs))

    def answer(self, sid: int, message: bytes = b"") -> None:
        self.answer_headers(sid)
        self.send(FrameType.DATA, 0, sid, struct.pack(">BI", 0, len(message)) + message)
        self.trailers(sid)

    async def until(self, kind: int) -> tuple[int, int, int, bytes]:
        """Read frames until one of ``kind`` (EOF raises IncompleteReadError)."""
        while True:
            got = await self.frame()
            if got[0] == kind:
                return got


Handler = Callable[[Peer], Awaitable[None]]


def answering(message: bytes) -> Handler:
    """A well-behaved server's connection: one call, answered with ``message``."""

    async def handler(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        peer.answer(got.stream_id, message)

    return handler


@contextlib.asynccontextmanager
async def serving(path: Path, *handlers: Handler) -> AsyncIterator[list[Peer]]:
    """A unix server whose n-th connection is run by ``handlers[n]`` (the last one for the rest)."""
    peers: list[Peer] = []
    tasks: set[asyncio.Task[None]] = set()
    errors: list[BaseException] = []  # a handler's failed assertion fails the test, not just its task

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer)
        handler = handlers[min(len(peers), len(handlers) - 1)]
        peers.append(peer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(peer)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test ended with the handler still waiting
        except Exception as exc:  # noqa: BLE001 - re-raised when the test's server stops
            errors.append(exc)
        finally:
            peer.finished.set()
            tasks.discard(task)

    server = await asyncio.start_unix_server(connected, path=str(path))
    try:
        yield peers
    finally:
        server.close()
        for peer in peers:
            peer.writer.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if errors:
            raise errors[0]
