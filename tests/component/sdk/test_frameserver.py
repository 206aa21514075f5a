"""The SDK's frames transport (hooks.frameserver) against grpc.aio clients and hand-driven HTTP/2 peers.

The differential test runs one set of calls on both transports: a grpc
client must not tell them apart, except in the wording of the errors grpc
itself writes (limits), where only the code is compared, and in the code of
an undecodable request (grpc.aio: UNKNOWN; frames: INTERNAL).
"""

from __future__ import annotations

import asyncio
import gzip
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc import aio

from cri_api.hookapi import api_pb2 as hookapi
from hooks.frameserver import FrameServer, connection, sending
from hooks.sdk import HookAbort, HookServer
from runtimeproxy.frames.frame import ErrorCode
from runtimeproxy.hookpath.points import HOOK_POINTS, HookType

from ..rawh2 import (
    ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, PREFACE, RST_STREAM, SETTINGS, WINDOW_UPDATE, RawPeer,
    frame, grpc_call, literal_headers, open_call, raw_with_settings,
)

PRE_CREATE = HOOK_POINTS[HookType.PRE_CREATE_CONTAINER]
PRE_RUN = HOOK_POINTS[HookType.PRE_RUN_POD_SANDBOX]
LIMIT = 1 << 20  # both transports' message limit in these tests


class Scripted(HookServer):
    """Behaves as the container's name says."""

    def __init__(self, path: Path, transport: str) -> None:
        super().__init__(path, transport=transport, grace=0.5,
                         options=[("grpc.max_receive_message_length", LIMIT), ("grpc.max_send_message_length", LIMIT)])
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, hook: HookType, request: Message) -> Message | None:
        if hook is HookType.PRE_RUN_POD_SANDBOX:
            return hookapi.PodSandboxHookResponse(labels={"pod": request.pod_meta.name})  # type: ignore[attr-defined]
        what = request.container_meta.name  # type: ignore[attr-defined]
        if what == "none":
            return None
        if what == "abort":
            raise HookAbort(grpc.StatusCode.PERMISSION_DENIED, "nein: ü 100% \n done")
        if what == "abort-ok":
            raise HookAbort(grpc.StatusCode.OK)
        if what == "abort-bare":
            raise HookAbort(grpc.StatusCode.FAILED_PRECONDITION)
        if what == "boom":
            raise ValueError("boom")
        if what == "wrong":
            return hookapi.PodSandboxHookResponse()
        if what == "big":
            return hookapi.ContainerResourceHookResponse(container_annotations={"big": "x" * (LIMIT + 10)})
        if what == "wait":
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        size = int(what) if what.isdigit() else 0
        return hookapi.ContainerResourceHookResponse(container_annotations={"echo": "y" * size, "n": what})


@pytest.fixture(params=["frames", "grpc"])
async def server(request: pytest.FixtureRequest, sock_dir: Path) -> AsyncIterator[Scripted]:
    hook_server = Scripted(sock_dir / f"{request.param}.sock", request.param)
    async with hook_server:
        yield hook_server


@pytest.fixture
async def frames(sock_dir: Path) -> AsyncIterator[Scripted]:
    hook_server = Scripted(sock_dir / "f.sock", "frames")
    async with hook_server:
        yield hook_server


def _container(name: str, pad: int = 0) -> bytes:
    return hookapi.ContainerResourceHookRequest(
        container_meta=hookapi.ContainerMetadata(name=name),
        container_annotations={"pad": "p" * pad} if pad else {},
    ).SerializeToString()


async def _outcome(channel: aio.Channel, method: str, body: bytes, timeout: float = 10) -> tuple[str, str, bytes]:
    try:
        return "OK", "", await channel.unary_unary(method)(body, timeout=timeout)
    except aio.AioRpcError as err:
        return err.code().name, err.details() or "", b""


