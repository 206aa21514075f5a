"""The SDK's frames transport (hooks.frameserver) against hand-driven HTTP/2 peers that
err: a reset stream, a request over the limit, not gRPC or badly compressed, protocol
errors (of a stream: RST_STREAM; of the connection: GOAWAY), late trailers.
"""

from __future__ import annotations

import asyncio
import gzip
import struct
import urllib.parse
from pathlib import Path

import grpc
import hpack
import pytest
from grpc import aio

from runtimeproxy.frames.frame import ErrorCode

from ..rawh2 import (
    ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, PREFACE, RST_STREAM, SETTINGS, WINDOW_UPDATE, RawPeer,
    frame, grpc_call, literal_headers, open_call, raw_with_settings,
)
from . import scriptedserver
from .scriptedserver import LIMIT, PRE_CREATE, Scripted, call_outcome, hook_request_bytes

frames = scriptedserver.frames  # the fixture, here for pytest to find


async def test_a_reset_stream_cancels_its_handler_and_the_connection_lives(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method, hook_request_bytes("wait")))
    await asyncio.wait_for(frames.started.wait(), 5)
    peer.writer.write(frame(RST_STREAM, 0, 1, struct.pack(">I", ErrorCode.CANCEL)))
    await asyncio.wait_for(frames.cancelled.wait(), 5)
    peer.writer.write(grpc_call(3, PRE_CREATE.full_method, hook_request_bytes("none")))
    assert (await peer.until(HEADERS, 3))[-1][2] == 3
    await peer.close()


def send_over_limit(peer: RawPeer) -> None:
    """Stream 1: a request that says it is twice the limit, and more than the limit of it."""
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(DATA, 0, 1, b"\x00" + struct.pack(">I", 2 * LIMIT)))
    for _ in range(LIMIT // 16_000 + 1):
        peer.writer.write(frame(DATA, 0, 1, b"\x00" * 16_000))


async def test_a_request_over_the_limit_is_refused_before_it_has_all_come(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    send_over_limit(peer)
    seen = await peer.until(RST_STREAM, 1)
    trailers = [f for f in seen if f[0] == HEADERS and f[2] == 1][-1]
    assert trailers[1] & END_STREAM
    assert dict(peer.decoder.decode(trailers[3]))["grpc-status"] == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
    assert struct.unpack(">I", seen[-1][3])[0] == ErrorCode.NO_ERROR
    await peer.close()


async def test_a_request_that_is_not_grpc_gets_an_http_status(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", PRE_CREATE.full_method),
                             (":authority", "x"), ("content-type", "text/plain")])
    peer.writer.write(frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
    answer = (await peer.until(HEADERS, 1))[-1]
    assert answer[1] & END_STREAM and dict(peer.decoder.decode(answer[3])) == {":status": "415"}
    await peer.close()


@pytest.mark.parametrize(("send", "code"), [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0, b"") + frame(DATA, 0, 1, b"x" * 16_385), ErrorCode.FRAME_SIZE_ERROR),
    (PREFACE + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR),
    (PREFACE + grpc_call(3, PRE_CREATE.full_method) + grpc_call(1, PRE_CREATE.full_method), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(HEADERS, 0, 1, b"") + frame(DATA, END_STREAM, 1, b""), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(HEADERS, 0, 1, b"") + frame(0x9, 0, 1, b"\x00" * 16_000) * 5, ErrorCode.ENHANCE_YOUR_CALM),
    (PREFACE + frame(DATA, 0, 7, b"x"), ErrorCode.PROTOCOL_ERROR),  # a stream never opened
    (PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 0x5, 100)), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF)), ErrorCode.FLOW_CONTROL_ERROR),
    (PREFACE + frame(PING, 0, 0, b"1234567"), ErrorCode.FRAME_SIZE_ERROR),
    (PREFACE + frame(0x5, END_HEADERS, 1, b"\x00" * 8), ErrorCode.PROTOCOL_ERROR),  # PUSH_PROMISE
    (PREFACE + frame(SETTINGS, 0, 1, b""), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(SETTINGS, ACK, 0, b"\x00" * 6), ErrorCode.FRAME_SIZE_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 0x2, 2)), ErrorCode.PROTOCOL_ERROR),  # ENABLE_PUSH=2
    (PREFACE + frame(RST_STREAM, 0, 9, struct.pack(">I", 8)), ErrorCode.PROTOCOL_ERROR),  # an idle stream
    (PREFACE + frame(RST_STREAM, 0, 0, struct.pack(">I", 8)), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(WINDOW_UPDATE, 0, 9, struct.pack(">I", 1)), ErrorCode.PROTOCOL_ERROR),  # an idle stream
    (PREFACE + frame(GOAWAY, 0, 1, struct.pack(">II", 0, 0)), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(0x2, 0, 0, b"\x00" * 5), ErrorCode.PROTOCOL_ERROR),  # PRIORITY on stream 0
    # Even ids are the server's, and it opens none: below the last stream, still idle.
    (PREFACE + grpc_call(3, PRE_CREATE.full_method) + frame(WINDOW_UPDATE, 0, 2, struct.pack(">I", 1)),
     ErrorCode.PROTOCOL_ERROR),
    (PREFACE + grpc_call(3, PRE_CREATE.full_method) + frame(RST_STREAM, 0, 2, struct.pack(">I", 8)),
     ErrorCode.PROTOCOL_ERROR),
])
async def test_a_protocol_error_ends_only_its_connection_with_a_goaway(frames: Scripted, send: bytes,
                                                                       code: ErrorCode) -> None:
    async with aio.insecure_channel(frames.target) as channel:
        assert (await call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("none")))[0] == "OK"
        peer = RawPeer(*await asyncio.open_unix_connection(frames.socket_path))
        peer.writer.write(send)
        assert await peer.goaway_code() == code
        await peer.close()
        assert (await call_outcome(channel, PRE_CREATE.full_method, hook_request_bytes("none")))[0] == "OK"


