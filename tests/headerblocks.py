"""An HPACK header block as text, for the tests' raw HTTP/2 peers."""

from __future__ import annotations

import hpack


def decoded(decoder: hpack.Decoder, block: bytes) -> dict[str, str]:
    """The headers of ``block`` by name (a repeated name: its last value), as UTF-8 text.

    Decoded raw and then as text here: hpack types ``decode``'s pairs as bytes
    whatever ``raw`` says, so its text pairs (raw=False) would pass as bytes.
    """
    return {bytes(name).decode(): bytes(value).decode() for name, value in decoder.decode(block, raw=True)}
