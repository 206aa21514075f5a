"""A relayed call's frames go to the client as they were read, without a copy
per frame, and its header blocks are written before the proxy reads them
(frames/downstream.py, ``_settle``): the answer's path holds no HPACK decode
and no bookkeeping, and the blocks are still read in the order they came."""

from __future__ import annotations

import asyncio
import random
import struct

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType

from .test_connection import (
    UNIMPLEMENTED,
    UNKNOWN_TO_RUNTIME,
    VERSION,
    _answer,
    _written_frames,
    _client_view,
    _Diverting,
    _HeldAnswer,
    _request,
    _Transport,
    _turns,
)

OK = [*UNIMPLEMENTED[:2], ("grpc-status", "0")]
SETTINGS_ACK = fr.serialize(FrameType.SETTINGS, Flag.ACK, 0)  # of a lowered max frame size, put in force by it
OVER_16K = fr.serialize(FrameType.DATA, 0, 1, struct.pack(">BI", 0, 30_000) + b"q" * 30_000)  # on stream 1


class _Measured(_Diverting):
    """Records, at each call's end, its status and what the client had been written by then."""

    def __init__(self, client: _Transport) -> None:
        super().__init__()
        self.client = client
        self.ends: list[tuple[str, list[tuple[int, bytes | None]]]] = []

    def measure(self, path: str):  # type: ignore[no-untyped-def]
        def record(code: str, seconds: float) -> None:
            try:
                written = [(sid, hdrs.get(b"grpc-status")) for sid, _, hdrs in _client_view(self.client)]
            except hpack.HPACKError:  # the client was sent a block it cannot read
                written = []
            self.ends.append((code, written))

        return record


def measured_connection(
    max_message: int, client: _Transport | None = None
) -> tuple[FrameConnection, _Transport, _Transport, _Measured]:
    """A connection whose calls' ends ``_Measured`` records and whose diverted calls wait (``_HeldAnswer``)."""
    client = _Transport() if client is None else client
    backend, routes = _Transport(), _Measured(client)
    conn = FrameConnection(client, backend, routes, _HeldAnswer(), Limits(max_message))  # type: ignore[arg-type]
    return conn, client, backend, routes


def _connection(max_message: int = 100) -> tuple[FrameConnection, _Transport, _Measured, hpack.Encoder, hpack.Encoder]:
    conn, client, _, routes = measured_connection(max_message)
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    return conn, client, routes, hpack.Encoder(), hpack.Encoder()


async def test_a_relayed_answer_is_written_before_its_status_is_read() -> None:
    conn, _, routes, to_backend, backend_encoder = _connection()
    conn.client_data(_request(to_backend, 1, VERSION))
    conn.backend_data(_answer(backend_encoder, 1, OK))
    # The call ended OK, and by then its answer had gone to the client.
    assert routes.ends == [("OK", [(1, b"0")])]
    assert conn.relayed == set() and conn.is_idle


async def test_a_ping_or_window_update_read_with_a_relayed_answer_does_not_hold_the_answer() -> None:
    """A runtime's PING (grpc-go's BDP probe) or connection WINDOW_UPDATE in the
    same read as an answer: the answer is still written before its status is read."""
    for extra in (fr.serialize(FrameType.PING, 0, 0, b"12345678"), fr.window_update(0, 1000)):
        conn, _, routes, to_backend, backend_encoder = _connection()
        conn.client_data(_request(to_backend, 1, VERSION))
        conn.backend_data(_answer(backend_encoder, 1, OK) + extra)
        assert routes.ends == [("OK", [(1, b"0")])]
        assert not conn.closed.done()


async def test_an_answer_read_before_a_bad_frame_ends_its_call_as_read() -> None:
    conn, _, routes, to_backend, backend_encoder = _connection()
    conn.client_data(_request(to_backend, 1, VERSION))
    conn.backend_data(_answer(backend_encoder, 1, OK) + fr.serialize(FrameType.PING, 0, 0, b"short"))
    assert conn.closed.done()  # a connection error
    assert [code for code, _ in routes.ends] == ["OK"]


