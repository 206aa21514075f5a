"""Reference relays for the lifecycle benchmark: what relaying costs before any proxy code runs.

``python -m bench.relays grpc LISTEN BACKEND``: a grpc.aio server whose one generic
handler forwards every unary call's bytes over one grpc.aio channel. No decoding, no
hooks, no state: the floor of the stack the proxy is built on.

``python -m bench.relays bytes LISTEN BACKEND``: an asyncio unix-socket splice that
copies bytes both ways without reading HTTP/2 at all (one backend connection per client
connection). The floor of any relay in a Python process; it cannot hook, translate or
observe a call, so it is a yardstick, not a design.

Both print ``ready`` on stdout once they listen.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import grpc
from grpc import aio

from runtimeproxy.host.unixsocket import grpc_address, grpc_target

_Unary = Callable[..., Awaitable[bytes]]


class _ForwardEverything(grpc.GenericRpcHandler):
    def __init__(self, channel: aio.Channel) -> None:
        self._channel = channel
        self._calls: dict[str, _Unary] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        call = self._calls.get(method)
        if call is None:
            call = self._calls[method] = self._channel.unary_unary(method)

        async def forward(request: bytes, context: aio.ServicerContext) -> bytes:
            try:
                return await call(request, timeout=context.time_remaining())
            except aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "")
                raise  # abort raises; this line only satisfies the type checker

        return grpc.unary_unary_rpc_method_handler(forward)


async def grpc_relay(listen: str, backend: str) -> None:
    async with aio.insecure_channel(grpc_target(backend)) as channel:
        server = aio.server()
        server.add_generic_rpc_handlers([_ForwardEverything(channel)])
        server.add_insecure_port(grpc_address(listen))
        await server.start()
        print("ready", flush=True)
        try:
            await server.wait_for_termination()
        finally:
            await server.stop(0)


class _Pipe(asyncio.Protocol):
    """One direction's receiving end; writes what it reads to ``peer``, pausing when the peer's buffer fills."""

    def __init__(self, live: set[_Pipe]) -> None:
        self._live = live  # every open pipe, for closing them all on the way out
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._live.add(self)

    def attach(self, peer: _Pipe) -> None:
        self.peer = peer
        assert peer.transport is not None
        for chunk in self._early:
            peer.transport.write(chunk)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.peer.transport is None:
            self._early.append(data)
        else:
            self.peer.transport.write(data)

    def pause_writing(self) -> None:  # our transport is full: stop reading the other side
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def byte_relay(listen: str, backend: str) -> None:
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()
    live: set[_Pipe] = set()  # closed on the way out: serve_forever waits for them

    def accepted() -> _Pipe:
        client = _Pipe(live)

        async def connect() -> None:
            try:
                _, upstream = await loop.create_unix_connection(lambda: _Pipe(live), backend)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            assert upstream.transport is not None
            if client.transport is None or client.transport.is_closing() or upstream.transport.is_closing():
                # One side left while we connected: end both.
                upstream.transport.close()
                if client.transport is not None:
                    client.transport.close()
                return
            upstream.attach(client)
            client.attach(upstream)

        task = loop.create_task(connect())
        pending.add(task)
        task.add_done_callback(pending.discard)
        return client

    server = await loop.create_unix_server(accepted, listen)
    print("ready", flush=True)
    async with server:
        try:
            await server.serve_forever()
        finally:
            for task in pending:
                task.cancel()
            for pipe in list(live):
                if pipe.transport is not None:
                    pipe.transport.close()


RELAYS = {"grpc": grpc_relay, "bytes": byte_relay}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in RELAYS:
        print(f"usage: python -m bench.relays {{{'|'.join(RELAYS)}}} LISTEN BACKEND", file=sys.stderr)
        return 2
    kind, listen, backend = argv
    try:
        asyncio.run(RELAYS[kind](listen, backend))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
