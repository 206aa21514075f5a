"""hpackpeek reads the same headers as the full decoder, and leaves the table in step."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.frames.hpackpeek import peek, peek_all
from runtimeproxy.frames.window import detached

WANTED = frozenset({b":path", b"grpc-status", b"grpc-message"})
NAMES = [":path", "grpc-status", "grpc-message", "grpc-timeout", "content-type", "te", "x-custom", "user-agent"]
VALUES = st.one_of(st.sampled_from(["/runtime.v1.RuntimeService/Version", "0", "5", "4999910u", "trailers"]),
                   st.text(alphabet="abcdefghijklmnopqrstuvwxyz%/0123456789 ", max_size=40))
FIELD = st.tuples(st.sampled_from(NAMES), VALUES, st.sampled_from(["index", "never", "plain"]))


def _field(name: str, value: str, how: str) -> tuple[str, str]:
    if how == "never":
        return hpack.NeverIndexedHeaderTuple(name, value)
    if how == "plain":
        return hpack.HeaderTuple(name, value)  # a literal without indexing
    return (name, value)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(FIELD, max_size=8), min_size=1, max_size=12), st.booleans(),
       st.sampled_from([4096, 256, 120, 60]))
def test_peek_and_peek_all_agree_with_the_full_decoder(blocks, huffman, table_size) -> None:  # type: ignore[no-untyped-def]
    """Each reads the block once, as the relay does, on its own decoder: the
    headers are the full decoder's, and so is the table after each block,
    whether the reader took the block or left it to the full decoder. Small
    tables evict at nearly every entry a block adds, and 60 bytes are less
    than some entries (which empty the table)."""
    encoder = hpack.Encoder()
    encoder.header_table_size = table_size  # announced at the start of the first block
    full, peeking, peeking_all = hpack.Decoder(), hpack.Decoder(), hpack.Decoder()
    for fields in blocks:
        block = encoder.encode([_field(*f) for f in fields], huffman=huffman)
        expected = [(bytes(k), bytes(v)) for k, v in full.decode(block, raw=True)]
        seen = peek(peeking, block, WANTED)
        if seen is None:  # as the relay does then
            seen = {bytes(k): bytes(v) for k, v in peeking.decode(block, raw=True) if k in WANTED}
        every = peek_all(peeking_all, block)
        if every is None:
            every = [(bytes(k), bytes(v)) for k, v in peeking_all.decode(block, raw=True)]
        assert seen == {k: v for k, v in expected if k in WANTED}  # the last of each name
        assert every == expected  # every header, in order, repeats included
        for reader in (peeking, peeking_all):
            assert list(reader.header_table.dynamic_entries) == list(full.header_table.dynamic_entries)
            assert reader.header_table._current_size == full.header_table._current_size


def test_hpacks_table_keeps_the_size_count_the_reader_reads() -> None:
    """hpackpeek._Pending.entry copies HeaderTable._current_size (without it,
    it leaves such blocks to the full decoder: slower, still right)."""
    table = hpack.Decoder().header_table
    assert table._current_size == 0
    table.add(b"x-a", b"1")
    assert table._current_size == 32 + 3 + 1


def test_a_block_that_adds_to_the_table_is_read_in_full_and_added_once() -> None:
    """grpc-go writes a deadline under 100 s in microseconds, and indexes each new value: each call adds one."""
    encoder = hpack.Encoder()
    full, decoder = hpack.Decoder(), hpack.Decoder()
    fields = [(":method", "POST"), (":path", "/runtime.v1.RuntimeService/ListContainers"), ("te", "trailers")]
    read_here = 0
    for call in range(400):  # past the 4 KiB table: older entries are evicted, and added again
        block = encoder.encode([*fields, ("grpc-timeout", f"{119999000 + call}u")])
        expected = {k: v for k, v in full.decode(block, raw=True) if k in WANTED}
        assert any(b & 0xC0 == 0x40 for b in block)  # a literal with incremental indexing (its first byte)
        seen = peek(decoder, block, WANTED)
        if seen is None:  # as the relay does then
            seen = {k: v for k, v in decoder.decode(block, raw=True) if k in WANTED}
        else:
            read_here += 1
        assert seen == expected == {b":path": b"/runtime.v1.RuntimeService/ListContainers"}
        assert list(decoder.header_table.dynamic_entries) == list(full.header_table.dynamic_entries)
    assert read_here == 400  # those that re-add an evicted entry and then refer to the table too


def test_a_block_that_refers_to_an_entry_it_adds_reads_it_as_the_full_decoder() -> None:
    encoder, full, decoder = hpack.Encoder(), hpack.Decoder(), hpack.Decoder()
    block = encoder.encode([("x-a", "1"), ("x-a", "1")])  # adds x-a, then refers to it (index 62)
    assert block[-1] == 0x80 | 62
    assert peek_all(decoder, block) == full.decode(block, raw=True) == [(b"x-a", b"1"), (b"x-a", b"1")]
    assert list(decoder.header_table.dynamic_entries) == list(full.header_table.dynamic_entries)


def test_an_index_to_an_entry_the_block_evicted_is_left_to_the_full_decoder() -> None:
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    encoder.header_table_size = 100
    first = encoder.encode([("x-a", "1" * 30)])  # the size, then x-a: 65 of 100 bytes
    decoder.decode(first, raw=True)
    literal = b"\x40\x03x-b\x1e" + b"2" * 30  # adds x-b (65 bytes): x-a is evicted
    block = literal + bytes([0x80 | 63])  # ... and then named as it was numbered before: gone
    before = list(decoder.header_table.dynamic_entries)
    assert peek(decoder, block, WANTED) is None and peek_all(decoder, block) is None
    assert list(decoder.header_table.dynamic_entries) == before  # nothing added by a read left halfway
    with pytest.raises(hpack.InvalidTableIndex):  # as the relay then does (COMPRESSION_ERROR)
        decoder.decode(block, raw=True)
    again = hpack.Decoder()
    again.decode(first, raw=True)
    assert peek_all(again, literal + bytes([0x80 | 62])) == [(b"x-b", b"2" * 30)] * 2  # x-b, which it added


def test_peek_all_leaves_a_header_list_over_the_limit_to_the_full_decoder() -> None:
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    decoder.decode(encoder.encode([("x-big", "v" * 1000)]))  # indexed: one byte refers to it
    block = encoder.encode([("x-big", "v" * 1000)] * 8)  # 8 x 1037 octets, as RFC 7541 counts them
    assert len(block) == 8
    decoder.max_header_list_size = 8 * 1037
    assert peek_all(decoder, block) == [(b"x-big", b"v" * 1000)] * 8
    decoder.max_header_list_size = 8 * 1037 - 1
    assert peek_all(decoder, block) is None
    with pytest.raises(hpack.OversizedHeaderListError):  # as the relay then does (COMPRESSION_ERROR)
        decoder.decode(block, raw=True)


def test_a_block_that_interleaves_adds_and_indexes_costs_what_its_length_does() -> None:
    """A client's block of 2,000 adds, each followed by an index to the newest
    entry (8 KB, inside the 256 KiB header list the proxy allows): the reader
    does a bounded amount of work per field, counted in Python calls, not one
    that grows with the adds before it (the event loop waits on this)."""
    import sys

    from runtimeproxy.frames.hpackpeek import HeaderReader

    block = b"\x40\x00\x00\xbe" * 2000  # adds ("", "") and then names it (index 62), 2000 times
    reader = HeaderReader(256 * 1024, "")
    calls = 0

    def count(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        seen = reader.peek(block, WANTED)
    finally:
        sys.setprofile(None)
    assert seen == {} and reader.every == [(b"", b"")] * 4000
    assert calls < 40 * 4000  # about 23 a field (hpack's add, twice); a rescan of the adds at each index: millions


def test_a_block_that_resizes_the_table_is_left_to_the_full_decoder() -> None:
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    decoder.decode(encoder.encode([(":path", "/a")]))
    encoder.header_table_size = 256  # announced in the next block
    block = encoder.encode([(":path", "/a")])
    assert block[0] & 0xE0 == 0x20
    assert peek(decoder, block, WANTED) is None and peek_all(decoder, block) is None
    assert decoder.decode(block, raw=True) == [(b":path", b"/a")]


def test_malformed_blocks_are_left_to_the_full_decoder() -> None:
    decoder = hpack.Decoder()
    for block in (b"\xff\xff\xff\xff\xff", b"\xbf", b"\x80", b"\x00\x85ab", b"\x00\x01a\x7f"):
        assert peek(decoder, block, WANTED) is None
        assert peek_all(decoder, block) is None


def test_a_block_from_an_encoder_that_kept_a_table_too_large_is_left_to_the_full_decoder() -> None:
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    decoder.decode(encoder.encode([(":path", "/a")]))
    decoder.max_allowed_table_size = 0  # our SETTINGS asked for no table; the encoder did not shrink it
    block = encoder.encode([(":path", "/a")])  # refers to the table, announces no size update
    assert peek(decoder, block, WANTED) is None and peek_all(decoder, block) is None
    with pytest.raises(hpack.InvalidTableSizeError):  # as the relay then does (COMPRESSION_ERROR)
        decoder.decode(block, raw=True)


def test_a_small_view_of_a_large_read_is_copied_before_a_transport_keeps_it() -> None:
    read = bytes(1000)
    small, large = memoryview(read)[:9], memoryview(read)[100:]
    assert type(detached(small)) is bytes and detached(small) == read[:9]
    assert detached(large) is large  # most of the read: no copy
    assert detached(b"abc") == b"abc"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(FIELD, max_size=6), min_size=1, max_size=16), st.booleans())
def test_a_header_reader_remembers_blocks_only_while_the_table_stays_as_it_was(  # type: ignore[no-untyped-def]
        blocks, huffman) -> None:
    """The same bytes repeated (as gRPC peers send them) and the same bytes
    after the table changed (where an index names another header): the
    reader's answers are the full decoder's every time."""
    from runtimeproxy.frames.hpackpeek import HeaderReader

    encoder = hpack.Encoder()
    full, reader = hpack.Decoder(), HeaderReader(1 << 16, "")
    earlier: list[bytes] = []
    for fields in blocks:
        block = encoder.encode([_field(*f) for f in fields], huffman=huffman)
        for again in [block, block, *earlier[-2:]]:  # repeats, and older bytes under a newer table
            try:
                expected = {bytes(k): bytes(v) for k, v in full.decode(again, raw=True) if bytes(k) in WANTED}
            except hpack.HPACKError:
                continue  # an older block the newer table cannot read: not something a peer sends
            seen = reader.peek(again, WANTED)
            if seen is None:
                seen = {k: v for k, v in reader.decode(again) if k in WANTED}
            assert seen == expected
        earlier.append(block)


def test_a_header_reader_forgets_what_it_read_when_the_table_size_allowed_changes() -> None:
    from runtimeproxy.frames.hpackpeek import HeaderReader

    encoder, reader = hpack.Encoder(), HeaderReader(1 << 16, "")
    reader.decode(encoder.encode([("grpc-status", "0")]))
    block = encoder.encode([("grpc-status", "0")])  # now one indexed field
    assert reader.peek(block, WANTED) == {b"grpc-status": b"0"}
    reader.allow_table_size(0)  # the peer must shrink its table first: the full decoder judges the block
    assert reader.peek(block, WANTED) is None


def test_a_header_reader_does_not_remember_long_blocks() -> None:
    from runtimeproxy.frames.hpackpeek import CACHED_BLOCK_BYTES, HeaderReader

    reader = HeaderReader(1 << 20, "")
    block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple("grpc-message", "x" * (CACHED_BLOCK_BYTES * 2))])
    assert reader.peek(block, WANTED) == {b"grpc-message": b"x" * (CACHED_BLOCK_BYTES * 2)}
    assert reader._seen[WANTED] == {}  # read again next time, not kept


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(FIELD, max_size=6), st.booleans()), min_size=1, max_size=16), st.booleans())
def test_a_header_reader_reads_every_header_as_the_full_decoder_when_it_remembers_them_too(  # type: ignore[no-untyped-def]
        blocks, huffman) -> None:
    """peek_all remembers blocks as peek does: repeated bytes, older bytes
    under a newer table, a peek of ``:path`` before it (as the relay reads a
    hooked call's block), each read as the full decoder reads it; and the list
    it gives is the caller's, not what it remembers."""
    from runtimeproxy.frames.hpackpeek import HeaderReader

    encoder = hpack.Encoder()
    full, reader = hpack.Decoder(), HeaderReader(1 << 16, "")
    earlier: list[bytes] = []
    for fields, path_first in blocks:
        block = encoder.encode([_field(*f) for f in fields], huffman=huffman)
        for again in [block, block, *earlier[-2:], block]:
            try:
                expected = [(bytes(k), bytes(v)) for k, v in full.decode(again, raw=True)]
            except hpack.HPACKError:
                continue  # an older block the newer table cannot read: not something a peer sends
            every = None
            if path_first:
                path = reader.peek(again, frozenset({b":path"}))
                every = reader.decode(again) if path is None else reader.every
            if every is None:
                every = reader.peek_all(again) or reader.decode(again)
            assert every == expected
            every.append((b"changed", b"by the caller"))  # not what the reader remembers
        earlier.append(block)


def test_a_header_reader_remembers_every_header_of_a_block_that_only_refers_to_the_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runtimeproxy.frames import hpackpeek
    from runtimeproxy.frames.hpackpeek import HeaderReader

    encoder, reader = hpack.Encoder(), HeaderReader(1 << 16, "")
    headers = [(":path", "/runtime.v1.RuntimeService/CreateContainer"), ("grpc-timeout", "120000m")]
    expected = [(b":path", headers[0][1].encode()), (b"grpc-timeout", b"120000m")]
    assert reader.peek_all(encoder.encode(headers)) == expected  # adds both to the table
    block = encoder.encode(headers)  # both indexed now
    assert reader.peek_all(block) == expected
    reads = []
    monkeypatch.setattr(hpackpeek, "_read", lambda *args: reads.append(args))
    assert reader.peek_all(block) == expected
    assert reads == []  # remembered: not read again
    reader.allow_table_size(0)
    assert reader.peek_all(block) is None  # forgotten with the table's size: read again (by the stub)
    assert len(reads) == 1
