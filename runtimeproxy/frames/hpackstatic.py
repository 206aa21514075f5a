"""Header blocks that carry no HPACK state: built once, sent as often as needed.

A block made only of HPACK's static table and literals "without indexing"
(RFC 7541 sections 6.1 and 6.2.2) neither reads nor changes either side's
dynamic table, so the same bytes are valid on any connection at any time,
and a peer that remembers what it read in a block (hpackpeek.HeaderReader)
reads them once. A block must still start with a dynamic table size update
after the encoder's table size changed: the caller checks that first. A field
the sender marked never indexed (hpack's ``NeverIndexedHeaderTuple``) is
written never indexed again, as RFC 7541 6.2.3 requires of an intermediary.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpack.struct import NeverIndexedHeaderTuple
from hpack.table import HeaderTable

# RFC 7541 appendix A, 1-based: the entry that matches name and value, and the first of each name.
_FULL = {entry: index for index, entry in reversed(list(enumerate(HeaderTable.STATIC_TABLE, 1)))}
_NAMES = {name: index for index, (name, _) in reversed(list(enumerate(HeaderTable.STATIC_TABLE, 1)))}


def integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 section 5.1."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def string(data: bytes) -> bytes:
    return integer(len(data), 7, 0) + data  # not Huffman coded


def field(name: bytes, value: bytes, never_indexed: bool = False) -> bytes:
    """One header: indexed if the static table has it whole, else a literal
    without indexing, its name from the static table where it is there.
    ``never_indexed``: always a never-indexed literal (RFC 7541 6.2.3), never
    the static table's whole entry, so that the next hop keeps it so too."""
    if never_indexed:
        index = _NAMES.get(name)
        return (integer(index, 4, 0x10) if index is not None else b"\x10" + string(name)) + string(value)
    index = _FULL.get((name, value))
    if index is not None:
        return integer(index, 7, 0x80)
    index = _NAMES.get(name)
    if index is not None:
        return integer(index, 4, 0) + string(value)
    return b"\x00" + string(name) + string(value)


def stateless_block(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    return b"".join(field(header[0], header[1], type(header) is NeverIndexedHeaderTuple) for header in headers)
