"""hooks/frameserver/headers.py: a connection's request blocks read as hpack's full
decoder reads them, the table kept in step, though blocks without HPACK state are
remembered and not read again."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hooks.frameserver.headers import Block, HeaderBlocks
from hooks.frameserver.settings import MAX_HEADER_LIST
from runtimeproxy.frames import frame as fr
from runtimeproxy.frames import hpackpeek
from runtimeproxy.frames.frame import Flag, FrameError, FrameType
from runtimeproxy.frames.hpackstatic import field, integer, string
from runtimeproxy.hookclient.headers import request_block_prefix, with_timeout


def _headers_frame(block: bytes, sid: int = 1) -> fr.Frame:
    return fr.Frame(FrameType.HEADERS, Flag.END_HEADERS, sid, block)


def _plain(block: Block | None) -> tuple[int, dict[bytes, bytes], bool] | None:
    """A block with its headers as a dict, to compare."""
    return None if block is None else (block[0], block[1].headers, block[2])


def _indexed_literal(name: bytes, value: bytes) -> bytes:
    return b"\x40" + string(name) + string(value)  # a literal with incremental indexing, a new name


# Pieces of a block: stateless ones (the proxy's kind), ones that add to the
# table, a reference to the table's first entry, and table size updates.
STATELESS = [field(b":method", b"POST"), field(b":path", b"/runtime.v1alpha1.RuntimeHookService/PreStartContainerHook"),
             field(b"grpc-timeout", b"1999m"), field(b"te", b"trailers"), field(b"x-a", b"1")]
ADDING = [_indexed_literal(b"x-b", b"2"), _indexed_literal(b"x-c", b"3" * 100)]
PIECES = [*STATELESS, *ADDING, b"\xbe"]  # index 62: the dynamic table's newest entry
SIZES = [0, 64, 4096]
BLOCK = st.tuples(st.sampled_from([None, *SIZES]), st.lists(st.sampled_from(PIECES), min_size=0, max_size=3))


def _block(size: int | None, pieces: list[bytes]) -> bytes:
    return (b"" if size is None else integer(size, 5, 0x20)) + b"".join(pieces)


X_B, X_C = ADDING  # at a table of 64 bytes x-b fits, and x-c, too large, empties it


@settings(max_examples=400, deadline=None)
@given(st.lists(BLOCK, min_size=1, max_size=16))
@example([(64, []), (None, [X_B]), (None, [X_C]), (None, [X_B]), (None, [b"\xbe"])])  # x-b added again
@example([(64, []), (None, [X_C]), (None, [X_B]), (None, [X_C]), (None, [b"\xbe"])])  # x-c empties the table again
def test_blocks_read_as_the_full_decoder_reads_them(blocks: list[tuple[int | None, list[bytes]]]) -> None:
    """From a small pool, so blocks repeat: at an empty table (remembered),
    after the table has filled or a size update changed it (read again)."""
    full = hpack.Decoder()
    full.max_header_list_size = MAX_HEADER_LIST
    reader = HeaderBlocks()
    for size, pieces in blocks:
        block = _block(size, pieces)
        try:
            expected = dict(full.decode(block, raw=True))
        except hpack.HPACKError:
            with pytest.raises(FrameError):
                reader.headers(_headers_frame(block))
            return  # a connection error: the connection ends
        assert _plain(reader.headers(_headers_frame(block))) == (1, expected, False)
        assert list(reader._decoder.header_table.dynamic_entries) == list(full.header_table.dynamic_entries)
        assert reader._decoder.header_table.maxsize == full.header_table.maxsize


def test_a_block_remembered_at_a_table_of_0_is_read_again_once_the_table_has_room() -> None:
    """At a table size of 0 an indexed literal is added and evicted at once:
    the table stays empty. Once a size update gives it room, the same block
    adds its entry, which a later block refers to."""
    reader, adding = HeaderBlocks(), _indexed_literal(b"x-b", b"2")
    for block in (integer(0, 5, 0x20), adding, integer(4096, 5, 0x20), adding):
        reader.headers(_headers_frame(block))
    assert _plain(reader.headers(_headers_frame(b"\xbe"))) == (1, {b"x-b": b"2"}, False)


def test_a_remembered_block_is_refused_once_a_smaller_table_is_allowed_as_one_never_read() -> None:
    """Before: a block remembered at the table's 4096 bytes was taken as
    remembered, without the reader's check that the peer shrank its table
    first to what this side allows."""
    block = b"".join(STATELESS)
    allowed_now = hpack.Decoder()
    allowed_now.max_allowed_table_size = 0
    with pytest.raises(hpack.HPACKError):
        allowed_now.decode(block)  # the full decoder's answer
    reader = HeaderBlocks()
    read = _plain(reader.headers(_headers_frame(block)))
    assert _plain(reader.headers(_headers_frame(block))) == read  # remembered
    reader.allow_table_size(0)
    with pytest.raises(FrameError, match="bad header block"):
        reader.headers(_headers_frame(block))
    assert _plain(reader.headers(_headers_frame(integer(0, 5, 0x20) + block))) == read  # shrunk first: read
    assert _plain(reader.headers(_headers_frame(block))) == read  # and, at its table of 0, remembered again


def test_the_proxys_blocks_are_read_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []
    read_block = hpackpeek._read  # what every read of a block without a full decode comes to

    def counted(decoder: hpack.Decoder, block: bytes, wanted: frozenset[bytes] | None) -> object:
        reads.append(block)
        return read_block(decoder, block, wanted)

    monkeypatch.setattr(hpackpeek, "_read", counted)
    reader = HeaderBlocks()
    prefix = request_block_prefix("/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook")
    blocks = [with_timeout(prefix, seconds) for seconds in (2.0, 2.0, 1.0, 2.0, 1.0)]
    read = [reader.headers(_headers_frame(block, sid))[1].headers for sid, block in enumerate(blocks, 1)]
    assert len(reads) == 2
    assert [r[b"grpc-timeout"] for r in read] == [b"2000m", b"2000m", b"1000m", b"2000m", b"1000m"]
    assert read[0][b":path"] == b"/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook"


def _variants(block: bytes) -> dict[str, list[fr.Frame]]:
    """The same block sent whole, padded, with priority fields, and in three pieces."""
    end, headers, more = Flag.END_HEADERS, FrameType.HEADERS, FrameType.CONTINUATION
    third = len(block) // 3
    return {
        "whole": [fr.Frame(headers, end | Flag.END_STREAM, 3, block)],
        "padded": [fr.Frame(headers, end | Flag.END_STREAM | Flag.PADDED, 3, b"\x04" + block + b"\0" * 4)],
        "priority": [fr.Frame(headers, end | Flag.END_STREAM | Flag.PRIORITY, 3, b"\0\0\0\0\x10" + block)],
        "pieces": [fr.Frame(headers, Flag.END_STREAM, 3, block[:third]), fr.Frame(more, 0, 3, block[third:2 * third]),
                   fr.Frame(more, end, 3, block[2 * third:])],
    }


def test_a_block_reads_the_same_however_it_is_framed() -> None:
    block = with_timeout(request_block_prefix("/runtime.v1alpha1.RuntimeHookService/PreStartContainerHook"), 2.0)
    read = {}
    for name, frames in _variants(block).items():
        reader = HeaderBlocks()
        first, *rest = frames
        got = [_plain(reader.headers(first)), *(_plain(reader.continuation(f)) for f in rest)]
        assert got[:-1] == [None] * (len(frames) - 1) and not reader.open
        read[name] = got[-1]
    assert read["whole"] == (3, dict(hpack.Decoder().decode(block, raw=True)), True)
    assert all(got == read["whole"] for got in read.values()), read


def test_alternating_remembered_blocks_each_come_back_as_their_first_read() -> None:
    """What the connection works out from a block is kept on its Read: a
    repeat, after another block between, hands back the same one."""
    reader = HeaderBlocks()
    paths = ("/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook",
             "/runtime.v1alpha1.RuntimeHookService/PreStartContainerHook")
    blocks = [with_timeout(request_block_prefix(path), 2.0) for path in paths]
    first = [reader.headers(_headers_frame(block))[1] for block in blocks]
    again = [reader.headers(_headers_frame(block))[1] for block in blocks]
    assert all(a is b for a, b in zip(first, again, strict=True)) and first[0] is not first[1]
