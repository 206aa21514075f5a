"""A frames listener between two hand-driven HTTP/2 peers: a raw client and a
raw runtime, so a test writes on both sides exactly what a real peer might
and reads exactly what the relay passed on.

Its routes: ``RELAYED`` is relayed verbatim, ``HOOKED`` runs the given
stages in place, anything else is diverted to an echo server standing in for
the proxy's own grpc.aio server.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import hpack
from grpc import aio

from runtimeproxy.cripath.stage import Stage
from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import Limits
from runtimeproxy.frames.frame import Flag, FrameType
from runtimeproxy.frames.listener import FramesListener
from runtimeproxy.host.unixsocket import grpc_address
from tests.frameroutes import Routes

from .. import rawh2
from ..rawh2 import message

RELAYED = "/runtime.v1.RuntimeService/ListContainers"
HOOKED = "/runtime.v1.RuntimeService/StartContainer"
DIVERTED = "/test.Own/Echo"


def request_block(encoder: hpack.Encoder, path: str) -> bytes:
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                           ("content-type", "application/grpc"), ("te", "trailers")])


@dataclass
class Pair:
    """One client connection through the relay, and the runtime connection made for it."""

    client: rawh2.RawPeer
    runtime: rawh2.RawPeer
    encoder: hpack.Encoder  # the client's
    runtime_encoder: hpack.Encoder

    def request(self, sid: int, path: str, body: bytes | None = b"", end: bool = True) -> bytes:
        """A call's HEADERS, and its one message if ``body`` is not None."""
        frames = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | (Flag.END_STREAM if body is None and end else 0),
                              sid, request_block(self.encoder, path))
        if body is not None:
            frames += fr.serialize(FrameType.DATA, Flag.END_STREAM if end else 0, sid, message(body))
        return frames

    def answer(self, sid: int, body: bytes) -> bytes:
        """The runtime's whole OK answer on ``sid``."""
        head = self.runtime_encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        tail = self.runtime_encoder.encode([("grpc-status", "0")])
        return (fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, head)
                + fr.serialize(FrameType.DATA, 0, sid, message(body))
                + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, tail))

    async def pinged(self, mark: bytes = b"pingpong") -> list[tuple[int, int, int, bytes]]:
        """What the client reads up to the answer to a PING it sends now: all
        it sent before was handled."""
        self.client.writer.write(fr.serialize(FrameType.PING, 0, 0, mark))
        seen = []
        while True:
            got = await self.client.until(rawh2.PING)
            seen += got
            if got[-1][1] & Flag.ACK and got[-1][3] == mark:
                return seen


class RawRelay:
    def __init__(self, sock_dir: Path) -> None:
        self.listen = sock_dir / "proxy.sock"
        self.accepted: asyncio.Queue[rawh2.RawPeer] = asyncio.Queue()

    async def pair(self, *settings: tuple[int, int]) -> Pair:
        """A client connection past the SETTINGS exchange, the runtime having
        announced ``settings``."""
        client = await rawh2.RawPeer.connect(self.listen)
        client.writer.write(fr.serialize(FrameType.SETTINGS, 0, 0))
        runtime = await asyncio.wait_for(self.accepted.get(), 10)
        assert await runtime.reader.readexactly(len(fr.PREFACE)) == fr.PREFACE
        runtime.writer.write(fr.serialize(FrameType.SETTINGS, 0, 0,
                                          b"".join(struct.pack(">HI", k, v) for k, v in settings)))
        await client.until(rawh2.SETTINGS)
        await client.until(rawh2.WINDOW_UPDATE)  # the rest of its server preface: the proxy's grant
        client.writer.write(fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))
        return Pair(client, runtime, hpack.Encoder(), hpack.Encoder())


async def _echo(request: bytes, context: aio.ServicerContext) -> bytes:
    return request


@contextlib.asynccontextmanager
async def raw_relay(sock_dir: Path, stages: tuple[Stage, ...] = ()) -> AsyncIterator[RawRelay]:
    relay = RawRelay(sock_dir)

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay.accepted.put_nowait(rawh2.RawPeer(reader, writer))

    server = await asyncio.start_unix_server(runtime, path=str(sock_dir / "runtime.sock"))
    own = aio.server()
    own.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Own", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)})])
    own.add_insecure_port(grpc_address(sock_dir / 'own.sock'))
    await own.start()
    routes = Routes(lambda path: path == RELAYED, stages,
                    diverted=lambda path: path not in (RELAYED, HOOKED))
    listener = FramesListener(relay.listen, sock_dir / "runtime.sock", sock_dir / "own.sock", routes, [],
                              Limits(max_message=1 << 20))
    await listener.start()
    try:
        yield relay
    finally:
        listener.stop_accepting()
        await listener.drain(0)
        await own.stop(0)
        server.close()
