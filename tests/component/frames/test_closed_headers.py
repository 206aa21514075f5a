"""Header blocks with END_STREAM on streams that are not open here, told
apart where the proxy knows the stream's history (withheld.py): on an id the
client skipped, a connection error (RFC 9113 5.1.1); after the request of a
call the proxy takes had ended, a stream error (5.1, half-closed (remote));
late trailers on a stream that is over, still dropped. DATA on an id the
client skipped is a connection error too (taken.py).

Before: all three were dropped alike, the client's errors unreported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, FrameType

from .. import rawh2
from .rawrelay import DIVERTED, HOOKED, RELAYED, Pair, message, raw_relay
from .test_late_trailers import _next_call, _pass, _runtime_reads_request, _trailers


async def _opened(pair: Pair, *streams: int) -> None:
    """Relayed calls opened on ``streams``, their requests read by the runtime."""
    for sid in streams:
        pair.client.writer.write(pair.request(sid, RELAYED, body=None, end=False))
        await _runtime_reads_request(pair, sid)


@pytest.mark.parametrize(("opened", "skipped"), [((1, 5), 3), ((3,), 1), ((1, 7), 5)],
                         ids=["between", "the-first", "the-last-of-two"])
async def test_trailers_on_a_stream_the_client_skipped_are_a_protocol_error(
    sock_dir: Path, opened: tuple[int, ...], skipped: int
) -> None:
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        await _opened(pair, *opened)
        pair.client.writer.write(_trailers(pair, skipped, indexed=False))
        assert await pair.client.goaway_code() == ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize(("opened", "skipped"), [((1, 5), 3), ((3,), 1)], ids=["between", "the-first"])
async def test_data_on_a_stream_the_client_skipped_is_a_protocol_error(
    sock_dir: Path, opened: tuple[int, ...], skipped: int
) -> None:
    """RFC 9113 5.1.1 and 6.1: DATA on an id the client skipped (closed,
    never open) is a connection error, as a header block there is. Before:
    taken as DATA on a stream that is over, credited and dropped."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        await _opened(pair, *opened)
        pair.client.writer.write(fr.serialize(FrameType.DATA, 0, skipped, message(b"late")))
        assert await pair.client.goaway_code() == ErrorCode.PROTOCOL_ERROR


async def test_trailers_on_a_stream_that_is_over_are_still_dropped_where_the_client_skipped_others(
    sock_dir: Path,
) -> None:
    """Stream 1 reset by the proxy, 3 skipped, 5 open: late trailers on 1 are
    ignored (RFC 9113 5.1), and the connection goes on."""
    async with raw_relay(sock_dir) as relay:
        pair = await relay.pair()
        await _opened(pair, 1)
        pair.client.writer.write(fr.window_update(1, 0))  # the client's stream error: the proxy resets 1
        assert rawh2.errors(await pair.pinged()) == [(rawh2.RST_STREAM, 1, ErrorCode.PROTOCOL_ERROR)]
        await _opened(pair, 5)
        pair.client.writer.write(_trailers(pair, 1, indexed=False))
        assert rawh2.errors(await pair.pinged(b"pingpon2")) == []
        pair.runtime.writer.write(pair.answer(5, b"five"))  # the open call is answered as ever
        answer = await pair.client.until(rawh2.DATA, 5)
        assert answer[-1][3] == message(b"five")


@pytest.mark.parametrize("path", [DIVERTED, HOOKED])
async def test_trailers_after_a_taken_calls_request_ended_reset_that_stream(sock_dir: Path, path: str) -> None:
    """A call the proxy takes, whose request the client ended (END_STREAM on
    its DATA), gets a header block with END_STREAM: that stream is reset
    (STREAM_CLOSED), as DATA would be; the runtime never sees the block, and
    the connection's next call goes on."""
    async with raw_relay(sock_dir, stages=(_pass,)) as relay:
        pair = await relay.pair()
        # One write: the call is still the proxy's when the block comes.
        pair.client.writer.write(pair.request(1, path, body=b"x", end=True) + _trailers(pair, 1, indexed=False))
        assert rawh2.errors(await pair.pinged()) == [(rawh2.RST_STREAM, 1, ErrorCode.STREAM_CLOSED)]
        await _runtime_reads_request(pair, 1)
        seen, _, _ = await _next_call(pair, 3)
        assert [(kind, sid) for kind, _, sid, _ in seen if kind != rawh2.RST_STREAM] == [(rawh2.HEADERS, 3)]