CASES = [
    ("answer", PRE_CREATE.full_method, _container("12"), True),
    ("none", PRE_CREATE.full_method, _container("none"), True),
    ("pod", PRE_RUN.full_method, hookapi.PodSandboxHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="web")).SerializeToString(), True),
    ("abort", PRE_CREATE.full_method, _container("abort"), True),
    ("abort-bare", PRE_CREATE.full_method, _container("abort-bare"), True),
    ("abort-with-ok", PRE_CREATE.full_method, _container("abort-ok"), True),
    ("handler-raises", PRE_CREATE.full_method, _container("boom"), True),
    ("wrong-type", PRE_CREATE.full_method, _container("wrong"), True),
    ("unknown-method", "/runtime.v1alpha1.RuntimeHookService/NoSuchHook", b"", False),
    ("undecodable", PRE_CREATE.full_method, b"\xff\xff\xff", False),
    ("request-over-limit", PRE_CREATE.full_method, _container("1", pad=LIMIT), False),
    ("response-over-limit", PRE_CREATE.full_method, _container("big"), False),
    ("large-both-ways", PRE_CREATE.full_method, _container(str(LIMIT - 100), pad=LIMIT - 100), True),
]


@pytest.mark.parametrize(("case", "method", "body", "same_details"), CASES, ids=[c[0] for c in CASES])
async def test_a_grpc_client_sees_the_same_on_both_transports(
    sock_dir: Path, case: str, method: str, body: bytes, same_details: bool
) -> None:
    seen = {}
    for transport in ("frames", "grpc"):
        async with Scripted(sock_dir / f"d-{transport}.sock", transport) as hook_server:
            async with aio.insecure_channel(hook_server.target) as channel:
                seen[transport] = await _outcome(channel, method, body)
                # The connection serves the next call after any of these.
                assert (await _outcome(channel, PRE_CREATE.full_method, _container("none")))[0] == "OK"
    frames, grpc_ = seen["frames"], seen["grpc"]
    if case == "undecodable":
        # The one difference: grpc.aio reports its deserializer's exception as
        # UNKNOWN; the frames transport says what it is, INTERNAL.
        assert (frames[0], grpc_[0]) == ("INTERNAL", "UNKNOWN")
        assert "cannot decode the PreCreateContainerHook request" in frames[1]
        return
    if same_details:
        assert frames == grpc_
    else:
        assert (frames[0], frames[2]) == (grpc_[0], grpc_[2])
    assert frames[0] != "UNKNOWN"


async def test_deadline_cancels_the_handler(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        code, _, _ = await _outcome(channel, PRE_CREATE.full_method, _container("wait"), timeout=0.3)
        await asyncio.wait_for(server.cancelled.wait(), 5)
    assert code == "DEADLINE_EXCEEDED"


async def test_a_client_that_cancels_cancels_the_handler(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        call = channel.unary_unary(PRE_CREATE.full_method)(_container("wait"), timeout=10)
        await asyncio.wait_for(server.started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(server.cancelled.wait(), 5)


async def test_stop_lets_open_calls_finish_within_grace_and_refuses_new_ones(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        call = asyncio.ensure_future(_outcome(channel, PRE_CREATE.full_method, _container("wait")))
        await asyncio.wait_for(server.started.wait(), 5)
        stopping = asyncio.ensure_future(server.stop(5))
        await asyncio.sleep(0)  # stop has begun: the socket is closed to new callers
        server.release.set()
        assert (await call)[0] == "OK"
        await asyncio.wait_for(stopping, 5)
        assert await server.wait_for_termination(0) is False
        assert (await _outcome(channel, PRE_CREATE.full_method, _container("none"), timeout=2))[0] in (
            "UNAVAILABLE", "DEADLINE_EXCEEDED")
    assert not Path(server.socket_path).exists()


async def test_stop_cancels_what_outlives_the_grace(server: Scripted) -> None:
    async with aio.insecure_channel(server.target) as channel:
        call = asyncio.ensure_future(_outcome(channel, PRE_CREATE.full_method, _container("wait")))
        await asyncio.wait_for(server.started.wait(), 5)
        await asyncio.wait_for(server.stop(0.2), 5)
        assert server.cancelled.is_set()
        assert (await call)[0] in ("UNAVAILABLE", "CANCELLED", "INTERNAL")


async def test_many_large_calls_at_once_on_one_connection(frames: Scripted) -> None:
    size = LIMIT // 2
    async with aio.insecure_channel(frames.target) as channel:
        method = channel.unary_unary(PRE_CREATE.full_method, response_deserializer=hookapi.ContainerResourceHookResponse.FromString)
        answers = await asyncio.gather(*(method(_container(str(size), pad=size), timeout=30) for _ in range(24)),
                                       *(method(_container("3"), timeout=30) for _ in range(50)))
    assert [len(a.container_annotations["echo"]) for a in answers] == [size] * 24 + [3] * 50


async def test_a_shut_stream_window_holds_only_its_own_answer(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path), (0x4, 0))  # INITIAL_WINDOW_SIZE = 0
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method, _container("5"))
                      + grpc_call(3, PRE_CREATE.full_method, _container("6")))
    await peer.until(HEADERS, 3)  # both answers' headers come; their DATA waits
    peer.writer.write(frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", 1 << 16)))
    seen = await peer.until(HEADERS, 3)  # stream 3's trailers
    assert not [f for f in seen if f[0] == DATA and f[2] == 1]
    assert dict(peer.decoder.decode(seen[-1][3])) == {"grpc-status": "0"}
    peer.writer.write(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 16)))
    rest = await peer.until(HEADERS, 1)
    body = b"".join(f[3] for f in rest if f[0] == DATA and f[2] == 1)
    answer = hookapi.ContainerResourceHookResponse.FromString(body[5:])
    assert answer.container_annotations["echo"] == "yyyyy"
    await peer.close()


