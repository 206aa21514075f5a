"""The frames relay against malformed clients, and on the wire.

Malformed frames end the client's connection with a GOAWAY carrying the
right error code; the proxy and its other connections live on, a call under
way on one of them included. The runtime's limits hold on a relayed
connection, and PING stays per hop. (Flow control under pressure, on both
data paths: cripath/test_pressure.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from pathlib import Path

import hpack
import pytest
from grpc import aio

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType

V1_LIST = "/runtime.v1.RuntimeService/ListContainers"
V1_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
V1_VERSION = "/runtime.v1.RuntimeService/Version"


def request_block(path: str, encoder: hpack.Encoder | None = None) -> bytes:
    return (encoder or hpack.Encoder()).encode([
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ])


def settings_frame() -> bytes:
    return fr.serialize(FrameType.SETTINGS, 0, 0)


async def goaway_code(reader: asyncio.StreamReader, timeout: float = 5.0) -> int:
    """Read frames until a GOAWAY (or the end); its error code."""
    buf = b""
    async with asyncio.timeout(timeout):
        while True:
            f, nxt = fr.parse(buf, 0, fr.MAX_FRAME_LIMIT)
            if f is None:
                chunk = await reader.read(65536)
                if not chunk:
                    raise AssertionError("connection closed without GOAWAY")
                buf += chunk
                continue
            buf = buf[nxt:]
            if f.type == FrameType.GOAWAY:
                return struct.unpack(">II", bytes(f.payload[:8]))[1]


def _headers(sid: int, block: bytes, flags: int = Flag.END_HEADERS) -> bytes:
    return fr.serialize(FrameType.HEADERS, flags, sid, block)


MALFORMED = {
    "continuation-without-headers": (fr.serialize(FrameType.CONTINUATION, Flag.END_HEADERS, 1, b"\x82"),
                                     ErrorCode.PROTOCOL_ERROR),
    "bad-hpack": (_headers(1, b"\xff\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR),
    "hpack-index-out-of-range": (_headers(1, b"\xbf"), ErrorCode.COMPRESSION_ERROR),
    "oversized-frame": (fr.serialize(FrameType.DATA, 0, 1, b"\x00" * (fr.DEFAULT_MAX_FRAME + 1)),
                        ErrorCode.FRAME_SIZE_ERROR),
    "even-stream-id": (_headers(2, request_block(V1_VERSION)), ErrorCode.PROTOCOL_ERROR),
    "stream-id-reuse": (_headers(5, request_block(V1_VERSION), Flag.END_HEADERS | Flag.END_STREAM)
                        + fr.rst_stream(5, ErrorCode.CANCEL)
                        + _headers(3, request_block(V1_VERSION)), ErrorCode.PROTOCOL_ERROR),
    "same-stream-id-after-reset": (_headers(1, request_block(V1_VERSION), Flag.END_HEADERS | Flag.END_STREAM)
                                   + fr.rst_stream(1, ErrorCode.CANCEL)
                                   + _headers(1, request_block(V1_VERSION)), ErrorCode.PROTOCOL_ERROR),
    "continuation-flood": (_headers(1, request_block(V1_VERSION)[:3], 0)
                           + b"".join(fr.serialize(FrameType.CONTINUATION, 0, 1, b"\x00" * 16_000)
                                      for _ in range(40)), ErrorCode.ENHANCE_YOUR_CALM),
    "interrupted-header-block": (_headers(1, request_block(V1_VERSION)[:3], 0) + fr.rst_stream(1, ErrorCode.CANCEL),
                                 ErrorCode.PROTOCOL_ERROR),
    "zero-window-update": (fr.window_update(0, 0), ErrorCode.PROTOCOL_ERROR),
    "bad-settings-length": (fr.serialize(FrameType.SETTINGS, 0, 0, b"\x00" * 5), ErrorCode.FRAME_SIZE_ERROR),
    "push-promise": (fr.serialize(FrameType.PUSH_PROMISE, Flag.END_HEADERS, 1, b"\x00\x00\x00\x02"),
                     ErrorCode.PROTOCOL_ERROR),
    "data-on-idle-stream": (fr.serialize(FrameType.DATA, 0, 7, b"\x00" * 5), ErrorCode.PROTOCOL_ERROR),
    "short-ping": (fr.serialize(FrameType.PING, 0, 0, b"\x00" * 7), ErrorCode.FRAME_SIZE_ERROR),
    "huge-max-frame-setting": (fr.serialize(FrameType.SETTINGS, 0, 0, struct.pack(">HI", 5, 1 << 24)),
                               ErrorCode.PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_client_gets_goaway_and_the_proxy_lives_on(fake, start_proxy, client, sock_dir, case) -> None:
    fake.script(V1_LIST, echo=True)
    fake.script(V1_PODS, response=b"slow", hang=True)
    await start_proxy(fake.socket)
    assert await client.unary_unary(V1_LIST)(b"before") == b"before"  # a connection open before
    in_flight = asyncio.ensure_future(client.unary_unary(V1_PODS)(b"", timeout=10))  # a call under way on it
    await fake.wait_calls(V1_PODS)
    reader, writer = await asyncio.open_unix_connection(str(sock_dir / "proxy.sock"))
    bad, code = MALFORMED[case]
    writer.write(fr.PREFACE + settings_frame() + bad)
    assert await goaway_code(reader) == code
    writer.close()
    # The call under way on the other connection finishes; that connection, and new ones, are served.
    fake.scripts[V1_PODS].release.set()
    assert await in_flight == b"slow"
    assert await client.unary_unary(V1_LIST)(b"after") == b"after"
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}") as fresh:
        assert await fresh.unary_unary(V1_LIST)(b"fresh") == b"fresh"


async def test_not_http2_is_closed_and_the_proxy_lives_on(fake, start_proxy, client, sock_dir) -> None:
    fake.script(V1_LIST, echo=True)
    await start_proxy(fake.socket)
    reader, writer = await asyncio.open_unix_connection(str(sock_dir / "proxy.sock"))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert await client.unary_unary(V1_LIST)(b"x") == b"x"


async def test_backend_settings_limits_are_honoured_by_the_relay(fake, start_proxy, sock_dir) -> None:
    """A 15 MiB request and response through the relay, with the client's 16 KiB frames."""
    fake.script(V1_LIST, echo=True)
    await start_proxy(fake.socket)
    body = b"\x0a" + b"z" * (15 * 1024 * 1024)
    wide = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    async with aio.insecure_channel(f"unix://{sock_dir / 'proxy.sock'}", options=wide) as channel:
        assert await channel.unary_unary(V1_LIST)(body, timeout=30) == body
    assert fake.calls(V1_LIST)[-1].requests == [body]


