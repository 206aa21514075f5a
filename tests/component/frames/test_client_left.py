"""A client that leaves while the proxy dials the runtime for it, or whose
transport is closed under the relay: nothing is written to its closed
transport (uvloop raises where asyncio drops), and the runtime connection
made for it is closed, not left open until the proxy stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import Limits
from runtimeproxy.frames.frame import FrameType
from runtimeproxy.frames.listener import FramesListener, _Side


class _Ready:
    def ready(self) -> bool:
        return True


class _ClosedTransport:
    """A client's transport uvloop has closed: a write raises, as uvloop's does."""

    def __init__(self) -> None:
        self.closes = 0

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <UnixTransport closed=True>; the handler is closed")

    def writelines(self, pieces: list[bytes]) -> None:
        self.write(b"".join(pieces))

    def is_closing(self) -> bool:
        return True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # its socket is gone: the client is unknown (peerid.py)

    def close(self) -> None:
        self.closes += 1


async def _ended(reader: asyncio.StreamReader) -> bool:
    """True once the peer closed: EOF, or a broken pipe for what the runtime wrote."""
    try:
        return await reader.read() == b""
    except ConnectionError:
        return True


async def test_the_runtime_connection_of_a_client_that_left_meanwhile_is_closed(sock_dir: Path) -> None:
    accepted: asyncio.Future[asyncio.StreamReader] = asyncio.get_running_loop().create_future()

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(reader)
        writer.write(fr.serialize(FrameType.SETTINGS, 0, 0))  # a runtime's first words, before any client's

    server = await asyncio.start_unix_server(runtime, path=str(sock_dir / "runtime.sock"))
    listener = FramesListener(sock_dir / "proxy.sock", sock_dir / "runtime.sock", sock_dir / "own.sock",
                              _Ready(), [], Limits(max_message=1024))  # type: ignore[arg-type]
    await listener.start()
    client = _Side()
    transport = _ClosedTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
    client.connection_lost(None)  # the client left before the runtime answered the dial
    try:
        set_up = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(listener._relay(client, set_up), 5)  # noqa: SLF001 - the accept path, one connection
        reader = await asyncio.wait_for(accepted, 5)
        assert await asyncio.wait_for(_ended(reader), 5)  # the runtime sees its connection end
        assert transport.closes >= 1
        assert not listener._connections and not listener._transports  # noqa: SLF001
    finally:
        listener.stop_accepting()
        await listener.drain(0)
        server.close()
        await server.wait_closed()
