"""A few headers read out of an HPACK block, without the full decoder.

The relay needs one or two headers of each block (``:path`` of a request,
``grpc-status`` of an answer), and a full decode is a large part of what a
relayed call costs. Most blocks after the first few calls on a connection
only refer to the dynamic table or add literals that are not indexed (gRPC's
``grpc-timeout``), and leave the table as it was: for those the wanted
headers are read here and the rest skipped. A block that changes the table
(a literal with incremental indexing, a size update), or anything this reader
does not take, returns None: the caller then decodes it in full, which keeps
the table in step and reports malformed blocks. ``peek_all`` reads every
header the same way, for the calls the proxy handles itself. ``HeaderReader``
is one direction's decoder read that way, with what it found remembered.
"""

from __future__ import annotations

import hpack
from hpack.hpack import decode_integer
from hpack.huffman_table import decode_huffman

from .frame import ErrorCode, FrameError


def peek(decoder: hpack.Decoder, block: bytes, wanted: frozenset[bytes]) -> dict[bytes, bytes] | None:
    """The ``wanted`` headers of ``block`` (the last of each name), or None (decode it in full)."""
    try:
        found = _peek(decoder, block, wanted)
    except Exception:  # noqa: BLE001 - whatever this reader cannot take, the full decoder judges
        return None
    return None if found is None else dict(found)


def peek_all(decoder: hpack.Decoder, block: bytes) -> list[tuple[bytes, bytes]] | None:
    """Every header of ``block``, in order, as ``decoder.decode(block, raw=True)``
    gives them; or None (decode it in full), also when the list is longer than
    the decoder's ``max_header_list_size``, so that the full decoder refuses it."""
    try:
        return _peek(decoder, block, None)
    except Exception:  # noqa: BLE001 - as in peek
        return None


def _peek(decoder: hpack.Decoder, block: bytes, wanted: frozenset[bytes] | None) -> list[tuple[bytes, bytes]] | None:
    """The wanted headers (all of them if ``wanted`` is None), or None."""
    if decoder.header_table_size > decoder.max_allowed_table_size:
        return None  # the peer had to shrink its table first: the full decoder refuses the block
    table = decoder.header_table
    found: list[tuple[bytes, bytes]] = []
    room = decoder.max_header_list_size  # RFC 7541's size: name, value and 32 octets each
    view = memoryview(block)
    i, n = 0, len(block)
    while i < n:
        first = block[i]
        if first & 0x80:  # indexed field
            if first != 0xFF:  # the index fits in the first byte (nearly always)
                index = first & 0x7F
                i += 1
            else:
                index, used = decode_integer(view[i:], 7)
                i += used
            if index == 0:
                return None
            name, value = table.get_by_index(index)
        elif first & 0xC0 == 0x40 or first & 0xE0 == 0x20:  # adds to the table, or resizes it
            return None
        else:  # a literal without indexing (0000xxxx) or never indexed (0001xxxx)
            index, used = decode_integer(view[i:], 4)
            i += used
            if index:
                name = table.get_by_index(index)[0]
            else:
                name, i = _string(block, view, i)
            if wanted is not None and name not in wanted:  # its value is skipped, not decoded
                length, used = decode_integer(view[i:], 7)
                i += used + length
                if i > n:
                    return None
                continue
            value, i = _string(block, view, i)
        if wanted is None:
            room -= len(name) + len(value) + 32
            if room < 0:
                return None
            found.append((name, value))
        elif name in wanted:
            found.append((name, value))
    return found


def _string(block: bytes, view: memoryview, i: int) -> tuple[bytes, int]:
    huffman = block[i] & 0x80
    length, used = decode_integer(view[i:], 7)
    start = i + used
    end = start + length
    if end > len(block):
        raise ValueError("string past the end of the block")
    data = bytes(view[start:end])
    return (decode_huffman(data) if huffman else data), end


CACHED_BLOCKS = 256  # blocks remembered per set of wanted names, at most (then forgotten, and peeked again)
CACHED_BLOCK_BYTES = 256  # a longer block is peeked each time: the ones that repeat are a few bytes


class HeaderReader:
    """One direction's HPACK state, read the cheapest way that keeps it exact.

    A gRPC peer sends the same bytes for the same headers once its dynamic
    table holds them (each call's block of a method, each answer's status):
    what ``peek`` found in a block is remembered until the table changes, which
    only a full decode (``decode``) or a new size limit can do."""

    def __init__(self, max_header_list_size: int, source: str) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = max_header_list_size
        self._source = source  # for errors: "" or " from the backend"
        self._seen: dict[frozenset[bytes], dict[bytes, dict[bytes, bytes]]] = {}

    def allow_table_size(self, size: int) -> None:
        """The peer's encoder may use ``size`` bytes of table (the other side's SETTINGS)."""
        self._decoder.max_allowed_table_size = size
        self._seen.clear()

    def peek(self, block: bytes, wanted: frozenset[bytes]) -> dict[bytes, bytes] | None:
        """As ``peek``; the answer is shared, not to be changed."""
        seen = self._seen.get(wanted)
        if seen is None:
            seen = self._seen[wanted] = {}
        found = seen.get(block)
        if found is None:
            found = peek(self._decoder, block, wanted)
            if found is not None and len(block) <= CACHED_BLOCK_BYTES:
                if len(seen) >= CACHED_BLOCKS:
                    seen.clear()
                seen[block] = found
        return found

    def peek_all(self, block: bytes) -> list[tuple[bytes, bytes]] | None:
        return peek_all(self._decoder, block)

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Every header, with the table updated; a bad block is a connection error."""
        self._seen.clear()
        try:
            # raw: a -bin value may be true binary (grpc's 0xfe03 setting)
            return self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise FrameError(ErrorCode.COMPRESSION_ERROR, f"bad header block{self._source}: {exc}") from exc