async def test_blocks_are_read_in_order_when_a_relayed_answer_and_a_stray_one_share_a_read() -> None:
    conn, client, routes, to_backend, backend_encoder = _connection()
    conn.client_data(_request(to_backend, 1, VERSION) + _request(to_backend, 3, UNKNOWN_TO_RUNTIME))
    await _turns()
    # One read: Version's answer (its headers indexed by the runtime's encoder), then the
    # runtime's early answer to the diverted call, which refers to those indexed headers.
    conn.backend_data(_answer(backend_encoder, 1, OK) + _answer(backend_encoder, 3, UNIMPLEMENTED))
    assert not conn.closed.done()  # the proxy's decoder stayed in step
    # Version ended before the stray block was placed: it goes on stream 1, now closed at the
    # client, not on stream 2 (the place used only before any stream closed).
    assert [(sid, hdrs.get(b"grpc-status")) for sid, _, hdrs in _client_view(client)] == [(1, b"0"), (1, b"12")]
    assert [code for code, _ in routes.ends] == ["OK"]


async def test_a_relayed_answers_status_is_read_before_a_goaway_in_the_same_read() -> None:
    conn, client, routes, to_backend, backend_encoder = _connection()
    conn.client_data(_request(to_backend, 1, VERSION) + _request(to_backend, 3, VERSION))
    # One read: stream 1's answer, then GOAWAY saying stream 1 was the last processed.
    conn.backend_data(_answer(backend_encoder, 1, OK) + fr.goaway(1, ErrorCode.NO_ERROR))
    # Stream 1 ended OK (not refused); stream 3 is refused, for the client to retry.
    assert [code for code, _ in routes.ends] == ["OK", "UNAVAILABLE"]
    resets = [f for f in _written_frames(client) if f.type == FrameType.RST_STREAM]
    assert [f.stream_id for f in resets] == [3]


async def test_a_bad_block_on_a_relayed_stream_still_ends_the_connection() -> None:
    conn, client, routes, to_backend, _ = _connection()
    conn.client_data(_request(to_backend, 1, VERSION))
    # Index out of range. The block has gone to the client (whose decoder fails on it
    # too) when the proxy reads it; the connection ends, its call UNAVAILABLE.
    conn.backend_data(fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, b"\xbf"))
    assert conn.closed.done() and [code for code, _ in routes.ends] == ["UNAVAILABLE"]
    goaway = [f for f in _written_frames(client) if f.type == FrameType.GOAWAY]
    assert goaway and int.from_bytes(goaway[-1].payload[4:8], "big") == ErrorCode.INTERNAL_ERROR


async def test_frames_read_behind_data_waiting_for_the_clients_window_leave_after_it() -> None:
    conn, client, routes, to_backend, backend_encoder = _connection(max_message=1 << 20)
    conn.client_data(_request(to_backend, 1, VERSION))
    big = fr.DEFAULT_WINDOW + 100  # more than the client's connection window (never raised here)
    answer = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, backend_encoder.encode(OK[:2]))
    conn.backend_data(answer + b"".join(fr.data_frames(1, b"\0" + big.to_bytes(4, "big") + b"x" * big, 16_384, False)))
    assert conn.out.queued  # the rest of the message waits for the client's window
    # The runtime resets the call, and pings: the reset stays behind the queued DATA.
    conn.backend_data(fr.rst_stream(1, ErrorCode.CANCEL) + fr.serialize(FrameType.PING, 0, 0, b"12345678"))
    conn.client_data(fr.window_update(0, 1 << 20))
    assert not conn.out.queued and not conn.closed.done()
    frames = [(f.type, f.stream_id) for f in _written_frames(client) if f.type != FrameType.SETTINGS
              and f.type != FrameType.WINDOW_UPDATE]
    assert frames[-1] == (FrameType.RST_STREAM, 1)
    assert sum(len(f.payload) for f in _written_frames(client) if f.type == FrameType.DATA) == big + 5
    assert [code for code, _ in routes.ends] == ["CANCELLED"]


