"""A claim waiting under systemd (host/socketlock.py): its start timeout
extended, its status said."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from runtimeproxy.host import socketlock
from runtimeproxy.host.socketlock import claim
from tests.unixsockets import LockWaits, stale_socket, until_waiting


async def test_under_systemd_a_waiting_start_extends_its_start_timeout_and_says_why(
    sock_dir: Path, waiting: LockWaits, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hook unit has systemd's default TimeoutStartSec (90 s): a wait of
    # 301 s would be killed as a failed start.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(sock_dir / "notify.sock"))
        systemd.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", str(sock_dir / "notify.sock"))
        path = sock_dir / "s.sock"
        old = await claim(path, stop_s=300)
        stale_socket(path)
        new = asyncio.ensure_future(claim(path, wait_s=0))
        try:
            await until_waiting(waiting, new)
            loop = asyncio.get_running_loop()
            extend, status = (await asyncio.wait_for(loop.sock_recv(systemd, 4096), 10)).decode().split("\n")
            assert status == f"STATUS=waiting for pid {os.getpid()} to let go of {path}"
            key, _, usec = extend.partition("=")
            assert key == "EXTEND_TIMEOUT_USEC"
            assert 300 + socketlock.HOLDER_MARGIN_S < int(usec) / 1e6 <= 301 + socketlock.EXTEND_MARGIN_S
            old.release()
            lock = await asyncio.wait_for(new, 10)
            lock.release()
            assert (await asyncio.wait_for(loop.sock_recv(systemd, 4096), 10)) == b"STATUS="  # said no more
        finally:
            old.release()
            new.cancel()
            await asyncio.gather(new, return_exceptions=True)