class FrameTap:
    """A socket splice in front of the fake runtime that records what the runtime is sent."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path, self.target = path, target
        self.sent: list[fr.Frame] = []
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> FrameTap:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(str(self.target))

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bool) -> None:
            buf = b""
            with contextlib.suppress(ConnectionError):
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    if record:
                        buf += chunk
                        if buf.startswith(fr.PREFACE):
                            buf = buf[len(fr.PREFACE):]
                        while True:
                            f, nxt = fr.parse(buf, 0, fr.MAX_FRAME_LIMIT)
                            if f is None:
                                break
                            self.sent.append(fr.Frame(f.type, f.flags, f.stream_id, bytes(f.payload)))
                            buf = buf[nxt:]
            dst.close()

        await asyncio.gather(copy(reader, up_writer, True), copy(up_reader, writer, False))


async def test_client_pings_are_answered_by_the_proxy(fake, start_proxy, sock_dir) -> None:
    """PING is per hop: the runtime never sees a client's pings (grpc-go would count
    pings for answers the proxy gave as abuse: GOAWAY too_many_pings)."""
    fake.script(V1_LIST, echo=True)
    async with FrameTap(sock_dir / "tap.sock", fake.socket) as tap:
        await start_proxy(tap.path)
        reader, writer = await asyncio.open_unix_connection(str(sock_dir / "proxy.sock"))
        marks = [0xC0FFEE00 + n for n in range(20)]
        writer.write(fr.PREFACE + settings_frame() + b"".join(
            fr.serialize(FrameType.PING, 0, 0, struct.pack(">Q", mark)) for mark in marks
        ))
        acks: list[int] = []
        buf = b""
        async with asyncio.timeout(5):
            while len(acks) < len(marks):
                f, nxt = fr.parse(buf, 0, fr.MAX_FRAME_LIMIT)
                if f is None:
                    chunk = await reader.read(65536)
                    assert chunk, "connection closed"
                    buf += chunk
                    continue
                buf = buf[nxt:]
                assert f.type != FrameType.GOAWAY
                if f.type == FrameType.PING:
                    assert f.has(Flag.ACK)
                    acks.append(struct.unpack(">Q", bytes(f.payload))[0])
        assert acks == marks
        # The connection goes on to the runtime: a call on it still works...
        writer.write(_headers(1, request_block(V1_LIST), Flag.END_HEADERS)
                     + fr.serialize(FrameType.DATA, Flag.END_STREAM, 1, struct.pack(">BI", 0, 2) + b"ok"))
        await fake.wait_calls(V1_LIST)
        writer.close()
    # ...and never saw one of the client's pings.
    assert not [f for f in tap.sent if f.type == FrameType.PING and struct.unpack(">Q", f.payload)[0] in marks]
