"""Stream states on the frames relay (RFC 9113 section 5.1), on the wire:
frames for streams that ended, were refused or are not the proxy's to
pass, between a raw client and a raw runtime (rawrelay.py)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from runtimeproxy.frames import connection as connection_module
from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType, Setting

from .. import rawh2
from .rawrelay import DIVERTED, HOOKED, RELAYED, message, raw_relay


async def test_a_late_frame_on_a_stream_refused_after_the_runtimes_goaway_is_ignored(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams opened after the runtime's GOAWAY are refused (and the client's
    GOAWAY names none of them): once the record of ended streams forgot one,
    a late DATA on it is still on a closed stream, not an idle one."""
    monkeypatch.setattr(connection_module, "ENDED_KEPT", 4)
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.runtime.writer.write(fr.goaway(0, ErrorCode.NO_ERROR))
        await pair.client.until(rawh2.GOAWAY)
        streams = range(1, 17, 2)
        pair.client.writer.write(b"".join(pair.request(sid, RELAYED, body=None, end=False) for sid in streams))
        seen = await pair.pinged()
        assert rawh2.errors(seen) == [(rawh2.RST_STREAM, sid, ErrorCode.REFUSED_STREAM) for sid in streams]
        pair.client.writer.write(fr.serialize(FrameType.DATA, 0, 1, message(b"late"))
                                 + fr.window_update(1, 0))
        assert rawh2.errors(await pair.pinged(b"pingpon2")) == []  # the connection goes on


async def _to_the_end_or(peer: rawh2.RawPeer, kind: int, sid: int) -> list[tuple[int, int, int, bytes]]:
    """What ``peer`` reads up to the connection's end, or up to a frame
    ``kind`` on ``sid`` (the connection went on: fails at once). Nothing is
    written meanwhile: data unread at a close would reset the connection,
    and the frames read before it with it."""
    seen = []
    while (f := await peer.read()) is not None:
        seen.append(f)
        if f[0] == kind and f[2] == sid:
            break
    return seen


@pytest.mark.parametrize("again", [3, 7], ids=["a-lower-id", "the-refused-id"])
async def test_a_stream_id_not_above_one_refused_after_the_runtimes_goaway_is_a_protocol_error(
    sock_dir: Path, again: int
) -> None:
    """RFC 9113 5.1.1: a client's new stream id must exceed every one it
    opened, refused ones too, although the GOAWAY's last stream id stays put
    once one went."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.runtime.writer.write(fr.goaway(0, ErrorCode.NO_ERROR))
        await pair.client.until(rawh2.GOAWAY)
        pair.client.writer.write(pair.request(7, RELAYED, body=None, end=False))
        assert rawh2.errors(await pair.pinged()) == [(rawh2.RST_STREAM, 7, ErrorCode.REFUSED_STREAM)]
        pair.client.writer.write(pair.request(again, RELAYED, body=None, end=False))
        seen = await _to_the_end_or(pair.client, rawh2.RST_STREAM, again)
        assert rawh2.errors(seen) == [(rawh2.GOAWAY, 0, ErrorCode.PROTOCOL_ERROR)]


async def test_a_lower_stream_id_after_the_runtimes_goaway_never_reaches_the_runtime(sock_dir: Path) -> None:
    """A refused stream's HEADERS still go on to the runtime (for its HPACK
    decoder); a lower id after it would be a connection error there too
    (grpc-go: 'received an illegal stream id'), so it never goes: the relay
    ends the connection itself, the call in flight with it."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, RELAYED, body=None, end=False))  # in flight, below the GOAWAY's id
        await pair.runtime.until(rawh2.HEADERS, 1)
        pair.runtime.writer.write(fr.goaway(1, ErrorCode.NO_ERROR))
        await pair.client.until(rawh2.GOAWAY)
        pair.client.writer.write(pair.request(7, RELAYED, body=None, end=False))
        assert rawh2.errors(await pair.pinged()) == [(rawh2.RST_STREAM, 7, ErrorCode.REFUSED_STREAM)]
        pair.client.writer.write(pair.request(3, RELAYED, body=None, end=False))
        runtime_saw = await _to_the_end_or(pair.runtime, rawh2.HEADERS, 3)
        assert [sid for kind, _, sid, _ in runtime_saw if kind == rawh2.HEADERS] == [7]  # (1 was read above)
        client_saw = await _to_the_end_or(pair.client, rawh2.RST_STREAM, 3)
        assert rawh2.errors(client_saw) == [(rawh2.GOAWAY, 0, ErrorCode.PROTOCOL_ERROR)]
        goaway = client_saw[-1][3]
        assert struct.unpack(">I", goaway[:4])[0] == 1  # the call in flight may have been processed


