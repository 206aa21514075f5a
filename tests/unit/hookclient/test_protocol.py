"""The proxy's HTTP/2 hook client against a server written frame by frame."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import grpc
import pytest

from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType, Setting
from runtimeproxy.hookclient.pool import FramesTransport
from runtimeproxy.hookclient.transport import CallFailed

from .h2server import Peer, answering, call, failed, serving


async def test_request_headers_are_grpcs_and_the_answer_is_the_message(sock: Path) -> None:
    async def answer(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        assert got.message == b"req"
        peer.answer(got.stream_id, b"the answer")
        await peer.call()  # a second call on the same connection
        peer.answer(3, b"again")

    transport = FramesTransport()
    async with serving(sock, answer) as peers:
        assert await call(transport, sock) == b"the answer"
        assert await call(transport, sock, timeout=2.5) == b"again"
        assert len(peers) == 1
        first = peers[0]
        headers = [p for kind, _, _, p in first.seen if kind == FrameType.HEADERS]
        assert len(headers) == 2
    await transport.close(1)


async def test_tiny_windows_and_frames_are_kept_and_a_big_request_arrives_whole(sock: Path) -> None:
    """The server allows 16 bytes per stream and gives 100 more after each
    DATA frame: the client never sends beyond that."""
    message = bytes(range(256)) * 40  # 10 KiB

    async def stingy(peer: Peer) -> None:
        await peer.handshake({Setting.INITIAL_WINDOW_SIZE: 16, Setting.MAX_FRAME_SIZE: 16_384})
        first = await peer.call()  # sent before our SETTINGS came: within the default window
        peer.answer(first.stream_id, b"first")
        got = await peer.call(grant=lambda n: 100)
        assert got.message == message
        peer.answer(got.stream_id, b"ok")

    transport = FramesTransport()
    async with serving(sock, stingy) as peers:
        assert await call(transport, sock) == b"first"
        assert await call(transport, sock, message) == b"ok"
        sizes = [len(p) for kind, _, sid, p in peers[0].seen if kind == FrameType.DATA and sid == 3]
        assert sizes[0] == 16 and max(sizes) <= 100 and sum(sizes) == len(message) + 5
    await transport.close(1)


async def test_a_large_answer_is_read_with_window_updates(sock: Path) -> None:
    answer = b"x" * (3 << 20)  # over the stream window (1 MiB): needs our WINDOW_UPDATEs

    async def big(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        # The client's SETTINGS gave each stream 1 MiB; send within what it grants.
        stream_window = 1 << 20
        payload = struct.pack(">BI", 0, len(answer)) + answer
        peer.answer_headers(got.stream_id)
        view = memoryview(payload)
        while view:
            n = min(16_384, len(view), stream_window, peer.window)
            if n == 0:
                _, _, sid, p = await peer.until(FrameType.WINDOW_UPDATE)
                if sid == got.stream_id:
                    stream_window += int.from_bytes(p, "big")
                continue
            peer.send(FrameType.DATA, 0, got.stream_id, bytes(view[:n]))
            view, stream_window, peer.window = view[n:], stream_window - n, peer.window - n
        peer.trailers(got.stream_id)

    transport = FramesTransport()
    async with serving(sock, big):
        assert await call(transport, sock) == answer
    await transport.close(1)


@pytest.mark.parametrize(
    ("status", "message", "code", "details"),
    [
        (9, "not now", grpc.StatusCode.FAILED_PRECONDITION, "not now"),
        (13, "a%20b%25", grpc.StatusCode.INTERNAL, "a b%"),  # percent-decoded, as grpc does
        (77, "", grpc.StatusCode.UNKNOWN, "hook server sent grpc-status '77'; "),
    ],
)
async def test_a_trailers_only_answer_is_its_status(
    sock: Path, status: int, message: str, code: grpc.StatusCode, details: str
) -> None:
    async def refuse(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        peer.answer_headers(got.stream_id, [("grpc-status", str(status)), ("grpc-message", message)], end=True)

    transport = FramesTransport()
    async with serving(sock, refuse):
        err = await failed(transport, sock)
        assert (err.code, err.details) == (code, details)
    await transport.close(1)


@pytest.mark.parametrize(("http", "code"), [("503", grpc.StatusCode.UNAVAILABLE), ("404", grpc.StatusCode.UNIMPLEMENTED),
                                             ("418", grpc.StatusCode.UNKNOWN)])
async def test_an_http_error_maps_as_grpc_maps_it(sock: Path, http: str, code: grpc.StatusCode) -> None:
    async def not_grpc(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        block = peer.encoder.encode([(":status", http)])
        peer.send(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, got.stream_id, block)

    transport = FramesTransport()
    async with serving(sock, not_grpc):
        err = await failed(transport, sock)
        assert err.code == code and http in err.details
    await transport.close(1)


async def test_goaway_before_the_call_is_sent_again_on_a_new_connection(sock: Path) -> None:
    async def leaving(peer: Peer) -> None:
        await peer.handshake()
        await peer.call()
        peer.send(FrameType.GOAWAY, 0, 0, struct.pack(">II", 0, ErrorCode.NO_ERROR))  # stream 1 not processed

    transport = FramesTransport()
    async with serving(sock, leaving, answering(b"second connection")) as peers:
        assert await call(transport, sock) == b"second connection"
        assert len(peers) == 2
    await transport.close(1)


async def test_refused_stream_is_sent_again_once_and_then_fails(sock: Path) -> None:
    async def refusing(peer: Peer) -> None:
        await peer.handshake()
        while True:
            got = await peer.call()
            peer.send(FrameType.RST_STREAM, 0, got.stream_id, struct.pack(">I", ErrorCode.REFUSED_STREAM))

    transport = FramesTransport()
    async with serving(sock, refusing) as peers:
        err = await failed(transport, sock)
        assert err.code == grpc.StatusCode.UNAVAILABLE and "REFUSED_STREAM" in err.details
        calls = [sid for peer in peers for kind, _, sid, _ in peer.seen if kind == FrameType.HEADERS]
        assert calls == [1, 3]  # twice, on the one connection (it stays usable)
    await transport.close(1)


@pytest.mark.parametrize(
    ("code", "expected"),
    [(ErrorCode.CANCEL, grpc.StatusCode.CANCELLED), (ErrorCode.INTERNAL_ERROR, grpc.StatusCode.INTERNAL),
     (ErrorCode.ENHANCE_YOUR_CALM, grpc.StatusCode.RESOURCE_EXHAUSTED),  # as grpc maps them
     (ErrorCode.INADEQUATE_SECURITY, grpc.StatusCode.PERMISSION_DENIED)],
)
async def test_a_reset_stream_fails_the_call(sock: Path, code: ErrorCode, expected: grpc.StatusCode) -> None:
    async def reset(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        peer.send(FrameType.RST_STREAM, 0, got.stream_id, struct.pack(">I", code))

    transport = FramesTransport()
    async with serving(sock, reset):
        assert (await failed(transport, sock)).code == expected
    await transport.close(1)


async def test_continuation_padding_and_pings_are_understood(sock: Path) -> None:
    async def odd(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        peer.send(FrameType.PING, 0, 0, b"12345678")
        block = peer.encoder.encode([(":status", "200"), ("content-type", "application/grpc+proto"),
                                     ("x-long", "v" * 100)])
        peer.send(FrameType.HEADERS, 0, got.stream_id, block[:10])
        peer.send(FrameType.CONTINUATION, 0, got.stream_id, block[10:20])
        peer.send(FrameType.CONTINUATION, Flag.END_HEADERS, got.stream_id, block[20:])
        body = struct.pack(">BI", 0, 5) + b"hello"
        peer.send(FrameType.DATA, Flag.PADDED, got.stream_id, bytes([3]) + body + b"\0\0\0")
        peer.send(0x42, 0, 0, b"an unknown frame type is ignored")
        peer.trailers(got.stream_id)
        _, flags, _, payload = await peer.until(FrameType.PING)
        assert flags & Flag.ACK and payload == b"12345678"

    transport = FramesTransport()
    async with serving(sock, odd) as peers:
        assert await call(transport, sock) == b"hello"
        await asyncio.wait_for(peers[0].finished.wait(), 5)  # it got the PING's ACK
    await transport.close(1)


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(lambda peer, sid: peer.send(FrameType.DATA, 0, 7, b"x"), id="frame-on-an-unopened-stream"),
        pytest.param(lambda peer, sid: peer.send(FrameType.PUSH_PROMISE, Flag.END_HEADERS, sid, b"\0\0\0\2"), id="push"),
        pytest.param(lambda peer, sid: peer.writer.write(b"\0\0\4\1\4\0\0\0\1\xff\xff\xff\xff"), id="bad-hpack"),
        pytest.param(lambda peer, sid: peer.send(FrameType.DATA, 0, sid, b"x" * 20_000), id="oversized-frame"),
        pytest.param(
            lambda peer, sid: (peer.send(FrameType.HEADERS, 0, sid, b""), peer.send(FrameType.PING, 0, 0, b"8 bytes!")),
            id="interrupted-header-block",
        ),
        pytest.param(lambda peer, sid: peer.send(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)), id="zero-window"),
        pytest.param(lambda peer, sid: peer.send(FrameType.SETTINGS, 0, 0, b"\0\5\0\0\0\1"), id="bad-max-frame"),
        pytest.param(lambda peer, sid: peer.send(FrameType.SETTINGS, 0, 0, b"\0\2\0\0\0\1"), id="push-enabled"),
        pytest.param(
            lambda peer, sid: [peer.send(FrameType.HEADERS, 0, sid, b"")]
            + [peer.send(FrameType.CONTINUATION, 0, sid, b"") for _ in range(200)],
            id="continuation-flood",
        ),
    ],
)
async def test_a_broken_server_gets_a_goaway_and_the_next_call_a_new_connection(sock: Path, broken) -> None:  # type: ignore[no-untyped-def]
    async def breaks(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        broken(peer, got.stream_id)
        await peer.until(FrameType.GOAWAY)
        await peer.reader.read()  # until the client closes

    transport = FramesTransport()
    async with serving(sock, breaks, answering(b"fine")) as peers:
        err = await failed(transport, sock)
        assert err.code == grpc.StatusCode.UNAVAILABLE and "connection error" in err.details
        await asyncio.wait_for(peers[0].finished.wait(), 5)  # it read the GOAWAY and saw the close
        goaway = [p for kind, _, _, p in peers[0].seen if kind == FrameType.GOAWAY]
        assert len(goaway) == 1 and struct.unpack(">I", goaway[0][4:8])[0] != ErrorCode.NO_ERROR
        assert await call(transport, sock) == b"fine"
    await transport.close(1)


async def test_data_ended_without_trailers_is_internal(sock: Path) -> None:
    async def no_trailers(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        peer.answer_headers(got.stream_id)
        peer.send(FrameType.DATA, Flag.END_STREAM, got.stream_id, struct.pack(">BI", 0, 0))

    transport = FramesTransport()
    async with serving(sock, no_trailers):
        err = await failed(transport, sock)
        assert err.code == grpc.StatusCode.INTERNAL and "trailers" in err.details
    await transport.close(1)


async def test_an_answer_over_the_limit_is_resource_exhausted_and_reset(sock: Path) -> None:
    async def flood(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        peer.answer_headers(got.stream_id)
        peer.send(FrameType.DATA, 0, got.stream_id, struct.pack(">BI", 0, 5000) + b"y" * 5000)
        _, _, sid, payload = await peer.until(FrameType.RST_STREAM)
        assert sid == got.stream_id and int.from_bytes(payload, "big") == ErrorCode.CANCEL

    transport = FramesTransport(max_message=1000)
    async with serving(sock, flood):
        err = await failed(transport, sock)
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(CallFailed) as too_big:
            await call(transport, sock, b"z" * 1001)
        assert too_big.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    await transport.close(1)


async def test_a_server_that_never_answers_is_bounded_by_the_timeout_and_reset(sock: Path) -> None:
    async def silent(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        timeout = got.headers["grpc-timeout"]
        assert timeout.endswith("m") and 0 < int(timeout[:-1]) <= 300  # what is left of the 300 ms (any load)
        _, _, sid, payload = await peer.until(FrameType.RST_STREAM)
        assert sid == got.stream_id and int.from_bytes(payload, "big") == ErrorCode.CANCEL

    transport = FramesTransport()
    async with serving(sock, silent) as peers:
        err = await failed(transport, sock, timeout=0.3)
        assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(peers[0].finished.wait(), 5)  # it saw the RST_STREAM
    await transport.close(1)


async def test_a_server_that_never_speaks_http2_is_bounded_by_the_timeout(sock: Path) -> None:
    async def mute(peer: Peer) -> None:
        await peer.reader.read()

    transport = FramesTransport()
    async with serving(sock, mute):
        assert (await failed(transport, sock, timeout=0.3)).code == grpc.StatusCode.DEADLINE_EXCEEDED
    await transport.close(1)


async def test_max_concurrent_streams_queues_calls_beyond_it(sock: Path) -> None:
    async def one_at_a_time(peer: Peer) -> None:
        await peer.handshake({Setting.MAX_CONCURRENT_STREAMS: 1})
        for _ in range(3):
            got = await peer.call()
            peer.answer(got.stream_id, str(got.stream_id).encode())

    transport = FramesTransport()
    async with serving(sock, one_at_a_time):
        # Sent one after another: the server reads each call only after it answered the one before.
        answers = await asyncio.gather(*(call(transport, sock) for _ in range(3)))
        assert sorted(answers) == [b"1", b"3", b"5"]
    await transport.close(1)


async def test_close_fails_a_call_still_under_way_after_the_grace(sock: Path) -> None:
    received = asyncio.Event()

    async def slow(peer: Peer) -> None:
        await peer.handshake()
        await peer.call()
        received.set()
        await peer.reader.read()

    transport = FramesTransport()
    async with serving(sock, slow):
        pending = asyncio.create_task(call(transport, sock, timeout=30))
        await asyncio.wait_for(received.wait(), 5)
        started = asyncio.get_running_loop().time()
        await transport.close(0.2)
        with pytest.raises(CallFailed) as err:
            await pending
        assert err.value.code == grpc.StatusCode.CANCELLED
        assert asyncio.get_running_loop().time() - started < 5
        assert transport.endpoints() == frozenset()
        # Closed is closed: no new connection is made.
        assert (await failed(transport, sock)).code == grpc.StatusCode.CANCELLED


async def test_a_connection_lost_before_it_is_taken_in_is_not_kept(sock: Path) -> None:
    """The server closes at once, and the loss is seen before the connect's
    done callback: the dead connection must not become the endpoint's."""
    transport = FramesTransport()
    connect = transport._connect

    async def lost_at_once(endpoint: str, owner_uid: int | None):  # type: ignore[no-untyped-def]
        conn = await connect(endpoint, owner_uid)
        conn.connection_lost(None)
        return conn

    transport._connect = lost_at_once  # type: ignore[method-assign]
    async with serving(sock, answering(b"fine")):
        err = await failed(transport, sock)
        assert err.code == grpc.StatusCode.UNAVAILABLE
        assert transport.endpoints() == frozenset()
        transport._connect = connect  # type: ignore[method-assign]
        assert await call(transport, sock) == b"fine"
        assert transport.endpoints() == frozenset({str(sock)})
    await asyncio.wait_for(transport.close(1), 5)


