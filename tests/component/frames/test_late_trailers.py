"""Request trailers on a stream the runtime no longer has open (withheld.py),
on the wire between a raw client and a raw runtime (rawrelay.py): after the
proxy reset the stream, after it ended it (END_STREAM) with the client's side
still open, split into CONTINUATIONs, and on calls the proxy takes. The
proxy reads them and drops them: the connection and its other calls go on,
the runtime never sees them (containerd 1.7's grpc-go ends its connection on any header block
on a stream it has seen), and its HPACK decoder still reads the client's next
blocks right, restated when a dropped block changed the table.

Before: trailers on a stream the proxy had ended were a connection error
(`stream N reused`), every call on the connection with it; those of a
diverted or hooked call went on to the runtime.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import hpack
import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType, Setting

from .. import rawh2
from .rawrelay import DIVERTED, HOOKED, RELAYED, Pair, message, raw_relay, request_block

Frames = list[tuple[int, int, int, bytes]]
NEW_ENTRY = ("x-late", "trailer")  # the trailers add it to the client's table (hpack.Encoder indexes)


async def _pass(request: bytes, context: object, send: Callable[[bytes], Awaitable[bytes]]) -> bytes:
    return await send(request)


def _trailers(pair: Pair, sid: int, indexed: bool, split: bool = False) -> bytes:
    headers = [NEW_ENTRY, ("x-n", "1")]
    block = pair.encoder.encode(headers) if indexed else rawh2.literal_headers(headers)
    if not split:
        return fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, block)
    return (fr.serialize(FrameType.HEADERS, Flag.END_STREAM, sid, block[:3])
            + fr.serialize(FrameType.CONTINUATION, 0, sid, block[3:5])
            + fr.serialize(FrameType.CONTINUATION, Flag.END_HEADERS, sid, block[5:]))


async def _next_call(pair: Pair, sid: int) -> tuple[Frames, bytes, list[tuple[str, str]]]:
    """A relayed call on ``sid`` whose request names the entry the dropped
    trailers added: what the runtime read up to its block (every block decoded
    by the runtime's own decoder, in order), the block as it came, and what it
    decoded; the runtime answers, and the client must get that answer."""
    headers = [(":method", "POST"), (":scheme", "http"), (":path", RELAYED), (":authority", "localhost"),
               ("content-type", "application/grpc"), ("te", "trailers"), NEW_ENTRY]
    pair.client.writer.write(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, pair.encoder.encode(headers))
                             + fr.serialize(FrameType.DATA, Flag.END_STREAM, sid, message(b"next")))
    seen: Frames = []
    decoded: list[tuple[str, str]] = []
    while True:
        f = await pair.runtime.read()
        assert f is not None, f"the runtime's connection closed; it read {seen}"
        seen.append(f)
        if f[0] == rawh2.HEADERS:
            decoded = pair.runtime.decoder.decode(f[3])  # every block, as the runtime's decoder reads them
            if f[2] == sid:
                break
        if f[0] == FrameType.CONTINUATION:
            raise AssertionError("a test block fits one frame")
    pair.runtime.writer.write(pair.answer(sid, b"ok"))
    answer: Frames = []
    while not (answer and answer[-1][1] & Flag.END_STREAM):
        answer += await pair.client.until(rawh2.HEADERS, sid)
    assert rawh2.errors(answer) == []
    assert _client_reads(pair, answer)[-1] == [("grpc-status", "0")]
    assert headers == decoded
    return seen, f[3], decoded


def _client_reads(pair: Pair, frames: Frames) -> list[list[tuple[str, str]]]:
    """Every header block among ``frames``, decoded in order by the client's decoder."""
    return [pair.client.decoder.decode(p) for kind, _, _, p in frames if kind == rawh2.HEADERS]


async def _runtime_reads_request(pair: Pair, sid: int) -> None:
    f = (await pair.runtime.until(rawh2.HEADERS, sid))[-1]
    pair.runtime.decoder.decode(f[3])


async def _reset_by_the_proxy(pair: Pair, sid: int) -> None:
    """A relayed call opened on ``sid``, its request read by the runtime, then
    reset by the proxy for the client's stream error (a zero WINDOW_UPDATE);
    the client's trailers have not come yet."""
    pair.client.writer.write(pair.request(sid, RELAYED, body=None, end=False))
    await _runtime_reads_request(pair, sid)
    pair.client.writer.write(fr.window_update(sid, 0))
    assert rawh2.errors(await pair.pinged()) == [(rawh2.RST_STREAM, sid, ErrorCode.PROTOCOL_ERROR)]


@pytest.mark.parametrize("indexed", [True, False], ids=["adds-to-the-table", "leaves-the-table"])
@pytest.mark.parametrize("split", [False, True], ids=["one-frame", "continuations"])
async def test_trailers_after_the_proxy_reset_the_stream_are_ignored(
    sock_dir: Path, indexed: bool, split: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """RFC 9113 5.1: after sending RST_STREAM, frames on the stream are ignored
    (a header block still read for its HPACK state)."""
    caplog.set_level(logging.INFO, logger="runtimeproxy.frames.withheld")
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        await _reset_by_the_proxy(pair, 1)
        pair.client.writer.write(_trailers(pair, 1, indexed, split))
        assert rawh2.errors(await pair.pinged(b"pingpon2")) == []  # no GOAWAY: the connection goes on
        seen, block, _ = await _next_call(pair, 3)
        # The runtime had the reset (CANCEL), never the trailers.
        assert [(kind, sid) for kind, _, sid, _ in seen] == [(rawh2.RST_STREAM, 1), (rawh2.HEADERS, 3)]
        # Restated only once a dropped block changed the table; else the next goes verbatim.
        assert _restated(block) is indexed
        noted = [r for r in caplog.records if "reach the runtime restated" in r.getMessage()]
        assert len(noted) == (1 if indexed else 0)
        if indexed:  # which connection: the client's process (this one) and the proxy's descriptor of it
            assert (noted[0].stream, noted[0].client_pid) == (1, os.getpid())
            assert isinstance(noted[0].client_fd, int) and noted[0].client_fd >= 0


def _restated(block: bytes) -> bool:
    """Whether ``block`` neither reads nor adds to the dynamic table (the proxy's restatement)."""
    decoder = hpack.Decoder()
    decoder.header_table.maxsize = 0  # no dynamic table: an index into one fails
    try:
        decoder.decode(block)
    except hpack.HPACKError:
        return False
    return len(decoder.header_table.dynamic_entries) == 0


async def test_a_table_shrink_in_dropped_trailers_reaches_the_runtime(sock_dir: Path) -> None:
    """The runtime lowered its HEADER_TABLE_SIZE to 0 and the client's block
    that says its table shrank (RFC 7541 4.2) is trailers the proxy drops:
    the next block the runtime gets says it, else a decoder that holds the
    client to it (hpack's, the raw runtime's) fails it (COMPRESSION_ERROR)."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        await _reset_by_the_proxy(pair, 1)
        pair.runtime.writer.write(fr.serialize(FrameType.SETTINGS, 0, 0,
                                               struct.pack(">HI", Setting.HEADER_TABLE_SIZE, 0)))
        await pair.client.until(rawh2.SETTINGS)
        pair.client.writer.write(fr.serialize(FrameType.SETTINGS, Flag.ACK, 0))
        acked = (await pair.runtime.until(rawh2.SETTINGS))[-1]
        assert acked[1] & Flag.ACK
        pair.runtime.decoder.max_allowed_table_size = 0
        pair.encoder.header_table_size = 0
        pair.client.writer.write(_trailers(pair, 1, True))
        assert rawh2.errors(await pair.pinged(b"pingpon2")) == []
        seen, block, _ = await _next_call(pair, 3)  # the runtime's decoder reads it (not InvalidTableSizeError)
        assert [(kind, sid) for kind, _, sid, _ in seen] == [(rawh2.HEADERS, 3)]  # never the trailers
        assert block[0] == 0x20 and _restated(block)  # restated, after the shrink to 0
        assert pair.runtime.decoder.header_table_size == 0


@pytest.mark.parametrize("path", [RELAYED, HOOKED])
@pytest.mark.parametrize("split", [False, True], ids=["one-frame", "continuations"])
async def test_trailers_after_the_proxy_ended_the_call_with_the_clients_side_open_are_taken(
    sock_dir: Path, path: str, split: bool
) -> None:
    """The proxy's END_STREAM (a request over the size limit refused) leaves
    the client's side open (half-closed local, RFC 9113 5.1): its trailers are
    its side's end; read, dropped, as the rest of its DATA is."""
    async with raw_relay(sock_dir, stages=(_pass,)) as relay:
        pair = await relay.pair()
        too_long = struct.pack(">BI", 0, 8 << 20) + b"x" * 100  # says 8 MiB, over the 1 MiB limit
        pair.client.writer.write(pair.request(1, path, body=None, end=False)
                                 + fr.serialize(FrameType.DATA, 0, 1, too_long))
        await _runtime_reads_request(pair, 1)
        seen = await pair.client.until(rawh2.HEADERS, 1)
        assert seen[-1][1] & Flag.END_STREAM and rawh2.errors(seen) == []  # an answer, no reset
        assert dict(pair.client.decoder.decode(seen[-1][3]))["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
        pair.client.writer.write(fr.serialize(FrameType.DATA, 0, 1, b"more") + _trailers(pair, 1, True, split))
        assert rawh2.errors(await pair.pinged()) == []
        seen, block, _ = await _next_call(pair, 3)
        assert [(kind, sid) for kind, _, sid, _ in seen] == [(rawh2.RST_STREAM, 1), (rawh2.HEADERS, 3)]
        assert _restated(block)


async def test_trailers_after_the_runtime_answered_are_dropped(sock_dir: Path) -> None:
    """The runtime ended the call (its answer relayed) while the client was
    still sending: the client's trailers never reach it."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, RELAYED, body=b"hi", end=False))
        await _runtime_reads_request(pair, 1)
        pair.runtime.writer.write(pair.answer(1, b"early"))
        answer: Frames = []
        while not (answer and answer[-1][1] & Flag.END_STREAM):
            answer += await pair.client.until(rawh2.HEADERS, 1)
        assert _client_reads(pair, answer)[-1] == [("grpc-status", "0")]
        pair.client.writer.write(_trailers(pair, 1, True))
        assert rawh2.errors(await pair.pinged()) == []
        seen, block, _ = await _next_call(pair, 3)
        assert [(kind, sid) for kind, _, sid, _ in seen if kind != rawh2.DATA] == [(rawh2.HEADERS, 3)]
        assert _restated(block)  # the dropped trailers added to the client's table: the next block says so


async def test_a_diverted_calls_trailers_end_its_request_and_never_reach_the_runtime(sock_dir: Path) -> None:
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, DIVERTED, body=b"echo", end=False) + _trailers(pair, 1, True))
        answer: Frames = []
        while not (answer and answer[-1][1] & Flag.END_STREAM):
            answer += await pair.client.until(rawh2.HEADERS, 1)
        assert [p for kind, _, sid, p in answer if kind == rawh2.DATA] == [message(b"echo")]
        assert _client_reads(pair, answer)[-1] == [("grpc-status", "0")]
        await _runtime_reads_request(pair, 1)
        seen, _, _ = await _next_call(pair, 3)
        assert [(kind, sid) for kind, _, sid, _ in seen] == [(rawh2.RST_STREAM, 1), (rawh2.HEADERS, 3)]


async def test_a_hooked_calls_trailers_end_it_internal_and_never_reach_the_runtime(sock_dir: Path) -> None:
    async with raw_relay(sock_dir, stages=(_pass,)) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, HOOKED, body=b"x", end=False) + _trailers(pair, 1, True))
        seen = await pair.client.until(rawh2.HEADERS, 1)
        status = dict(pair.client.decoder.decode(seen[-1][3]))
        assert status["grpc-status"] == "13" and "request trailers" in status["grpc-message"]
        await _runtime_reads_request(pair, 1)
        seen, _, _ = await _next_call(pair, 3)
        assert [(kind, sid) for kind, _, sid, _ in seen] == [(rawh2.RST_STREAM, 1), (rawh2.HEADERS, 3)]


async def test_a_new_request_on_a_stream_the_proxy_reset_is_still_a_protocol_error(sock_dir: Path) -> None:
    """Only trailers (END_STREAM) are taken late: a block that would start a
    request again on a used stream id is the client's error (RFC 9113 5.1.1)."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        pair.client.writer.write(pair.request(1, RELAYED, body=None, end=False) + fr.window_update(1, 0))
        assert rawh2.errors(await pair.pinged()) == [(rawh2.RST_STREAM, 1, ErrorCode.PROTOCOL_ERROR)]
        pair.client.writer.write(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1,
                                              request_block(pair.encoder, RELAYED)))
        assert await pair.client.goaway_code() == ErrorCode.PROTOCOL_ERROR
