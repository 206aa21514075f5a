"""Fixtures of the socket lock's tests (host/socketlock.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy.host import unixsocket
from tests.unixsockets import Clock, LockWaits, lock_waits


@pytest.fixture
def waiting() -> Iterator[LockWaits]:
    with lock_waits() as waits:
        yield waits


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    loop = asyncio.get_running_loop()
    time = loop.time
    monkeypatch.setattr(loop, "time", lambda: time() + clock.ahead)
    return clock


@pytest.fixture
def tried(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set at each probe of a held path (a waiting claim's try): clear it, await the next."""
    event = asyncio.Event()
    is_stale = unixsocket.is_stale

    def probed(path: Path, timeout: float = unixsocket.PROBE_TIMEOUT) -> bool:
        event.set()
        return is_stale(path, timeout)

    monkeypatch.setattr(unixsocket, "is_stale", probed)
    return event
