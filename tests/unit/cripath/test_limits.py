"""Memory the C heaps hold after it was freed is given back to the system."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from runtimeproxy.cripath.limits import (
    TRIM_MAX_INTERVAL_S,
    give_back_freed_memory,
    rss_bytes,
    server_options,
)

MIB = 1 << 20


def test_server_options_bound_the_streams_of_a_connection() -> None:
    options = server_options([("grpc.max_receive_message_length", 1)], 123)
    assert ("grpc.max_concurrent_streams", 123) in options
    assert ("grpc.max_receive_message_length", 1) in options


async def test_freed_memory_the_heap_keeps_is_given_back() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # As grpc's per-call state: many small blocks, freed all but a few, so
    # that the heap cannot shrink from its top and keeps the pages.
    blocks = [libc.malloc(4000) for _ in range(40_000)]
    for address in blocks:
        ctypes.memset(address, 1, 4000)  # touched: resident
    kept = blocks[-1::-500]
    for address in set(blocks) - set(kept):
        libc.free(address)
    before = rss_bytes()
    trimmer = asyncio.ensure_future(give_back_freed_memory(interval=0.05, growth=0))
    try:
        async with asyncio.timeout(10):
            while rss_bytes() > before - 100 * MIB:  # noqa: ASYNC110 - resident memory has no event; bounded
                await asyncio.sleep(0.05)
    finally:
        trimmer.cancel()
        for address in kept:
            libc.free(address)


class _Ended(Exception):
    pass


@dataclass
class _Process:
    """A process as give_back_freed_memory sees it: its resident size, what a
    trim would give back of it, and a clock that moves only when it sleeps."""

    rss: int
    end: float
    freeable: int = 0
    now: float = 0.0
    trims: list[float] = field(default_factory=list)
    events: list[tuple[float, Callable[[_Process], None]]] = field(default_factory=list)

    def trim(self, pad: int) -> int:
        self.trims.append(self.now)
        self.rss -= self.freeable
        given, self.freeable = self.freeable, 0
        return int(given > 0)

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        while self.events and self.events[0][0] <= self.now:
            self.events.pop(0)[1](self)
        if self.now > self.end:
            raise _Ended

    async def run(self) -> list[float]:
        with pytest.raises(_Ended):
            await give_back_freed_memory(
                trim=self.trim, rss=lambda: self.rss, clock=lambda: self.now, sleep=self.sleep,
            )
        return self.trims


def _at(time: float, change: Callable[[_Process], None]) -> tuple[float, Callable[[_Process], None]]:
    return time, change


async def test_memory_kept_above_the_floor_is_trimmed_less_and_less_often() -> None:
    # Start-up floor 50 MiB; from 1 s on, 9 MiB more the process keeps (its
    # caches): no trim gives any of it back.
    process = _Process(rss=50 * MIB, end=600)
    process.events.append(_at(1, lambda p: setattr(p, "rss", 59 * MIB)))
    trims = await process.run()
    # Before: a trim every 5 s, 120 in ten minutes.
    assert trims == [5, 15, 35, 75, 135, 195, 255, 315, 375, 435, 495, 555]
    assert TRIM_MAX_INTERVAL_S == 60


async def test_memory_a_client_held_is_given_back_once_it_leaves() -> None:
    # A client holds 200 MiB from 1 s to 300 s: the trims while it holds give
    # nothing back; once it leaves, the next trim gives it all back, within a
    # minute, and trims stop once the process is back at its floor.
    process = _Process(rss=50 * MIB, end=600)
    process.events += [
        _at(1, lambda p: setattr(p, "rss", 250 * MIB)),
        _at(300, lambda p: setattr(p, "freeable", 200 * MIB)),
    ]
    trims = await process.run()
    left = [t for t in trims if t >= 300]
    assert left and left[0] - 300 <= TRIM_MAX_INTERVAL_S
    assert process.rss == 50 * MIB
    assert left == [left[0]], "nothing trimmed once back at the floor"


async def test_new_growth_is_trimmed_at_the_next_look_however_long_the_wait() -> None:
    process = _Process(rss=50 * MIB, end=400)
    grown: list[float] = []

    def grow(p: _Process) -> None:  # another client: 20 MiB more, 10 of it freed by the time it is looked at
        grown.append(p.now)
        p.rss += 20 * MIB
        p.freeable = 10 * MIB

    process.events += [_at(1, lambda p: setattr(p, "rss", 59 * MIB)), _at(301, grow)]
    trims = await process.run()
    assert trims[:6] == [5, 15, 35, 75, 135, 195]  # backed off to the longest wait
    assert 305 in trims, "grown since the last trim: trimmed at the next look"
    after = [t for t in trims if t > 305]
    # That trim gave 10 MiB back: the wait starts from 5 s again.
    assert after[:2] == [310, 320]


async def test_nothing_is_trimmed_near_the_floor() -> None:
    process = _Process(rss=50 * MIB, end=300)
    process.events.append(_at(1, lambda p: setattr(p, "rss", 57 * MIB)))  # 7 MiB: under the 8 MiB worth a trim
    assert await process.run() == []
