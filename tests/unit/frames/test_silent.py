"""frames/silent.py: the bound on a runtime's silence is armed only while
its SETTINGS have not come."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from runtimeproxy.frames import silent


async def test_no_bound_once_the_runtimes_settings_came() -> None:
    """The backend's attach, just before the bound, may deliver the SETTINGS
    the runtime sent while it was dialled: nothing is left to wait for
    (before: a timer was armed, and held until the connection ended)."""
    told: list[str] = []
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn = SimpleNamespace(prefaced=True, closed=closed, settings_wait=None)
    silent.bound(conn, Path("/run/containerd/containerd.sock"), lambda reason: bool(told.append(reason)))  # type: ignore[arg-type]
    assert conn.settings_wait is None and told == []


async def test_a_connection_whose_runtime_said_nothing_yet_is_bounded() -> None:
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn = SimpleNamespace(prefaced=False, closed=closed, settings_wait=None)
    silent.bound(conn, Path("/run/containerd/containerd.sock"), lambda reason: True)  # type: ignore[arg-type]
    timer = conn.settings_wait
    assert isinstance(timer, asyncio.TimerHandle) and not timer.cancelled()
    closed.set_result(None)
    await asyncio.sleep(0)  # the done callback runs in the next loop turn
    assert timer.cancelled()
