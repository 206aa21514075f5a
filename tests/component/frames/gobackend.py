"""A CRI v1alpha2-only runtime that answers the way grpc-go does, on raw HTTP/2.

grpc-go answers a method it does not know (UNIMPLEMENTED, trailers only) as
soon as it has read the call's header block, without waiting for the rest of
the stream, and its HPACK encoder indexes the headers of that answer. A
grpc.aio fake cannot be made to do that before it reads a RST_STREAM that
follows the header block in the same read; this one always does. Known
methods (v1alpha2) are answered once their request is complete: ``Version``
with a VersionResponse, every other method with an empty message.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import hpack

from cri_api.v1alpha2 import api_pb2 as v1alpha2
from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType

from ...headerblocks import decoded

KNOWN = "/runtime.v1alpha2."


class GoLikeRuntime:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.unknown_answered = 0  # v1 calls answered UNIMPLEMENTED at once
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._connection(reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass  # the proxy hung up, or the test is over
        finally:
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(fr.PREFACE))
        writer.write(fr.serialize(FrameType.SETTINGS, 0, 0))
        decoder, encoder = hpack.Decoder(), hpack.Encoder()
        paths: dict[int, str] = {}
        blocks: dict[int, bytes] = {}
        buf = b""
        while chunk := await reader.read(65536):
            buf += chunk
            pos = 0
            while True:
                f, nxt = fr.parse(buf, pos, fr.MAX_FRAME_LIMIT)
                if f is None:
                    break
                pos = nxt
                sid = f.stream_id
                if f.type == FrameType.SETTINGS and not f.has(Flag.ACK):
                    writer.write(fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))
                elif f.type == FrameType.PING and not f.has(Flag.ACK):
                    writer.write(fr.serialize(FrameType.PING, Flag.ACK, 0, bytes(f.payload)))
                elif f.type in (FrameType.HEADERS, FrameType.CONTINUATION):
                    fragment = bytes(fr.unpadded(f)) if f.type == FrameType.HEADERS else bytes(f.payload)
                    blocks[sid] = blocks.get(sid, b"") + fragment
                    if not f.has(Flag.END_HEADERS):
                        continue
                    headers = decoded(decoder, blocks.pop(sid))
                    path = headers[":path"]
                    if not path.startswith(KNOWN):
                        self.unknown_answered += 1
                        writer.write(_trailers_only(encoder, sid, path))
                    elif f.has(Flag.END_STREAM):
                        writer.write(_answer(encoder, sid, path))
                    else:
                        paths[sid] = path
                elif f.type == FrameType.DATA:
                    if f.payload:
                        writer.write(fr.window_update(0, len(f.payload)))
                    if f.has(Flag.END_STREAM) and sid in paths:
                        writer.write(_answer(encoder, sid, paths.pop(sid)))
                elif f.type == FrameType.RST_STREAM:
                    paths.pop(sid, None)
            buf = buf[pos:]
            await writer.drain()

    async def __aenter__(self) -> GoLikeRuntime:
        self._server = await asyncio.start_unix_server(self._serve, str(self.socket))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()


def _trailers_only(encoder: hpack.Encoder, sid: int, path: str) -> bytes:
    block = encoder.encode([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "12"),
                            ("grpc-message", f"unknown service {path.rsplit('/', 1)[0][1:]}")])
    return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, block)


def _answer(encoder: hpack.Encoder, sid: int, path: str) -> bytes:
    if path.endswith("/Version"):
        message = v1alpha2.VersionResponse(version="0.1.0", runtime_name="go-like", runtime_version="1",
                                           runtime_api_version="v1alpha2").SerializeToString()
    else:
        message = b""  # every field at its default: a valid answer of any CRI method
    head = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    tail = encoder.encode([("grpc-status", "0")])
    return (fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, head)
            + fr.serialize(FrameType.DATA, 0, sid, struct.pack(">BI", 0, len(message)) + message)
            + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, tail))


@contextlib.asynccontextmanager
async def go_like_runtime(socket: Path) -> AsyncIterator[GoLikeRuntime]:
    async with GoLikeRuntime(socket) as runtime:
        yield runtime
