"""bench/leanhook.py, the benchmark's lean no-op hook server: a gRPC client sees a correct hook server,
and its HTTP/2 keeps the peer's flow control and answers protocol errors with a GOAWAY."""

from __future__ import annotations

import asyncio
import signal
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from bench import leanhook
from bench.procs import PROJECT_ROOT
from cri_api.hookapi import api_pb2 as hookapi
from runtimeproxy.frames.frame import ErrorCode
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

from .rawh2 import (
    ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, PREFACE, SETTINGS, WINDOW_UPDATE, RawPeer, frame,
    grpc_call, open_call, raw_with_settings,
)

PRE_CREATE = HOOK_POINTS[HookType.PRE_CREATE_CONTAINER]


@pytest.fixture
async def lean(sock_dir: Path) -> AsyncIterator[Path]:
    path = sock_dir / "lean.sock"
    server = await leanhook.start(path)
    yield path
    server.close()
    await server.wait_closed()


def _request(point_hook: HookType, size: int = 0) -> bytes:
    point = HOOK_POINTS[point_hook]
    if point.request_type is hookapi.PodSandboxHookRequest:
        msg = point.request_type(pod_meta=hookapi.PodSandboxMetadata(name="web", namespace="default", uid="u1"))
    else:
        msg = point.request_type(container_meta=hookapi.ContainerMetadata(name="c", attempt=1),
                                 container_annotations={"pad": "x" * size} if size else {})
    return msg.SerializeToString()


@pytest.mark.parametrize("hook", list(HookType), ids=lambda h: h.value)
async def test_every_hook_method_answers_an_empty_response(lean: Path, hook: HookType) -> None:
    point = HOOK_POINTS[hook]
    async with aio.insecure_channel(f"unix://{lean}") as channel:
        call = channel.unary_unary(point.full_method, response_deserializer=point.response_type.FromString)
        answer = await call(_request(hook), timeout=5)
    assert answer == point.response_type()


async def test_any_other_method_is_unimplemented(lean: Path) -> None:
    async with aio.insecure_channel(f"unix://{lean}") as channel:
        with pytest.raises(aio.AioRpcError) as err:
            await channel.unary_unary("/runtime.v1alpha1.RuntimeHookService/NoSuchHook")(b"", timeout=5)
        # The connection stays good for the next call.
        assert await channel.unary_unary(PRE_CREATE.full_method)(b"", timeout=5) == b""
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNIMPLEMENTED, "unknown hook method")


async def test_more_than_its_receive_windows_flows_on_one_connection_and_one_stream(lean: Path) -> None:
    # One 20 MiB message, over the 16 MiB a stream may send before a WINDOW_UPDATE of that stream.
    async with aio.insecure_channel(f"unix://{lean}") as channel:
        assert await channel.unary_unary(PRE_CREATE.full_method)(b"\x00" * (20 << 20), timeout=20) == b""
    # 24 MiB in all, over the connection's 16 MiB window: only its WINDOW_UPDATEs let this finish.
    big = _request(HookType.PRE_CREATE_CONTAINER, size=4 * 1024 * 1024)
    async with aio.insecure_channel(f"unix://{lean}") as channel:
        call = channel.unary_unary(PRE_CREATE.full_method)
        for _ in range(6):
            assert await call(big, timeout=10) == b""
        answers = await asyncio.gather(*(call(_request(HookType.PRE_CREATE_CONTAINER), timeout=10)
                                         for _ in range(100)))
    assert answers == [b""] * 100


async def test_its_message_waits_for_the_peers_stream_window(lean: Path) -> None:
    peer = await RawPeer.connect(lean)
    peer.writer.write(frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, 0)))  # INITIAL_WINDOW_SIZE = 0
    await peer.until(SETTINGS)  # the server's own
    peer.writer.write(frame(SETTINGS, ACK, 0, b"") + grpc_call(1, PRE_CREATE.full_method))
    headers = await peer.until(HEADERS, 1)
    assert dict(peer.decoder.decode(headers[-1][3]))[":status"] == "200"
    # A PING's ACK comes after anything the server wrote before it: no DATA while the window is 0.
    peer.writer.write(frame(PING, 0, 0, b"12345678"))
    before_ack = await peer.until(PING)
    assert before_ack[-1][1:] == (ACK, 0, b"12345678")
    assert not [f for f in before_ack if f[0] == DATA]
    peer.writer.write(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 5)))
    rest = await peer.until(HEADERS, 1)
    assert [(f[0], f[3]) for f in rest if f[2] == 1] == [(DATA, b"\x00" * 5), (HEADERS, rest[-1][3])]
    assert rest[-1][1] & END_STREAM
    assert dict(peer.decoder.decode(rest[-1][3])) == {"grpc-status": "0"}
    await peer.close()