@pytest.mark.parametrize("interloper", ["data", "data-other-stream", "headers-other-stream", "ping", "rst"])
async def test_a_frame_inside_the_runtimes_open_header_block_ends_the_connection(
    sock_dir: Path, interloper: str
) -> None:
    """RFC 9113 6.10: a header block is followed by its CONTINUATIONs and
    nothing else; anything else is a connection error, never passed on."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, RELAYED) + pair.request(3, RELAYED))
        await pair.runtime.until(rawh2.DATA, 3)
        block = pair.runtime_encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        frames = {
            "data": fr.serialize(FrameType.DATA, 0, 1, message(b"x")),
            "data-other-stream": fr.serialize(FrameType.DATA, 0, 3, message(b"x")),
            "headers-other-stream": fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 3, block),
            "ping": fr.serialize(FrameType.PING, 0, 0, b"12345678"),
            "rst": fr.rst_stream(3, ErrorCode.CANCEL),
        }
        pair.runtime.writer.write(fr.serialize(FrameType.HEADERS, 0, 1, block[:2]) + frames[interloper])
        seen = []
        while (f := await pair.client.read()) is not None:
            seen.append(f)
        assert [f[0] for f in seen] == [rawh2.GOAWAY]  # nothing of the block's nor the interloper's
        assert rawh2.errors(seen) == [(rawh2.GOAWAY, 0, ErrorCode.INTERNAL_ERROR)]


async def test_request_trailers_wait_behind_the_requests_data_queued_for_the_runtimes_window(sock_dir: Path) -> None:
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair((Setting.INITIAL_WINDOW_SIZE, 1 << 20))  # its connection window stays 65535
        body = b"z" * 100_000
        trailers = pair.encoder.encode([("x-trailer", "1")])
        pair.client.writer.write(
            pair.request(1, RELAYED, body=None, end=False)
            + b"".join(fr.data_frames(1, message(body), fr.DEFAULT_MAX_FRAME, False))
            + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, trailers))
        await pair.pinged()  # the proxy has read it all, and queued what the window does not take
        pair.runtime.writer.write(fr.window_update(0, 1 << 20))
        await pair.runtime.until(rawh2.HEADERS, 1)  # the request's header block
        seen = await pair.runtime.until(rawh2.HEADERS, 1)  # then its trailers
        assert sum(len(p) for kind, _, sid, p in seen if kind == rawh2.DATA and sid == 1) == len(message(body))
        assert seen[-1][1] & Flag.END_STREAM


class _Held:
    """A stage that waits to be released before it sends the request on."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self, request: bytes, context: object, send: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return await send(request)


async def test_a_hooked_call_the_runtime_reset_keeps_no_client_once_the_runtime_left(sock_dir: Path) -> None:
    """Only a hooked call the runtime answered whole keeps the client's
    connection after the runtime closed its own (for its answer to go); one
    it reset has nothing more to give: its stage is cancelled, as an
    unanswered call's, and the client's connection closed."""
    stage = _Held()
    async with raw_relay(sock_dir, stages=(stage,)) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, HOOKED, b"\x0a\x01x"))
        await pair.runtime.until(rawh2.HEADERS, 1)
        await stage.entered.wait()
        pair.runtime.writer.write(fr.rst_stream(1, ErrorCode.CANCEL))
        await pair.client.until(rawh2.RST_STREAM, 1)
        pair.runtime.writer.close()
        while await pair.client.read() is not None:  # to the client connection's end
            pass
        assert not stage.release.is_set()
        await asyncio.wait_for(stage.cancelled.wait(), 5)


async def test_the_runtimes_window_updates_for_a_hooked_call_stay_with_the_proxy(sock_dir: Path) -> None:
    """The runtime's stream window for a hooked call is the proxy's (it sends
    the request), while the call runs and after: the client never sees it."""

    async def stage(request: bytes, context: object, send: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        return await send(request)

    async with raw_relay(sock_dir, stages=(stage,)) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, HOOKED, b"\x0a\x01x"))
        await pair.runtime.until(rawh2.DATA, 1)
        pair.runtime.writer.write(fr.window_update(1, 1000) + pair.answer(1, b"ok"))
        seen = await pair.client.until(rawh2.HEADERS, 1)
        seen += await pair.client.until(rawh2.HEADERS, 1)  # its trailers: the call is over
        assert seen[-1][1] & Flag.END_STREAM
        pair.runtime.writer.write(fr.window_update(1, 1000) + fr.serialize(FrameType.SETTINGS, 0, 0))
        seen += await pair.client.until(rawh2.SETTINGS)  # (the runtime's frames that reach the client keep their order)
        assert [f for f in seen if f[0] == rawh2.WINDOW_UPDATE] == []


@pytest.mark.parametrize("path", [DIVERTED, HOOKED])
async def test_data_after_the_clients_end_of_stream_on_a_call_the_proxy_takes_is_stream_closed(
    sock_dir: Path, path: str
) -> None:
    """RFC 9113 6.1: DATA on a stream half-closed (remote) is a stream error
    STREAM_CLOSED; it is never read as more of the request."""

    async def stage(request: bytes, context: object, send: Callable[[bytes], Awaitable[bytes]]) -> bytes:
        return await send(request)

    async with raw_relay(sock_dir, stages=(stage,)) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, path, b"hi") + fr.serialize(FrameType.DATA, 0, 1, message(b""))
                                 + pair.request(3, DIVERTED, b"next"))
        seen = []
        while not (seen and seen[-1][0] == rawh2.HEADERS and seen[-1][2] == 3 and seen[-1][1] & Flag.END_STREAM):
            seen += await pair.client.until(rawh2.HEADERS, 3)  # the next call is answered
        assert rawh2.errors(seen) == [(rawh2.RST_STREAM, 1, ErrorCode.STREAM_CLOSED)]
        assert [f for f in seen if f[2] == 1 and f[0] != rawh2.RST_STREAM] == []  # and the call no answer


async def test_data_after_a_diverted_call_was_answered_is_ignored(sock_dir: Path) -> None:
    """The stream is closed both ways: the late DATA is dropped (credited), as
    grpc-go drops DATA on a stream it closed, and the connection goes on."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, DIVERTED, b"hi"))
        seen = []
        while not (seen and seen[-1][1] & Flag.END_STREAM):
            seen += await pair.client.until(rawh2.HEADERS, 1)
        pair.client.writer.write(fr.serialize(FrameType.DATA, 0, 1, message(b"late")))
        assert rawh2.errors(await pair.pinged()) == []
        pair.client.writer.write(pair.request(3, DIVERTED, b"next"))
        seen = []
        while not (seen and seen[-1][1] & Flag.END_STREAM):
            seen += await pair.client.until(rawh2.HEADERS, 3)
        assert pair.client.decoder.decode(seen[-1][3]) == [("grpc-status", "0")]
