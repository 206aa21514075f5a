"""A claim waiting under systemd (host/socketlock.py): its start timeout
extended, its status said."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy.host import socketlock
from runtimeproxy.host.socketlock import SocketInUse
from tests.unixsockets import Clock, LockWaits, waiting_claim


@pytest.fixture
def systemd(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """The manager's notify socket, NOTIFY_SOCKET naming it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(sock_dir / "notify.sock"))
        manager.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", str(sock_dir / "notify.sock"))
        yield manager


async def told(systemd: socket.socket) -> list[str]:
    """The next message's lines."""
    return (await asyncio.wait_for(asyncio.get_running_loop().sock_recv(systemd, 4096), 10)).decode().split("\n")


def extended_s(line: str) -> float:
    key, _, usec = line.partition("=")
    assert key == "EXTEND_TIMEOUT_USEC"
    return int(usec) / 1e6


async def test_under_systemd_a_waiting_start_extends_its_start_timeout_and_says_why(
    sock_dir: Path, waiting: LockWaits, systemd: socket.socket
) -> None:
    # The hook unit has systemd's default TimeoutStartSec (90 s): a wait of
    # 301 s would be killed as a failed start.
    path = sock_dir / "s.sock"
    async with waiting_claim(path, waiting, stop_s=300, wait_s=0) as (old, new):
        extend, status = await told(systemd)
        assert status == f"STATUS=waiting for pid {os.getpid()} to let go of {path}"
        assert 300 + socketlock.HOLDER_MARGIN_S < extended_s(extend) <= 301 + socketlock.EXTEND_MARGIN_S
        old.release()
        lock = await asyncio.wait_for(new, 10)
        lock.release()
        assert await told(systemd) == ["STATUS="]  # said no more


@pytest.mark.parametrize("end", ["cancelled", "refused"])
async def test_a_wait_ended_otherwise_clears_its_status(
    sock_dir: Path, waiting: LockWaits, systemd: socket.socket, clock: Clock, end: str
) -> None:
    # A stop signal cancels it, or the holder outlasts it: `systemctl status`
    # went on saying it waited.
    path = sock_dir / "s.sock"
    async with waiting_claim(path, waiting, stop_s=300, wait_s=0) as (_, new):
        assert (await told(systemd))[1].startswith("STATUS=waiting for")
        if end == "cancelled":
            new.cancel()
        else:
            clock.ahead = 400
        with pytest.raises(asyncio.CancelledError if end == "cancelled" else SocketInUse):
            await asyncio.wait_for(new, 10)
        assert await told(systemd) == ["STATUS="]


async def test_a_waiters_own_bound_of_any_length_extends_the_start_timeout_by_at_most_the_ceiling(
    sock_dir: Path, waiting: LockWaits, systemd: socket.socket
) -> None:
    # A grace period of 1e300 s: (1e300 + 30) * 1e6 µs, far past what
    # systemd reads (an unsigned 64-bit number), and no start takes so long.
    async with waiting_claim(sock_dir / "s.sock", waiting, wait_s=1e300):
        extend, _ = await told(systemd)
        assert extended_s(extend) == pytest.approx(socketlock.MAX_WAIT_S + socketlock.EXTEND_MARGIN_S, abs=0.001)
