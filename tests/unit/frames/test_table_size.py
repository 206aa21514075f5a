"""SETTINGS_HEADER_TABLE_SIZE lowered mid-connection: the other side's encoder
keeps to it once it has acknowledged it (RFC 9113, 6.5.3; RFC 7541, 4.2), and
its blocks before that are read under the size they were encoded with."""

from __future__ import annotations

import struct

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType, Setting

from .test_connection import VERSION, _answer, _request
from .test_relayed_frames import OK, _connection

NO_TABLE = fr.serialize(FrameType.SETTINGS, 0, 0, struct.pack(">HI", Setting.HEADER_TABLE_SIZE, 0))
ACK = fr.serialize(FrameType.SETTINGS, Flag.ACK, 0)


async def test_the_runtimes_blocks_before_its_ack_keep_the_old_table_and_after_it_the_new() -> None:
    conn, _, _, to_backend, from_backend = _connection()
    conn.client_data(b"".join(_request(to_backend, sid, VERSION) for sid in (1, 3, 5)))
    conn.backend_data(_answer(from_backend, 1, OK))  # fills the runtime's table
    conn.client_data(NO_TABLE)
    conn.backend_data(_answer(from_backend, 3, OK))  # encoded before it read the SETTINGS: legal
    assert not conn.closed.done()
    from_backend.header_table_size = 0  # it reads them: its next block starts with a size update
    conn.backend_data(ACK + _answer(from_backend, 5, OK))
    assert not conn.closed.done()
    assert conn.relayed == set()  # each call read to its end


async def test_the_clients_blocks_keep_the_table_the_runtime_allowed_until_the_client_acks() -> None:
    conn, _, _, to_backend, from_backend = _connection()
    conn.client_data(_request(to_backend, 1, VERSION))  # adds to the client's table
    conn.backend_data(NO_TABLE)
    conn.client_data(_request(to_backend, 3, VERSION))  # before its ACK: the old size holds
    assert not conn.closed.done()
    to_backend.header_table_size = 0
    conn.client_data(ACK + _request(to_backend, 5, VERSION))
    assert not conn.closed.done()
    conn.backend_data(b"".join(_answer(from_backend, sid, OK) for sid in (1, 3, 5)))
    assert conn.relayed == set()