async def test_the_connection_window_comes_back_in_batches_not_per_small_call(frames: Scripted) -> None:
    """A small call's answer is all the server writes for it (no WINDOW_UPDATE to wake the
    client for); the connection's window comes back once CREDIT_BATCH of it was used."""
    from hooks.frameserver.settings import CREDIT_BATCH

    peer = await raw_with_settings(Path(frames.socket_path))
    for stream in (1, 3):  # the first answer follows the server's SETTINGS and window grant
        peer.writer.write(grpc_call(stream, PRE_CREATE.full_method, _container("5")))
        seen = await peer.until(HEADERS, stream) + await peer.until(HEADERS, stream)
    assert [f[0] for f in seen] == [HEADERS, DATA, HEADERS]
    message = _container("none", pad=CREDIT_BATCH // 8)  # a large request, an empty answer
    body = b"\x00" + struct.pack(">I", len(message)) + message
    chunks = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    stream, updates = 5, []
    while not updates:  # calls until CREDIT_BATCH of the window is used
        peer.writer.write(open_call(stream, PRE_CREATE.full_method) + b"".join(
            frame(DATA, END_STREAM if chunk is chunks[-1] else 0, stream, chunk) for chunk in chunks))
        seen = await peer.until(HEADERS, stream) + await peer.until(HEADERS, stream)
        updates = [f for f in seen if f[0] == WINDOW_UPDATE and f[2] == 0]
        stream += 2
        assert stream < 40
    assert struct.unpack(">I", updates[0][3])[0] >= CREDIT_BATCH
    await peer.close()


async def test_answers_are_framed_at_the_peers_max_frame_size(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path), (0x5, 40_000))  # MAX_FRAME_SIZE
    peer.writer.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)))
    message = _container("100000")
    peer.writer.write(frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(message)) + message))
    frames_seen = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    sizes = [len(f[3]) for f in frames_seen if f[0] == DATA]
    assert max(sizes) == 40_000 and sum(sizes) > 100_000
    await peer.close()


async def test_a_reset_stream_cancels_its_handler_and_the_connection_lives(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method, _container("wait")))
    await asyncio.wait_for(frames.started.wait(), 5)
    peer.writer.write(frame(RST_STREAM, 0, 1, struct.pack(">I", ErrorCode.CANCEL)))
    await asyncio.wait_for(frames.cancelled.wait(), 5)
    peer.writer.write(grpc_call(3, PRE_CREATE.full_method, _container("none")))
    assert (await peer.until(HEADERS, 3))[-1][2] == 3
    await peer.close()


async def test_a_request_over_the_limit_is_refused_before_it_has_all_come(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(DATA, 0, 1, b"\x00" + struct.pack(">I", 2 * LIMIT)))
    for _ in range(LIMIT // 16_000 + 1):
        peer.writer.write(frame(DATA, 0, 1, b"\x00" * 16_000))
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
        assert (await _outcome(channel, PRE_CREATE.full_method, _container("none")))[0] == "OK"
        peer = RawPeer(*await asyncio.open_unix_connection(frames.socket_path))
        peer.writer.write(send)
        assert await peer.goaway_code() == code
        await peer.close()
        assert (await _outcome(channel, PRE_CREATE.full_method, _container("none")))[0] == "OK"


async def test_a_peers_goaway_lets_its_open_call_finish_then_closes(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 0)))
    message = _container("2")
    peer.writer.write(frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(message)) + message))
    answer = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
    assert await peer.read() is None
    await peer.close()