async def test_metadata_over_the_limit_fails_its_call_only(sock: Path) -> None:
    """A status message over the 16 KiB we advertise (a hook's long error)
    fails that call, RESOURCE_EXHAUSTED as grpc does; the other call on the
    connection is answered, and the connection stays."""
    async def long_error(peer: Peer) -> None:
        await peer.handshake()
        calls = [await peer.call(), await peer.call()]
        second = next(c for c in calls if c.message == b"long")
        first = next(c for c in calls if c.message != b"long")
        block = peer.encoder.encode([(":status", "200"), ("content-type", "application/grpc"),
                                     ("grpc-status", "9"), ("grpc-message", "x" * 20_000)])
        peer.send(FrameType.HEADERS, Flag.END_STREAM, second.stream_id, block[:16_000])
        peer.send(FrameType.CONTINUATION, Flag.END_HEADERS, second.stream_id, block[16_000:])
        peer.answer(first.stream_id, b"fine")
        third = await peer.call()
        peer.answer(third.stream_id, b"still")

    transport = FramesTransport()
    async with serving(sock, long_error) as peers:
        first = asyncio.ensure_future(call(transport, sock))
        with pytest.raises(CallFailed) as failure:
            await call(transport, sock, b"long")
        err = failure.value
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "over the limit of 16384" in err.details
        assert await first == b"fine"
        assert await call(transport, sock) == b"still"
        assert len(peers) == 1
    await transport.close(1)


