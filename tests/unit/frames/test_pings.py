"""The runtime's pings, answered within a delay (frames/pings.py)."""

from __future__ import annotations

import asyncio

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import Flag, FrameType
from runtimeproxy.frames.pings import MAX_HELD, DelayedAcks

DELAY = 0.05


def _ack(payload: bytes) -> bytes:
    return fr.serialize(FrameType.PING, Flag.ACK, 0, payload)


async def test_pings_within_one_delay_are_answered_together_in_order() -> None:
    written: list[bytes] = []
    acks = DelayedAcks(written.append, DELAY)
    acks.ping(b"first-00")
    acks.ping(b"second-0")
    assert written == [] and acks.held == 2
    await asyncio.sleep(DELAY * 2)
    assert written == [_ack(b"first-00") + _ack(b"second-0")] and acks.held == 0


async def test_a_ping_after_an_answer_starts_a_new_delay() -> None:
    written: list[bytes] = []
    acks = DelayedAcks(written.append, DELAY)
    acks.ping(b"first-00")
    await asyncio.sleep(DELAY * 2)
    acks.ping(b"second-0")
    assert written == [_ack(b"first-00")]
    await asyncio.sleep(DELAY * 2)
    assert written == [_ack(b"first-00"), _ack(b"second-0")]


async def test_a_flood_of_pings_is_answered_at_once_not_held_without_bound() -> None:
    written: list[bytes] = []
    acks = DelayedAcks(written.append, 60.0)
    for i in range(MAX_HELD):
        acks.ping(b"ping-%03d" % i)
    assert b"".join(written) == b"".join(_ack(b"ping-%03d" % i) for i in range(MAX_HELD))
    assert acks.held == 0


async def test_closed_acks_send_nothing() -> None:
    written: list[bytes] = []
    acks = DelayedAcks(written.append, DELAY)
    acks.ping(b"first-00")
    acks.close()
    await asyncio.sleep(DELAY * 2)
    assert written == [] and acks.held == 0


async def test_once_at_once_every_held_and_later_ping_is_answered_immediately() -> None:
    written: list[bytes] = []
    acks = DelayedAcks(written.append, 60.0)
    acks.ping(b"first-00")
    acks.at_once()
    assert written == [_ack(b"first-00")]
    acks.ping(b"goaway-p")
    assert written == [_ack(b"first-00"), _ack(b"goaway-p")]