async def test_gzip_requests_are_served_as_on_grpc(sock_dir: Path) -> None:
    seen = {}
    for transport in ("frames", "grpc"):
        async with Scripted(sock_dir / f"z-{transport}.sock", transport) as hook_server:
            async with aio.insecure_channel(hook_server.target, compression=grpc.Compression.Gzip) as channel:
                seen[transport] = await _outcome(channel, PRE_CREATE.full_method, _container("40", pad=50_000))
    assert seen["frames"] == seen["grpc"] and seen["frames"][0] == "OK"


_GZIPPED = gzip.compress(_container("none"))


@pytest.mark.parametrize(("message", "code"), [
    (gzip.compress(b"\x00" * (2 * LIMIT)), grpc.StatusCode.RESOURCE_EXHAUSTED),  # a few KiB on the wire
    (_GZIPPED[:-8], grpc.StatusCode.INTERNAL),  # its trailer cut off
    (_GZIPPED + b"junk", grpc.StatusCode.INTERNAL),
    (b"not gzip at all", grpc.StatusCode.INTERNAL),
], ids=["bomb", "truncated", "trailing-data", "garbage"])
async def test_a_bad_compressed_request_is_refused(frames: Scripted, message: bytes, code: grpc.StatusCode) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", PRE_CREATE.full_method),
                             (":authority", "x"), ("content-type", "application/grpc"), ("grpc-encoding", "gzip")])
    peer.writer.write(frame(HEADERS, END_HEADERS, 1, block)
                      + frame(DATA, END_STREAM, 1, b"\x01" + struct.pack(">I", len(message)) + message))
    answer = (await peer.until(HEADERS, 1))[-1]
    assert dict(peer.decoder.decode(answer[3]))["grpc-status"] == str(code.value[0])
    assert not frames.started.is_set()
    await peer.close()


@pytest.mark.parametrize("transport", ["frames", "grpc"])
async def test_stop_with_no_grace_cancels_at_once(sock_dir: Path, transport: str) -> None:
    hook_server = Scripted(sock_dir / f"n-{transport}.sock", transport)
    hook_server._grace = None  # grpc.aio's meaning: abort every call now
    await hook_server.start()
    async with aio.insecure_channel(hook_server.target) as channel:
        call = asyncio.ensure_future(_outcome(channel, PRE_CREATE.full_method, _container("wait")))
        await asyncio.wait_for(hook_server.started.wait(), 5)
        await asyncio.wait_for(hook_server.stop(), 5)
        assert hook_server.cancelled.is_set()
        assert (await call)[0] != "OK"


async def test_a_connection_accepted_as_the_server_stops_is_closed_too(sock_dir: Path) -> None:
    path = sock_dir / "race.sock"
    server = FrameServer({}, max_receive=LIMIT, max_send=LIMIT)
    stopping: list[asyncio.Task[None]] = []
    accepted = asyncio.Event()
    make = server._connection

    def accept_while_stopping():  # type: ignore[no-untyped-def]
        conn = make()
        stopping.append(asyncio.ensure_future(server.stop(0)))  # before the loop has connected it
        accepted.set()
        return conn

    server._connection = accept_while_stopping  # type: ignore[method-assign]
    await server.start(path)
    peer = RawPeer(*await asyncio.open_unix_connection(str(path)))
    await asyncio.wait_for(accepted.wait(), 5)
    await asyncio.wait_for(stopping[0], 5)
    while (f := await peer.read()) is not None:  # whatever came before, the connection ends
        assert f[0] != HEADERS
    peer.writer.transport.abort()


async def test_a_peer_that_does_not_read_is_not_read_either(frames: Scripted, sock_dir: Path) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    pings = frame(PING, 0, 0, b"12345678") * 65_536  # 1.1 MiB of PINGs, each answered by an ACK
    with pytest.raises(TimeoutError):
        for _ in range(64):
            peer.writer.write(pings)
            await asyncio.wait_for(peer.writer.drain(), 2)
    (conn,) = frames._server._connections  # type: ignore[union-attr]
    assert conn._transport.get_write_buffer_size() < 2 << 20  # its ACKs wait in the socket, not here
    peer.writer.transport.abort()


