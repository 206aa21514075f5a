"""bench/headers.py: its client models encode as the docstring says, and both readers read the same."""

from __future__ import annotations

import hpack
import pytest

from bench import headers
from runtimeproxy.frames.hpackpeek import HeaderReader


@pytest.mark.parametrize("name", list(headers.CLIENTS))
def test_every_models_blocks_read_the_same_both_ways(name: str) -> None:
    encoded = headers.blocks(headers.CLIENTS[name], 300)
    full, reader = hpack.Decoder(), HeaderReader(1 << 20, "")
    for n, block in enumerate(encoded):
        path = dict(full.decode(block, raw=True))[b":path"]
        assert path == f"/runtime.v1.RuntimeService/{headers.METHODS[n % len(headers.METHODS)]}".encode()
        assert (reader.peek(block, headers.PATH) or dict(reader.decode(block)))[b":path"] == path


def test_the_models_encode_their_deadlines_as_described() -> None:
    def table_changes(name: str) -> int:
        decoder, changes = hpack.Decoder(), 0
        for n, block in enumerate(headers.blocks(headers.CLIENTS[name], 100)):
            before = list(decoder.header_table.dynamic_entries)
            decoder.decode(block)
            changes += n >= len(headers.METHODS) and list(decoder.header_table.dynamic_entries) != before
        return changes  # past each path's first call

    assert table_changes("grpc-go, 30 s deadline") == 100 - len(headers.METHODS)  # a new value each call
    assert table_changes("grpc-go, 2 min deadline (kubelet)") == 0
    assert table_changes("grpc-go, no deadline") == 0
    assert table_changes("grpc-core, new deadline values") == 100 - len(headers.METHODS)
    block = headers.blocks(headers.CLIENTS["grpc-core, new deadline values"], 2)[1]
    assert block[-1] & 0x80 and (block[-1] & 0x7F) > 61  # its user-agent: an index into the table, after the add


def test_it_prints_one_line_per_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert headers.main(["--blocks", "50", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(headers.CLIENTS)
    assert all(line.startswith(name) and line.endswith("x") for name, line in zip(headers.CLIENTS, lines[2:], strict=True))
