"""What shutdown waits for on a frames connection (FrameConnection.wait_idle):
its relayed unary calls' answers. Guards existing behaviour: the event it
awaits is made only once something waits, not set and cleared per call."""

from __future__ import annotations

import asyncio

import hpack

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.connection import FrameConnection, Limits
from runtimeproxy.frames.frame import Flag, FrameType
from tests.frameroutes import Routes
from tests.frametransport import Transport

from .test_connection import VERSION, _request


def _answer(encoder: hpack.Encoder, sid: int) -> bytes:
    status = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    trailers = encoder.encode([("grpc-status", "0")])
    return (fr.serialize(FrameType.HEADERS, Flag.END_HEADERS, sid, status)
            + fr.serialize(FrameType.DATA, 0, sid, b"\0\0\0\0\x02ok")
            + fr.serialize(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, sid, trailers))


async def test_shutdown_waits_for_each_relayed_unary_call_until_its_answer_went() -> None:
    conn = FrameConnection(Transport(), Transport(), Routes(), None, Limits(max_message=100))  # type: ignore[arg-type]
    conn.client_data(fr.PREFACE + fr.serialize(FrameType.SETTINGS, 0, 0))
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0))
    requests, answers = hpack.Encoder(), hpack.Encoder()
    await asyncio.wait_for(conn.wait_idle(), 5)  # no call: at once
    for sid in (1, 3):  # the second: busy again once idle, and the waiter made for the first told again
        conn.client_data(_request(requests, sid, VERSION))
        assert sid in conn.unary_open and not conn.is_idle
        waiting = asyncio.ensure_future(conn.wait_idle())
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiting.done()  # shutdown waits for the call
        conn.backend_data(_answer(answers, sid))
        await asyncio.wait_for(waiting, 5)
        assert conn.is_idle and conn.unary_open == set() and not conn.closed.done()