async def test_a_relayed_answers_padded_or_prioritised_block_is_read_without_its_padding() -> None:
    """A single-frame block with PADDED or PRIORITY takes the full path (downstream's
    fast path is for plain frames only): its status is read right, and the client
    gets the frame as the runtime sent it."""
    conn, client, routes, to_backend, backend_encoder = _connection()
    conn.client_data(_request(to_backend, 1, VERSION) + _request(to_backend, 3, VERSION))
    block = backend_encoder.encode(OK)
    padded = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM | Flag.PADDED, 1,
                          bytes([3]) + block + b"\x00" * 3)
    prioritised = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM | Flag.PRIORITY, 3,
                               b"\x00\x00\x00\x00\x0f" + backend_encoder.encode(OK))
    conn.backend_data(padded + prioritised)
    assert not conn.closed.done()
    assert [code for code, _ in routes.ends] == ["OK", "OK"]
    assert padded + prioritised in b"".join(map(bytes, client.written))


def message_parts(rng: random.Random, fill: int, sizes: list[int]) -> list[bytes]:
    """A gRPC message of one of ``sizes`` (bytes ``fill``), cut in up to five
    parts at random places, its 5-byte prefix included."""
    message = struct.pack(">BI", 0, n := rng.choice(sizes)) + bytes([fill]) * n
    cuts = sorted(rng.sample(range(1, len(message)), min(4, len(message) - 1)))
    return [message[a:b] for a, b in zip([0, *cuts], [*cuts, len(message)], strict=True)]


def _runtime_answers(seed: int, calls: int) -> bytes:
    """What a runtime might send for ``calls`` relayed calls on streams 1, 3, ...:
    each answer's headers, one message in DATA frames of random sizes (its
    prefix too may be cut), and trailers, the streams' frames interleaved, a
    connection WINDOW_UPDATE and a PING among them. Some messages are over the
    proxy's limit (``_split_connection``) and some answers exceed the client's
    connection window."""
    rng = random.Random(seed)
    encoder = hpack.Encoder()
    pending = {}
    for i in range(calls):
        sid = 2 * i + 1
        parts = message_parts(rng, i, [0, 7, 3_000, 30_000, 70_000])
        # Header blocks are encoded as they are sent (HPACK: in the order the peer decodes them).
        pending[sid] = [(Flag.END_HEADERS, OK[:2]),
                        *(f for part in parts for f in fr.data_frames(sid, part, 16_384, False)),
                        (Flag.END_HEADERS | Flag.END_STREAM, [("grpc-status", "0")])]
    out = []
    while pending:
        sid = rng.choice(sorted(pending))
        item = pending[sid].pop(0)
        if isinstance(item, tuple):
            item = fr.serialize(FrameType.HEADERS, item[0], sid, encoder.encode(item[1]))
        out.append(item)
        if not pending[sid]:
            del pending[sid]
        if rng.random() < 0.1:
            out.append(rng.choice([fr.window_update(0, 1_000), fr.serialize(FrameType.PING, 0, 0, b"12345678")]))
    return b"".join(out)


def _split_connection(chunks: list[bytes], calls: int) -> tuple[bytes, list[str]]:
    """The client's bytes and the calls' ends when the runtime's bytes come in ``chunks``."""

    async def run() -> tuple[bytes, list[str]]:
        conn, client, _, routes = measured_connection(40_000)
        conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
        to_backend = hpack.Encoder()
        conn.client_data(b"".join(_request(to_backend, 2 * i + 1, VERSION) for i in range(calls)))
        conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
        for chunk in chunks:
            conn.backend_data(chunk)
        conn.client_data(fr.window_update(0, 1 << 24))  # what waited for the client's window goes
        assert not conn.closed.done() and not conn.out.queued
        conn.lost()
        # Sorted: a status is read once its read's frames are written (_settle), so the
        # order in which ends are recorded follows the reads; what each call ends with does not.
        return b"".join(map(bytes, client.written)), sorted(code for code, _ in routes.ends)

    return asyncio.run(run())


