"""Issue 12: `serve` tells systemd when it is ready, what it serves, that it
is alive and that it stops, on the NOTIFY_SOCKET the test provides."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hooks.sdk import write_hook_config
from runtimeproxy.host import sdnotify

from ..fakes import FakeBackend


class NotifySocket:
    """What systemd does: a datagram socket whose messages we read in order."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.messages: list[str] = []

    async def until(self, wanted: str, timeout: float = 20) -> str:
        """The next message with a line starting with ``wanted``."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while True:
                message = (await loop.sock_recv(self.sock, 4096)).decode()
                self.messages.append(message)
                if any(line.startswith(wanted) for line in message.split("\n")):
                    return message


@pytest.fixture
async def notify(sock_dir: Path) -> AsyncIterator[NotifySocket]:
    ns = NotifySocket(sock_dir / "notify.sock")
    yield ns
    ns.sock.close()


async def test_ready_status_watchdog_and_stopping(fake: FakeBackend, sock_dir: Path, notify: NotifySocket) -> None:
    hook_dir = sock_dir / "hooks.d"
    hook_dir.mkdir(mode=0o755)
    listen = sock_dir / "proxy.sock"
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_dir / "notify.sock"), "WATCHDOG_USEC": "200000"}
    env.pop("WATCHDOG_PID", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "serve",
        "--listen", str(listen), "--backend", str(fake.socket), "--hook-dir", str(hook_dir),
        env=env, stderr=asyncio.subprocess.PIPE,
    )
    try:
        ready = await notify.until("READY=1")
        assert listen.exists()  # listening before READY
        assert fake.calls("/runtime.v1.RuntimeService/Version")  # and probed
        assert "STATUS=serving CRI v1 (native), v1alpha2 (native) for fake 1.0; 0 hook servers" in ready.split("\n")
        await notify.until("WATCHDOG=1")
        await notify.until("WATCHDOG=1")  # pinged again
        write_hook_config(hook_dir, "quota", sock_dir / "quota.sock", ["PreCreateContainer"], "Ignore", "1s")
        changed = await notify.until("STATUS=")
        assert changed == "STATUS=serving CRI v1 (native), v1alpha2 (native) for fake 1.0; 1 hook server"
        process.send_signal(signal.SIGTERM)
        stopping = await notify.until("STOPPING=1")
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert stopping.startswith("STOPPING=1")
    assert sum(m.startswith("READY=1") for m in notify.messages) == 1


async def test_status_follows_the_backend(fake: FakeBackend, sock_dir: Path, notify: NotifySocket) -> None:
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_dir / "notify.sock")}
    env.pop("WATCHDOG_USEC", None)
    await fake.stop()  # not there yet: no READY until it answers
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runtimeproxy", "serve",
        "--listen", str(sock_dir / "proxy.sock"), "--backend", str(fake.socket), "--hook-dir", str(sock_dir / "none"),
        env=env, stderr=asyncio.subprocess.PIPE,
    )
    try:
        first = await notify.until("STATUS=")
        assert first.startswith("STATUS=waiting for the backend runtime at ")
        await fake.start()
        ready = await notify.until("READY=1")
        assert "serving CRI" in ready
        await fake.stop()
        lost = await notify.until("STATUS=")
        assert "unreachable" in lost
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 20)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert not any(m.startswith("WATCHDOG") for m in notify.messages)


def test_abstract_socket_and_watchdog_interval() -> None:
    name = f"runtime-proxy-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(100) == b"READY=1"
    assert not sdnotify.notify("READY=1", {})
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval({}) is None