_GZIPPED = gzip.compress(hook_request_bytes("none"))


_UNDECOMPRESSED = "cannot decompress the request: "


@pytest.mark.parametrize(("message", "code", "says"), [
    # a few KiB on the wire; no "cannot decompress" (before: it said so too)
    (gzip.compress(b"\x00" * (2 * LIMIT)), grpc.StatusCode.RESOURCE_EXHAUSTED, "request message over the limit"),
    (_GZIPPED[:-8], grpc.StatusCode.INTERNAL, _UNDECOMPRESSED),  # its trailer cut off
    (_GZIPPED + b"junk", grpc.StatusCode.INTERNAL, _UNDECOMPRESSED),
    (b"not gzip at all", grpc.StatusCode.INTERNAL, _UNDECOMPRESSED),
], ids=["bomb", "truncated", "trailing-data", "garbage"])
async def test_a_bad_compressed_request_is_refused(frames: Scripted, message: bytes, code: grpc.StatusCode,
                                                   says: str) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", PRE_CREATE.full_method),
                             (":authority", "x"), ("content-type", "application/grpc"), ("grpc-encoding", "gzip")])
    peer.writer.write(frame(HEADERS, END_HEADERS, 1, block)
                      + frame(DATA, END_STREAM, 1, b"\x01" + struct.pack(">I", len(message)) + message))
    answer = (await peer.until(HEADERS, 1))[-1]
    trailers = dict(peer.decoder.decode(answer[3]))
    assert trailers["grpc-status"] == str(code.value[0])
    assert urllib.parse.unquote(trailers["grpc-message"]).startswith(says)
    assert not frames.started.is_set()
    await peer.close()


async def test_late_trailers_of_a_request_answered_early_are_ignored(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    send_over_limit(peer)
    for f in await peer.until(RST_STREAM, 1):
        if f[0] == HEADERS:
            peer.decoder.decode(f[3])  # HPACK: every block, in order
    peer.writer.write(frame(HEADERS, END_HEADERS | END_STREAM, 1, literal_headers([("grpc-status", "0")]))
                      + grpc_call(3, PRE_CREATE.full_method, hook_request_bytes("none")))
    answer = await peer.until(HEADERS, 3) + await peer.until(HEADERS, 3)
    assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
    assert GOAWAY not in [f[0] for f in answer]
    await peer.close()


async def test_a_stream_error_resets_only_its_stream(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 0)))
    reset = (await peer.until(RST_STREAM, 1))[-1]
    assert struct.unpack(">I", reset[3])[0] == ErrorCode.PROTOCOL_ERROR
    peer.writer.write(grpc_call(3, PRE_CREATE.full_method, hook_request_bytes("none")))
    answer = await peer.until(HEADERS, 3) + await peer.until(HEADERS, 3)
    assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
    await peer.close()


async def test_a_malformed_grpc_timeout_costs_no_other_call(frames: Scripted) -> None:
    """More digits than gRPC allows (8) once overflowed a float and aborted the connection."""
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method, hook_request_bytes("wait")))
    await asyncio.wait_for(frames.started.wait(), 5)
    block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", PRE_CREATE.full_method),
        ("content-type", "application/grpc"), ("grpc-timeout", "9" * 400 + "S"))])
    body = hook_request_bytes("none")
    peer.writer.write(frame(HEADERS, END_HEADERS, 3, block)
                      + frame(DATA, END_STREAM, 3, b"\0" + struct.pack(">I", len(body)) + body))
    assert (await peer.until(HEADERS, 3))[-1][2] == 3  # answered, as a call with no deadline
    assert not frames.cancelled.is_set()
    frames.release.set()
    assert (await peer.until(HEADERS, 1))[-1][2] == 1
    await peer.close()
