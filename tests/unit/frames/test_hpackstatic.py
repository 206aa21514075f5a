"""Header blocks that carry no HPACK state (frames/hpackstatic.py) and their users."""

from __future__ import annotations

import hpack
import pytest

from hooks.frameserver.sending import Sender
from hooks.frameserver.settings import PeerSettings
from runtimeproxy.frames.hpackpeek import HeaderReader
from runtimeproxy.frames.hpackstatic import field, stateless_block
from runtimeproxy.hookclient.headers import request_block_prefix, with_timeout

HEADERS = [
    (b":status", b"200"),  # whole in the static table
    (b"content-type", b"application/grpc"),  # its name in the static table
    (b"grpc-status", b"0"),  # neither
    (b"grpc-message", b"x" * 200),  # a length past the 7-bit prefix
]


def test_a_block_reads_back_and_leaves_the_table_empty() -> None:
    decoder = hpack.Decoder()
    block = stateless_block(HEADERS)
    for _ in range(3):  # the same bytes, read again and again
        assert decoder.decode(block, raw=True) == HEADERS
    assert len(decoder.header_table.dynamic_entries) == 0
    assert block[0] == 0x88  # ":status: 200" is static entry 8


def test_a_peer_that_remembers_reads_it_without_a_decode() -> None:
    reader = HeaderReader(1 << 16, "")
    block = stateless_block(HEADERS)
    assert reader.peek(block, frozenset({b"grpc-status"})) == {b"grpc-status": b"0"}
    assert reader.peek_all(block) == HEADERS


def test_the_hook_clients_request_block_is_stateless() -> None:
    block = with_timeout(request_block_prefix("/runtime.v1alpha1.RuntimeHookService/PreRunPodSandboxHook"), 2.5)
    decoder = hpack.Decoder()
    assert dict(decoder.decode(block, raw=True))[b"grpc-timeout"] == b"2500m"
    assert len(decoder.header_table.dynamic_entries) == 0
    assert field(b":method", b"POST") == b"\x83"


@pytest.mark.parametrize("resized", [False, True])
def test_a_table_size_update_owed_to_the_peer_opens_the_next_block(resized: bool) -> None:
    encoder = hpack.Encoder()
    sender = Sender(PeerSettings(), encoder, lambda sid: True, lambda call: None)
    stateless = stateless_block(HEADERS)
    if resized:
        encoder.header_table_size = 0  # the peer's SETTINGS_HEADER_TABLE_SIZE shrank it
    block = sender.block(HEADERS, stateless)
    if resized:
        assert block[0] & 0xE0 == 0x20  # a dynamic table size update first (RFC 7541 section 6.3)
        assert sender.block(HEADERS, stateless) is stateless  # owed once
    else:
        assert block is stateless
    assert hpack.Decoder().decode(block, raw=True) == HEADERS