def cut_reads(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``stream`` as a socket might deliver it: reads of the sizes in ``cuts``
    (in turn), every third one cut to a few bytes."""
    chunks, pos, i = [], 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)] if i % 3 else cuts[i % len(cuts)] % 11 + 1
        chunks.append(stream[pos : pos + step])
        pos += step
        i += 1
    return chunks


def max_frame_settings(*sizes: int) -> bytes:
    """SETTINGS frames, one per size, each setting MAX_FRAME_SIZE."""
    return b"".join(fr.serialize(FrameType.SETTINGS, 0, 0, struct.pack(">HI", fr.Setting.MAX_FRAME_SIZE, size))
                    for size in sizes)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1 << 30), st.integers(1, 6), st.lists(st.integers(1, 40_000), min_size=1, max_size=30))
def test_the_client_gets_the_same_bytes_however_the_runtimes_reads_are_cut(seed, calls, cuts) -> None:  # type: ignore[no-untyped-def]
    """A runtime's bytes relayed in one read, or cut anywhere (inside frame
    headers too, as a socket may): the client is written the same bytes, in the
    same order, and every call ends the same way (RESOURCE_EXHAUSTED for an
    answer over the limit, OK for the others)."""
    stream = _runtime_answers(seed, calls)
    chunks = cut_reads(stream, cuts)
    whole = _split_connection([stream], calls)
    assert len(whole[1]) == calls and set(whole[1]) <= {"OK", "RESOURCE_EXHAUSTED"}
    assert _split_connection(chunks, calls) == whole


class _UvloopLike(_Transport):
    """A transport that raises on a write once closed, as uvloop's does."""

    def write(self, data: bytes) -> None:
        if self.closed:
            raise RuntimeError("unable to perform operation on <UnixTransport closed=True>; the handler is closed")
        super().write(data)


async def test_an_answer_read_after_uvloop_closed_the_clients_transport_is_dropped() -> None:
    """uvloop closes a transport on a socket error and tells its protocol a turn
    later: the runtime's answer read in between goes nowhere, and raises nothing."""
    conn, client, _, _ = measured_connection(100, _UvloopLike())
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0) + _request(hpack.Encoder(), 1, VERSION))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    written = len(client.written)
    client.closed = True
    conn.backend_data(_answer(hpack.Encoder(), 1, OK))
    assert len(client.written) == written and not conn.closed.done()


def _client_lowered_its_frame_size_and(reads: list[bytes]) -> bool:
    """Whether the connection ended, once the client lowered its max frame size
    (1 MiB, then 16 KiB), the runtime acknowledged the first, and ``reads`` came."""

    async def run() -> bool:
        conn, _, _, _ = measured_connection(1 << 20)
        conn.client_data(fr.PREFACE + max_frame_settings(1 << 20, 16_384) + _request(hpack.Encoder(), 1, VERSION))
        conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0) + SETTINGS_ACK)
        for read in reads:
            conn.backend_data(read)
        return conn.closed.done()

    return asyncio.run(run())


def test_a_frame_over_the_size_an_ack_put_in_force_is_refused_however_the_runtimes_reads_are_cut() -> None:
    ack, data = SETTINGS_ACK, OVER_16K
    answer = fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, 1, hpack.Encoder().encode(OK[:2]))
    assert not _client_lowered_its_frame_size_and([answer])
    assert _client_lowered_its_frame_size_and([answer + ack + data])
    assert _client_lowered_its_frame_size_and([answer + ack[:5], ack[5:] + data])
    assert _client_lowered_its_frame_size_and([answer + ack, data])
