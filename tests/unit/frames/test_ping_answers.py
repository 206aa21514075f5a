"""The runtime's pings, answered by the proxy (frames/pings.py) within
ACK_DELAY_S: the answer's timer is the loop's call_later, recorded here and
run when the test says, so no test waits out the delay. Guards existing
behaviour (moved from test_connection.py, which waited the delay out)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from runtimeproxy.frames import frame as fr
from runtimeproxy.frames.frame import ErrorCode, Flag, FrameType
from runtimeproxy.frames.pings import ACK_DELAY_S, DelayedAcks

from .test_connection import _connection, _written_frames

PING = fr.serialize(FrameType.PING, 0, 0, b"bdp-ping")
ACK = fr.serialize(FrameType.PING, Flag.ACK, 0, b"bdp-ping")


@dataclass
class Timer:
    delay: float
    callback: Callable[..., object]
    args: tuple[Any, ...]
    handle: asyncio.TimerHandle

    def expire(self) -> None:
        """Its time reached: the callback runs, unless the timer was cancelled."""
        if not self.handle.cancelled():
            self.handle.cancel()
            self.callback(*self.args)


def answer_timers(monkeypatch: pytest.MonkeyPatch) -> list[Timer]:
    """The ping answers' timers begun from now on: each recorded, never
    ending by itself (others pass through to the loop's own)."""
    loop = asyncio.get_running_loop()
    real, timers = loop.call_later, list[Timer]()

    def call_later(delay: float, callback: Callable[..., object], *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__func__", None) is not DelayedAcks.flush:
            return real(delay, callback, *args, **kwargs)
        timers.append(Timer(delay, callback, args, real(3600, callback, *args, **kwargs)))
        return timers[-1].handle

    monkeypatch.setattr(loop, "call_later", call_later)
    return timers


def written(transport: Any) -> bytes:
    return b"".join(map(bytes, transport.written))


async def test_the_runtimes_pings_are_answered_by_the_proxy_within_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """PING is per hop both ways: grpc-go pings as requests arrive (BDP),
    sizing its connection to the proxy; a client never sees those pings. The
    answer waits (pings.ACK_DELAY_S), so the runtime pings once per delay, not per call."""
    timers = answer_timers(monkeypatch)
    conn, client, backend, _ = _connection()
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0) + PING)
    assert ACK not in written(backend)
    assert [t.delay for t in timers] == [ACK_DELAY_S]
    timers[0].expire()
    assert written(backend).count(ACK) == 1
    assert not [f for f in _written_frames(client) if f.type == FrameType.PING]
    conn.client_data(fr.serialize(FrameType.PING, Flag.ACK, 0, b"stray-ak"))  # answers no ping: dropped
    assert b"stray-ak" not in written(backend) and not conn.closed.done()


async def test_after_the_runtimes_goaway_its_pings_are_answered_at_once() -> None:
    """grpc-go's graceful stop sends GOAWAY and a ping, and names its last
    stream only once the ping is answered: no delay there."""
    conn, _, backend, _ = _connection()
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0) + PING)
    conn.backend_data(fr.goaway(0x7FFFFFFF, ErrorCode.NO_ERROR) + fr.serialize(FrameType.PING, 0, 0, b"goaway-p"))
    assert ACK in written(backend)
    assert fr.serialize(FrameType.PING, Flag.ACK, 0, b"goaway-p") in written(backend)


async def test_a_ping_held_when_the_connection_ends_is_never_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its answer's time reached after the connection's end: nothing goes."""
    timers = answer_timers(monkeypatch)
    conn, _, backend, _ = _connection()
    conn.backend_data(fr.serialize(FrameType.SETTINGS, 0, 0) + PING)
    conn.lost()
    before = len(backend.written)
    assert len(timers) == 1
    timers[0].expire()
    assert len(backend.written) == before and b"bdp-ping" not in written(backend)
