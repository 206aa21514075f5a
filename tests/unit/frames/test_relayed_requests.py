"""A client's frames reach the runtime as they were read, however the reads are
cut (frames/upstream.py): a frame begun in one read is completed from the next
on its own (``frame.Carry``), and the calls end as with whole reads."""

from __future__ import annotations

import asyncio
import random
import struct

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType

from .test_connection import VERSION, _answer
from .test_relayed_frames import (
    OK,
    OVER_16K,
    SETTINGS_ACK,
    cut_reads,
    max_frame_settings,
    measured_connection,
    message_parts,
)

LIMIT = 40_000  # the proxy's request size limit in these tests

REQUEST_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", VERSION), (":authority", "x"),
                   ("content-type", "application/grpc"), ("te", "trailers")]


def _client_requests(seed: int, calls: int) -> bytes:
    """What a client might send for ``calls`` relayed calls on streams 1, 3, ...:
    each request's headers (some in HEADERS and CONTINUATION) and one message
    in DATA frames of random sizes (its prefix too may be cut), the last with
    END_STREAM, the streams' frames interleaved, a connection WINDOW_UPDATE and
    a PING among them. Some messages are over the proxy's limit, and together
    they exceed the runtime's window."""
    rng = random.Random(seed)
    encoder = hpack.Encoder()
    pending = {}
    for i in range(calls):
        sid = 2 * i + 1
        parts = message_parts(rng, i, [0, 9, 3_000, 30_000, 50_000])
        frames = [f for part in parts for f in fr.data_frames(sid, part, 16_384, False)]
        frames[-1] = fr.serialize(FrameType.DATA, Flag.END_STREAM, sid, frames[-1][fr.HEADER_LEN:])
        pending[sid] = ["headers", *frames]
    out = []
    while pending:
        # A client opens its streams in order: only the lowest unopened one may start.
        opened = [sid for sid in pending if pending[sid][0] != "headers"]
        sid = rng.choice(sorted(opened + [min(s for s in pending if s not in opened)]
                                if len(opened) < len(pending) else opened))
        item = pending[sid].pop(0)
        if item == "headers":  # encoded as sent: HPACK is in the order the peer decodes
            block = encoder.encode(REQUEST_HEADERS)
            if rng.random() < 0.3:  # a block in HEADERS and CONTINUATION, back to back
                cut = rng.randrange(1, len(block))
                item = (fr.serialize(FrameType.HEADERS, 0, sid, block[:cut])
                        + fr.serialize(FrameType.CONTINUATION, Flag.END_HEADERS, sid, block[cut:]))
            else:
                item = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, block)
        out.append(item)
        if not pending[sid]:
            del pending[sid]
        if rng.random() < 0.1:
            out.append(rng.choice([fr.window_update(0, 1_000), fr.serialize(FrameType.PING, 0, 0, b"12345678")]))
    return b"".join(out)


def _relay(chunks: list[bytes], calls: int) -> tuple[bytes, bytes, list[str]]:
    """The runtime's bytes, the client's and the calls' ends when the client's bytes come in ``chunks``."""

    async def run() -> tuple[bytes, bytes, list[str]]:
        conn, client, backend, routes = measured_connection(LIMIT)
        conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
        conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
        for chunk in chunks:
            conn.client_data(chunk)
        conn.backend_data(fr.window_update(0, 1 << 24))  # what waited for the runtime's window goes
        assert not conn.closed.done() and not conn.inbound.queued
        encoder = hpack.Encoder()
        conn.backend_data(b"".join(_answer(encoder, 2 * i + 1, OK) for i in range(calls)))
        conn.lost()
        return (b"".join(map(bytes, backend.written)), b"".join(map(bytes, client.written)),
                sorted(code for code, _ in routes.ends))

    return asyncio.run(run())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1 << 30), st.integers(1, 6), st.lists(st.integers(1, 40_000), min_size=1, max_size=30))
def test_the_runtime_gets_the_same_bytes_however_the_clients_reads_are_cut(seed, calls, cuts) -> None:  # type: ignore[no-untyped-def]
    """A client's bytes in one read, or cut anywhere (inside frame headers too):
    the runtime is written the same bytes in the same order, the client gets the
    same answers, and every call ends the same way (RESOURCE_EXHAUSTED for a
    request over the limit, OK for the others)."""
    stream = _client_requests(seed, calls)
    chunks = cut_reads(stream, cuts)
    whole = _relay([stream], calls)
    assert len(whole[2]) == calls and set(whole[2]) <= {"OK", "RESOURCE_EXHAUSTED"}
    assert _relay(chunks, calls) == whole


def test_a_request_cut_in_its_frame_header_reaches_the_runtime_whole() -> None:
    stream = _client_requests(7, 3)
    whole = _relay([stream], 3)
    assert _relay([stream[:4], stream[4:13], stream[13:]], 3) == whole
    assert _relay([stream[i : i + 1] for i in range(len(stream))], 3) == whole


async def test_the_rest_of_a_read_that_completes_a_carried_frame_goes_to_the_runtime_uncopied() -> None:
    conn, _, backend, _ = measured_connection(1 << 20)
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    headers = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, hpack.Encoder().encode(REQUEST_HEADERS))
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0) + headers)
    body = b"".join(fr.data_frames(1, struct.pack(">BI", 0, 48_000) + b"z" * 48_000, 16_384, True))
    conn.client_data(body[:10_000])  # the first DATA frame, cut
    written = len(backend.written)
    rest = body[10_000:]
    conn.client_data(rest)
    # The carried frame, completed alone; then the rest as a view of the read itself.
    assert len(backend.written) == written + 2
    assert isinstance(backend.written[-1], memoryview) and backend.written[-1].obj is rest
    assert b"".join(map(bytes, backend.written))[-len(body):] == body


def _after_a_smaller_frame_size(reads: list[bytes]) -> bool:
    """Whether the client's connection ended, once the runtime lowered its max
    frame size (1 MiB, then 16 KiB) and the client's ``reads`` came."""

    async def run() -> bool:
        conn, _, _, _ = measured_connection(1 << 20)
        conn.backend_data(max_frame_settings(1 << 20, 16_384))
        headers = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, hpack.Encoder().encode(REQUEST_HEADERS))
        conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0) + SETTINGS_ACK + headers)
        for read in reads:
            conn.client_data(read)
        return conn.closed.done()

    return asyncio.run(run())


def test_a_frame_over_the_size_an_ack_put_in_force_is_refused_however_the_reads_are_cut() -> None:
    ack, data = SETTINGS_ACK, OVER_16K  # the ACK of the 16 KiB SETTINGS, a frame over that
    assert _after_a_smaller_frame_size([ack + data])
    assert _after_a_smaller_frame_size([ack[:5], ack[5:] + data])
    assert _after_a_smaller_frame_size([ack, data])
