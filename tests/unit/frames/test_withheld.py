"""withheld.py's restatement: a client's block as one that leaves the
runtime's dynamic table alone, its leading size updates kept."""

from __future__ import annotations

import hpack
import pytest
from hpack.struct import NeverIndexedHeaderTuple

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames import hpackstatic, withheld
from runtimeproxy.frames.hpackpeek import HeaderReader

HEADERS = [(b":method", b"POST"), (b":path", b"/runtime.v1.RuntimeService/Version"), (b"x-new", b"v" * 40)]


def test_a_restated_block_reads_the_same_without_the_dynamic_table_and_keeps_its_size_updates() -> None:
    encoder = hpack.Encoder()
    encoder.encode(HEADERS)  # the client's table now holds x-new and :path
    encoder.header_table_size = 256  # its next block starts with a size update
    block = encoder.encode(HEADERS)
    assert block[0] & 0xE0 == 0x20
    (frame,) = withheld.restated(5, block, HEADERS, fr.DEFAULT_MAX_FRAME, True)
    assert frame[3:5] == bytes([fr.FrameType.HEADERS, fr.Flag.END_HEADERS | fr.Flag.END_STREAM])
    payload = frame[fr.HEADER_LEN:]
    assert payload.startswith(block[: withheld._size_updates(block)[0]]) and withheld._size_updates(block)[1] == [256]
    runtime = hpack.Decoder()  # a table that holds nothing the client's does
    assert runtime.decode(payload, raw=True) == HEADERS
    assert runtime.header_table.maxsize == 256 and len(runtime.header_table.dynamic_entries) == 0


def test_a_restated_block_over_the_frame_size_goes_in_continuations() -> None:
    big = [*HEADERS, (b"x-big", b"b" * 40_000)]
    frames = withheld.restated(5, b"", big, fr.DEFAULT_MAX_FRAME, False)
    assert [f[3] for f in frames] == [fr.FrameType.HEADERS, fr.FrameType.CONTINUATION, fr.FrameType.CONTINUATION]
    assert frames[-1][4] == fr.Flag.END_HEADERS and not frames[0][4] & fr.Flag.END_STREAM
    assert hpack.Decoder().decode(b"".join(f[fr.HEADER_LEN:] for f in frames), raw=True) == big


def test_withhold_tells_a_block_that_changed_the_table() -> None:
    encoder, reader = hpack.Encoder(), HeaderReader(1 << 16, "")
    assert withheld.withhold(reader, encoder.encode(HEADERS)) is True  # adds its entries
    assert withheld.withhold(reader, encoder.encode(HEADERS)) is False  # only refers to them


def test_a_field_the_client_never_indexed_is_restated_never_indexed() -> None:
    # RFC 7541 6.2.3: an intermediary re-encodes such a field never indexed.
    # hpack's encoder writes a sensitive field the static table has whole as
    # its index, so :method GET (static entry 2) is written by hand.
    block = b"\x12" + hpackstatic.string(b"GET") + hpack.Encoder().encode(
        [(b"authorization", b"secret", True), (b"x-plain", b"v")])
    headers = HeaderReader(1 << 16, "").decode(block)
    assert [type(h) for h in headers] == [NeverIndexedHeaderTuple, NeverIndexedHeaderTuple, hpack.HeaderTuple]
    (frame,) = withheld.restated(5, block, headers, fr.DEFAULT_MAX_FRAME, True)
    payload = frame[fr.HEADER_LEN:]
    assert payload[0] == 0x12  # :method's static name, never indexed: not the whole entry (0x82)
    runtime = hpack.Decoder().decode(payload, raw=True)
    assert runtime == [(b":method", b"GET"), (b"authorization", b"secret"), (b"x-plain", b"v")]
    assert [type(h) for h in runtime] == [NeverIndexedHeaderTuple, NeverIndexedHeaderTuple, hpack.HeaderTuple]


def test_a_never_indexed_name_outside_the_static_table_is_a_literal_name() -> None:
    written = hpackstatic.field(b"x-token", b"t", never_indexed=True)
    assert written == b"\x10" + hpackstatic.string(b"x-token") + hpackstatic.string(b"t")
    assert type(hpack.Decoder().decode(written, raw=True)[0]) is NeverIndexedHeaderTuple


def _runtime_requiring_a_shrink() -> hpack.Decoder:
    """The runtime lowered its HEADER_TABLE_SIZE to 0, and its decoder holds the client to it (RFC 7541 4.2)."""
    runtime = hpack.Decoder()
    runtime.max_allowed_table_size = 0
    return runtime


def test_a_dropped_blocks_size_update_goes_first_in_the_next_block_restated() -> None:
    client, reader = hpack.Encoder(), HeaderReader(1 << 16, "")
    reader.decode(client.encode(HEADERS))  # (passed on: the runtime read it)
    reader.allow_table_size(0)
    client.header_table_size = 0
    trailers = client.encode([(b"x-n", b"1")])  # dropped: it says the table shrank
    assert trailers[0] == 0x20
    restating = withheld.Restating()
    restating.dropped(withheld._size_updates(trailers)[1])
    reader.decode(trailers)
    block = client.encode(HEADERS)
    assert block[0] & 0xE0 != 0x20  # the client said it already
    (frame,) = restating.restate(5, block, reader.decode(block), fr.DEFAULT_MAX_FRAME, False)
    runtime = _runtime_requiring_a_shrink()
    assert runtime.decode(frame[fr.HEADER_LEN:], raw=True) == HEADERS  # not InvalidTableSizeError
    assert runtime.header_table_size == 0
    (frame,) = restating.restate(7, block, HEADERS, fr.DEFAULT_MAX_FRAME, False)
    assert frame[fr.HEADER_LEN] == 0x80 | 3  # once only: :method POST, from the static table


def test_dropped_and_own_size_updates_go_as_their_smallest_then_last() -> None:
    restating = withheld.Restating()
    restating.dropped([0])
    restating.dropped([100, 4096])
    own = hpackstatic.integer(2048, 5, 0x20)
    (frame,) = restating.restate(5, own + b"\x83", [(b":method", b"POST")], fr.DEFAULT_MAX_FRAME, False)
    payload = frame[fr.HEADER_LEN:]
    assert payload == hpackstatic.integer(0, 5, 0x20) + own + b"\x83"
    runtime = _runtime_requiring_a_shrink()
    runtime.max_allowed_table_size = 4096
    runtime.decode(payload)
    assert runtime.header_table_size == 2048


def test_skipped_ids_are_known_by_range_and_the_oldest_forgotten_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(withheld, "SKIPPED_KEPT", 4)
    skipped = withheld.Skipped()
    assert 1 not in skipped  # nothing skipped: gRPC clients
    skipped.note(1, 1)  # the first stream opened was 3
    skipped.note(7, 11)  # then 13 after 5
    assert [sid for sid in range(1, 16, 2) if sid in skipped] == [1, 7, 9, 11]
    for first in (21, 31, 41):  # one range past the bound: the oldest half forgotten
        skipped.note(first, first)
    assert [sid for sid in range(1, 45, 2) if sid in skipped] == [21, 31, 41]