async def test_a_stream_window_granted_before_the_answer_counts(lean: Path) -> None:
    peer = await raw_with_settings(lean, (0x4, 0))  # INITIAL_WINDOW_SIZE = 0
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 5))
                      + frame(DATA, END_STREAM, 1, b"\x00" * 5))
    answer = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    assert [f[0] for f in answer if f[2] == 1] == [HEADERS, DATA, HEADERS]
    assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
    await peer.close()


async def test_a_new_initial_window_opens_a_waiting_message(lean: Path) -> None:
    peer = await raw_with_settings(lean, (0x4, 0))
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method))
    await peer.until(HEADERS, 1)
    peer.writer.write(frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, 5)))
    rest = await peer.until(HEADERS, 1)
    assert [f[0] for f in rest if f[2] == 1] == [DATA, HEADERS] and rest[-1][1] & END_STREAM
    await peer.close()


async def test_a_request_in_several_reads_gets_its_stream_window_back(lean: Path) -> None:
    peer = await raw_with_settings(lean)
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(DATA, 0, 1, b"\x00" * 16_000))
    update = (await peer.until(WINDOW_UPDATE, 1))[-1]
    assert struct.unpack(">I", update[3])[0] == 16_000
    peer.writer.write(frame(DATA, END_STREAM, 1, b""))
    assert (await peer.until(HEADERS, 1))[-1][2] == 1
    await peer.close()


async def test_the_peers_header_table_size_is_kept(lean: Path) -> None:
    # A peer that keeps no HPACK table: every answer must decode without one.
    peer = await raw_with_settings(lean, (0x1, 0))
    peer.decoder.header_table_size = 0
    peer.decoder.max_allowed_table_size = 0
    for stream in (1, 3, 5):
        peer.writer.write(grpc_call(stream, PRE_CREATE.full_method))
        answer = await peer.until(HEADERS, stream) + await peer.until(HEADERS, stream)
        blocks = [dict(peer.decoder.decode(f[3])) for f in answer if f[0] == HEADERS]
        assert blocks == [{":status": "200", "content-type": "application/grpc",
                           "grpc-accept-encoding": "identity,deflate,gzip"}, {"grpc-status": "0"}]
    await peer.close()


async def test_a_peers_goaway_lets_its_open_call_finish_then_closes(lean: Path) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        peer = await raw_with_settings(lean)
        peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 0))
                          + frame(PING, 0, 0, b"goaway.."))
        await peer.until(PING)  # the GOAWAY was read, the connection stays for the open call
        peer.writer.write(frame(DATA, END_STREAM, 1, b"\x00" * 5))  # its request, after the GOAWAY
        answer = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
        assert [f[0] for f in answer if f[2] == 1] == [HEADERS, DATA, HEADERS]
        assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
        assert await peer.read() is None  # then the server closes
        await peer.close()
    finally:
        loop.set_exception_handler(previous)
    assert errors == []


@pytest.mark.parametrize(("send", "code"), [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(SETTINGS, 0, 0, b"") + frame(DATA, 0, 1, b"x" * 16_385), ErrorCode.FRAME_SIZE_ERROR),
    (PREFACE + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR),
    (PREFACE + grpc_call(3, PRE_CREATE.full_method) + grpc_call(1, PRE_CREATE.full_method),
     ErrorCode.PROTOCOL_ERROR),  # a stream id below one already used
    (PREFACE + frame(HEADERS, 0, 1, b"") + frame(DATA, END_STREAM, 1, b""), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(HEADERS, 0, 1, b"") + frame(0x9, 0, 1, b"\x00" * 16_000) * 5, ErrorCode.ENHANCE_YOUR_CALM),
    (PREFACE + frame(SETTINGS, 0, 0, b"\x00\x04"), ErrorCode.FRAME_SIZE_ERROR),
    (PREFACE + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)), ErrorCode.PROTOCOL_ERROR),
    (PREFACE + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF)), ErrorCode.FLOW_CONTROL_ERROR),
    (PREFACE + frame(PING, 0, 0, b"1234567"), ErrorCode.FRAME_SIZE_ERROR),
])
async def test_a_protocol_error_ends_only_its_connection_with_a_goaway(lean: Path, send: bytes,
                                                                       code: ErrorCode) -> None:
    async with aio.insecure_channel(f"unix://{lean}") as channel:
        call = channel.unary_unary(PRE_CREATE.full_method)
        assert await call(b"", timeout=5) == b""
        peer = RawPeer(*await asyncio.open_unix_connection(str(lean)))
        peer.writer.write(send)
        assert await peer.goaway_code() == code
        await peer.close()
        assert await call(b"", timeout=5) == b""  # the other connection lives on


async def test_the_process_says_ready_and_leaves_no_socket_behind(sock_dir: Path) -> None:
    path = sock_dir / "proc.sock"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.leanhook", str(path),
                                                cwd=PROJECT_ROOT, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
        async with aio.insecure_channel(f"unix://{path}") as channel:
            assert await channel.unary_unary(PRE_CREATE.full_method)(b"", timeout=5) == b""
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert not path.exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
