"""A fake NRI runtime at the byte level: containerd's side of the socket.

Written from the wire facts, independently of ``runtimeproxy.nri``: it parses
mux and ttrpc frames itself, enforces containerd's 4096-byte first-frame rule
(a message whose first mux frame is longer closes the connection), calls the
Plugin service on connection 1 and serves the Runtime service on connection 2.
How it cuts its own messages into frames and socket writes is up to the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from cri_api.nri import api_pb2 as nri
from cri_api.ttrpc import request_pb2 as ttrpc_pb

M = TypeVar("M", bound=Message)
MUX = struct.Struct(">II")
TTRPC = struct.Struct(">IIBB")
FIRST_FRAME_LIMIT = 4096
PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"

# A ttrpc message -> its mux frame payloads; the mux byte stream -> socket writes.
Framer = Callable[[bytes], list[bytes]]
Writer = Callable[[bytes], list[bytes]]


def go_framer(message: bytes) -> list[bytes]:
    return [message[:FIRST_FRAME_LIMIT], message[FIRST_FRAME_LIMIT:]] if len(message) > FIRST_FRAME_LIMIT else [message]


class Refused(Exception):
    """The plugin answered a call with a ttrpc status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass
class PluginLink:
    """One plugin connection, as the runtime sees it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    framer: Framer = go_framer
    writes: Writer = field(default=lambda data: [data])
    registered: asyncio.Future[nri.RegisterPluginRequest] = field(default_factory=asyncio.Future)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_reason: str = ""
    # (conn id, payload length, first frame of a message) of every frame the plugin sent
    frames: list[tuple[int, int, bool]] = field(default_factory=list)
    _ids: int = -1
    _pending: dict[int, asyncio.Future[ttrpc_pb.Response]] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def read(self) -> None:
        buffers: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        try:
            while True:
                conn, length = MUX.unpack(await self.reader.readexactly(MUX.size))
                payload = await self.reader.readexactly(length)
                buffer = buffers.setdefault(conn, bytearray())
                first = not buffer  # nothing of a message under way: this frame starts one
                self.frames.append((conn, length, first))
                if first and length > FIRST_FRAME_LIMIT:
                    self.close_reason = f"first frame of {length} bytes on connection {conn}"
                    return
                buffer += payload
                while len(buffer) >= TTRPC.size:
                    size, stream, kind, _flags = TTRPC.unpack(buffer[: TTRPC.size])
                    if len(buffer) < TTRPC.size + size:
                        break
                    body = bytes(buffer[TTRPC.size : TTRPC.size + size])
                    del buffer[: TTRPC.size + size]
                    self._received(conn, stream, kind, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.close_reason = self.close_reason or "plugin closed"
        finally:
            self.close()

    def _received(self, conn: int, stream: int, kind: int, body: bytes) -> None:
        if conn == 2 and kind == 1:
            request = ttrpc_pb.Request.FromString(body)
            asyncio.get_running_loop().create_task(self._serve(stream, request))
        elif conn == 1 and kind == 2:
            future = self._pending.pop(stream, None)
            if future is not None and not future.done():
                future.set_result(ttrpc_pb.Response.FromString(body))

    async def _serve(self, stream: int, request: ttrpc_pb.Request) -> None:
        response = ttrpc_pb.Response()
        if (request.service, request.method) == (RUNTIME, "RegisterPlugin"):
            if not self.registered.done():
                self.registered.set_result(nri.RegisterPluginRequest.FromString(request.payload))
            response.payload = nri.Empty().SerializeToString()
        else:
            response.status.code, response.status.message = 12, "not implemented"
        await self._send(2, stream, 2, response.SerializeToString())

    async def _send(self, conn: int, stream: int, kind: int, body: bytes) -> None:
        message = TTRPC.pack(len(body), stream, kind, 0) + body
        data = b"".join(MUX.pack(conn, len(chunk)) + chunk for chunk in self.framer(message))
        async with self._lock:
            for piece in self.writes(data):
                self.writer.write(piece)
                await self.writer.drain()

    async def call(self, method: str, request: Message, response_type: type[M], timeout: float = 2.0) -> M:
        """A Plugin-service call as containerd makes it (bounded by its request timeout)."""
        self._ids += 2
        stream = self._ids
        future: asyncio.Future[ttrpc_pb.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream] = future
        envelope = ttrpc_pb.Request(
            service=PLUGIN, method=method, payload=request.SerializeToString(), timeout_nano=int(timeout * 1e9)
        )
        await self._send(1, stream, 1, envelope.SerializeToString())
        closed = asyncio.ensure_future(self.closed.wait())
        either: set[asyncio.Future[Any]] = {future, closed}
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not future.done():
            raise ConnectionError(f"connection closed: {self.close_reason}")
        response = future.result()
        if response.status.code:
            raise Refused(response.status.code, response.status.message)
        return response_type.FromString(response.payload)

    async def handshake(
        self, pods: list[nri.PodSandbox] | None = None, containers: list[nri.Container] | None = None
    ) -> int:
        """Registration as containerd drives it; the event mask the plugin asked for."""
        await asyncio.wait_for(asyncio.shield(self.registered), 5)
        configured = await self.call(
            "Configure", nri.ConfigureRequest(runtime_name="containerd", runtime_version="v1.7.13"),
            nri.ConfigureResponse,
        )
        await self.call("Synchronize", nri.SynchronizeRequest(pods=pods or [], containers=containers or []),
                        nri.SynchronizeResponse)
        return configured.events

    async def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        return await self.call(
            "CreateContainer", nri.CreateContainerRequest(pod=pod, container=container), nri.CreateContainerResponse
        )

    async def state_change(self, event: nri.Event, pod: nri.PodSandbox, container: nri.Container | None = None) -> None:
        await self.call("StateChange", nri.StateChangeEvent(event=event, pod=pod, container=container), nri.Empty)

    def close(self) -> None:
        self.closed.set()
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self.writer.close()


class FakeRuntime:
    """Listens where containerd's NRI socket would be; each plugin connection
    arrives on :attr:`links`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.links: asyncio.Queue[PluginLink] = asyncio.Queue()
        self.framer: Framer = go_framer
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._links: list[PluginLink] = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = PluginLink(reader, writer, framer=self.framer)
        self._links.append(link)
        self.links.put_nowait(link)
        await link.read()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, str(self.path))

    async def stop(self) -> None:
        """Like containerd going away: every connection closes, the socket too."""
        for link in self._links:
            link.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        self.path.unlink(missing_ok=True)

    async def next_link(self, timeout: float = 10.0) -> PluginLink:
        return await asyncio.wait_for(self.links.get(), timeout)


@contextlib.asynccontextmanager
async def fake_runtime(path: Path) -> AsyncIterator[FakeRuntime]:
    runtime = FakeRuntime(path)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()