async def test_late_trailers_of_a_refused_stream_are_ignored(frames: Scripted) -> None:
    # The server is going away: a new stream is refused, and its client's trailers must not end the connection.
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(grpc_call(1, PRE_CREATE.full_method, _container("wait")))
    await asyncio.wait_for(frames.started.wait(), 5)
    stopping = asyncio.ensure_future(frames.stop(10))
    await peer.until(GOAWAY)
    peer.writer.write(open_call(3, PRE_CREATE.full_method))
    assert (await peer.until(RST_STREAM, 3))[-1][2] == 3
    peer.writer.write(frame(HEADERS, END_HEADERS | END_STREAM, 3, literal_headers([("grpc-status", "0")])))
    frames.release.set()  # stream 1, let finish by the graceful stop, is still answered
    seen = await peer.until(HEADERS, 1) + await peer.until(HEADERS, 1)
    blocks = [dict(peer.decoder.decode(f[3])) for f in seen if f[0] == HEADERS]
    assert blocks[-1] == {"grpc-status": "0"}
    await asyncio.wait_for(stopping, 5)


async def test_late_trailers_of_a_request_answered_early_are_ignored(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(DATA, 0, 1, b"\x00" + struct.pack(">I", 2 * LIMIT)))
    for _ in range(LIMIT // 16_000 + 1):
        peer.writer.write(frame(DATA, 0, 1, b"\x00" * 16_000))
    for f in await peer.until(RST_STREAM, 1):
        if f[0] == HEADERS:
            peer.decoder.decode(f[3])  # HPACK: every block, in order
    peer.writer.write(frame(HEADERS, END_HEADERS | END_STREAM, 1, literal_headers([("grpc-status", "0")]))
                      + grpc_call(3, PRE_CREATE.full_method, _container("none")))
    answer = await peer.until(HEADERS, 3) + await peer.until(HEADERS, 3)
    assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
    assert GOAWAY not in [f[0] for f in answer]
    await peer.close()


async def test_a_stream_error_resets_only_its_stream(frames: Scripted) -> None:
    peer = await raw_with_settings(Path(frames.socket_path))
    peer.writer.write(open_call(1, PRE_CREATE.full_method) + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 0)))
    reset = (await peer.until(RST_STREAM, 1))[-1]
    assert struct.unpack(">I", reset[3])[0] == ErrorCode.PROTOCOL_ERROR
    peer.writer.write(grpc_call(3, PRE_CREATE.full_method, _container("none")))
    answer = await peer.until(HEADERS, 3) + await peer.until(HEADERS, 3)
    assert dict(peer.decoder.decode(answer[-1][3])) == {"grpc-status": "0"}
    await peer.close()


async def test_a_peer_that_writes_before_it_reads_is_still_read(frames: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    # An answer fills the server's write buffer while the client, reading later, sends its next request:
    # that answer's DATA is not control backlog, and the request must still be read.
    monkeypatch.setattr(sending, "CONTROL_BACKLOG", 100_000)
    paused = asyncio.Event()
    pause_writing = connection.Connection.pause_writing

    def note_pause(self: connection.Connection) -> None:
        pause_writing(self)
        paused.set()

    monkeypatch.setattr(connection.Connection, "pause_writing", note_pause)
    peer = await raw_with_settings(Path(frames.socket_path), (0x4, 32 << 20))
    peer.writer.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 32 << 20))
                      + grpc_call(1, PRE_CREATE.full_method, _container(str(LIMIT - 200))))
    await asyncio.wait_for(paused.wait(), 5)
    message = _container("1", pad=900_000)
    body = b"\x00" + struct.pack(">I", len(message)) + message
    chunks = [body[i:i + 16_000] for i in range(0, len(body), 16_000)]
    peer.writer.write(open_call(3, PRE_CREATE.full_method)
                      + b"".join(frame(DATA, END_STREAM if i == len(chunks) - 1 else 0, 3, c) for i, c in enumerate(chunks)))
    await asyncio.wait_for(peer.writer.drain(), 5)
    answers = {1: b"", 3: b""}
    while True:
        f = await peer.read()
        assert f is not None
        if f[0] == DATA:
            answers[f[2]] += f[3]
        elif f[0] == HEADERS:
            peer.decoder.decode(f[3])
            if f[1] & END_STREAM and f[2] == 3:
                break
    assert len(hookapi.ContainerResourceHookResponse.FromString(answers[3][5:]).container_annotations["echo"]) == 1
    peer.writer.transport.abort()
