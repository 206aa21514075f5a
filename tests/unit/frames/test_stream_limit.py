"""--max-concurrent-streams counts the streams a client has open on the
proxy: a hooked call whose answer went (its stages still recording it) is
over for the client (RFC 9113 5.1.2: closed streams do not count), so it no
longer takes one of its streams. Before: such a call counted until its
stages were done, and the client's next call within the limit was refused
(REFUSED_STREAM)."""

from __future__ import annotations

import struct

import hpack

from runtimeproxy.frames.frame import ErrorCode, FrameType

from .test_answer_at_once import ANSWER_FRAMES, _Recording, _started
from .test_as_read import _answer, _client_frames
from .test_connection import _data, _headers, _turns
from .test_hooked_answer import _writes_on

MESSAGE = struct.pack(">BI", 0, 3) + b"abc"


def _resets(client: object, sid: int) -> list[int]:
    return [struct.unpack(">I", bytes(f.payload))[0] for f in _client_frames(client)  # type: ignore[arg-type]
            if f.type == FrameType.RST_STREAM and f.stream_id == sid]


async def test_a_hooked_call_whose_answer_went_no_longer_counts_while_its_stages_record_it() -> None:
    routes = _Recording()
    conn, client = await _started(routes)
    conn.max_streams = 1
    conn.backend_data(_answer(1))
    assert _writes_on(client, 1) == [ANSWER_FRAMES]  # the client has its answer: stream 1 is closed for it
    assert 1 in conn.hooked  # its stage still records it
    conn.client_data(_headers(hpack.Encoder(), 3) + _data(3, MESSAGE, end=True))
    await _turns()
    assert _resets(client, 3) == []  # not refused
    assert 3 in conn.hooked
    routes.recorded.set()
    await _turns()
    assert 1 not in conn.hooked


async def test_a_hooked_call_whose_answer_is_still_held_counts() -> None:
    routes = _Recording(early=False)  # the answer waits for the stage
    conn, client = await _started(routes)
    conn.max_streams = 1
    conn.backend_data(_answer(1))
    await _turns()
    assert _writes_on(client, 1) == []  # held: the stream is open for the client
    conn.client_data(_headers(hpack.Encoder(), 3) + _data(3, MESSAGE, end=True))
    await _turns()
    assert 3 not in conn.hooked  # refused (its reset goes behind the held answer: HPACK order)
    routes.answered.set()
    routes.recorded.set()
    await _turns()
    assert _writes_on(client, 1) == [ANSWER_FRAMES]
    assert _resets(client, 3) == [ErrorCode.REFUSED_STREAM]
    assert conn.hooked == {}