@pytest.mark.parametrize("where", ["grpc-message", "custom"])
async def test_all_of_the_metadata_counts_toward_the_limit(sock: Path, where: str) -> None:
    """A long custom header counts as a long status message does (grpc
    counts the whole list): the call fails RESOURCE_EXHAUSTED."""
    big = [("grpc-message", "x" * 40_000)] if where == "grpc-message" else [("x-big", "x" * 40_000), ("grpc-message", "m")]

    async def long_metadata(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        block = peer.encoder.encode([(":status", "200"), ("content-type", "application/grpc"), *big, ("grpc-status", "9")])
        peer.send(FrameType.HEADERS, Flag.END_STREAM, got.stream_id, block[:16_000])
        peer.send(FrameType.CONTINUATION, 0, got.stream_id, block[16_000:32_000])
        peer.send(FrameType.CONTINUATION, Flag.END_HEADERS, got.stream_id, block[32_000:])

    transport = FramesTransport()
    async with serving(sock, long_metadata):
        err = await failed(transport, sock)
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    await transport.close(1)


async def test_a_trailers_only_answer_without_content_type_is_its_status(sock: Path) -> None:
    async def bare(peer: Peer) -> None:
        await peer.handshake()
        got = await peer.call()
        block = peer.encoder.encode([(":status", "200"), ("grpc-status", "5"), ("grpc-message", "nf")])
        peer.send(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, got.stream_id, block)

    transport = FramesTransport()
    async with serving(sock, bare):
        err = await failed(transport, sock)
        assert (err.code, err.details) == (grpc.StatusCode.NOT_FOUND, "nf")
    await transport.close(1)
