"""Issue 12: socket activation. The test holds the listening socket like
systemd; the proxy serves on it, and a restart costs no call."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc import aio

from runtimeproxy.cripath.activation import inherited_socket

from ...sockact import HeldSocket
from ..fakes import FakeBackend

LIST_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"


@pytest.fixture
def held(sock_dir: Path) -> AsyncIterator[HeldSocket]:
    socket = HeldSocket(sock_dir / "proxy.sock")
    yield socket
    socket.close()


class ServeProcess:
    def __init__(self, argv: list[str], pass_fds: tuple[int, ...], log: Path) -> None:
        self.argv, self.pass_fds, self.log = argv, pass_fds, log
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, pass_fds=self.pass_fds, stdout=log, stderr=log
            )

    async def stop(self) -> int:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), 30)


def serve_argv(held: HeldSocket, fake: FakeBackend, sock_dir: Path, *flags: str) -> list[str]:
    (sock_dir / "hooks").mkdir(mode=0o755, exist_ok=True)
    return held.wrap([
        sys.executable, "-m", "runtimeproxy", "serve", "--listen", str(held.path), "--backend", str(fake.socket),
        "--hook-dir", str(sock_dir / "hooks"), "--log-format", "json", *flags,
    ])


# uvloop starts reading an accepted connection right after connection_made,
# whatever connection_made asked for: bytes can arrive before the relay is linked.
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_serves_on_the_inherited_socket_and_leaves_it_to_systemd(
    fake: FakeBackend, sock_dir: Path, held: HeldSocket, loop: str
) -> None:
    argv = serve_argv(held, fake, sock_dir, "--event-loop", loop)
    proxy = ServeProcess(argv, held.pass_fds, sock_dir / "proxy.log")
    await proxy.start()
    try:
        async with aio.insecure_channel(f"unix://{held.path}") as channel:
            await channel.unary_unary(LIST_PODS)(b"", timeout=20)  # waits in the backlog until the proxy accepts
        private = sock_dir / ".proxy.sock.private"
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
        assert [p.name for p in private.iterdir()] == [f"{proxy.process.pid}.sock"]  # type: ignore[union-attr]
    finally:
        assert await proxy.stop() == 0
    assert stat.S_ISSOCK(os.lstat(held.path).st_mode)  # systemd's socket stays
    assert list(private.iterdir()) == []  # its own private one is gone
    log = proxy.log.read_text()
    assert '"msg": "accepting on the socket from systemd"' in log
    assert '"level": "warning"' not in log, log


async def test_a_restart_costs_no_call(fake: FakeBackend, sock_dir: Path, held: HeldSocket) -> None:
    """Calls go on at a steady pace over one channel while the proxy is
    restarted: each is answered OK (the backlog holds the new connection
    until the next instance accepts it, once its backend is probed)."""
    argv = serve_argv(held, fake, sock_dir)
    first = ServeProcess(argv, held.pass_fds, sock_dir / "first.log")
    second = ServeProcess(argv, held.pass_fds, sock_dir / "second.log")
    await first.start()
    outcomes: list[str] = []
    stop = asyncio.Event()

    async def load(channel: aio.Channel) -> None:
        call = channel.unary_unary(LIST_PODS)
        while not stop.is_set():
            try:
                await call(b"", timeout=30)
                outcomes.append("OK")
            except aio.AioRpcError as err:
                outcomes.append(f"{err.code().name}: {err.details()}")
            await asyncio.sleep(0.005)

    async with aio.insecure_channel(f"unix://{held.path}") as channel:
        clients = [asyncio.ensure_future(load(channel)) for _ in range(4)]
        try:
            await fake.wait_calls(LIST_PODS, 20, timeout=30)
            assert await first.stop() == 0
            await second.start()
            served = len(fake.calls(LIST_PODS))
            await fake.wait_calls(LIST_PODS, served + 20, timeout=30)
        finally:
            stop.set()
            await asyncio.gather(*clients)
            await second.stop()
    assert outcomes and set(outcomes) == {"OK"}, [o for o in outcomes if o != "OK"]


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_a_closed_connection_leaves_no_descriptor(
    fake: FakeBackend, sock_dir: Path, held: HeldSocket, data_path: str
) -> None:
    """A client's close reaches both relayed sockets: a crictl call every few
    seconds must not cost the proxy two descriptors each until its restart."""
    proxy = ServeProcess(serve_argv(held, fake, sock_dir, "--data-path", data_path), held.pass_fds,
                         sock_dir / "proxy.log")
    await proxy.start()

    async def one_call() -> None:
        async with aio.insecure_channel(f"unix://{held.path}") as channel:
            await channel.unary_unary(LIST_PODS)(b"", timeout=20)

    try:
        await one_call()
        assert proxy.process is not None
        fds = Path(f"/proc/{proxy.process.pid}/fd")
        baseline = await _settled_count(fds)
        for _ in range(CONNECTIONS):
            await one_call()
        # The closes travel through the relay and grpc: no event to await from here.
        assert await _settled_count(fds) <= baseline + 2
    finally:
        assert await proxy.stop() == 0


CONNECTIONS = 30


async def _settled_count(fds: Path, timeout: float = 10.0) -> int:
    """The process's descriptor count once it stopped falling (at most ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    count = len(os.listdir(fds))
    while loop.time() < deadline:
        await asyncio.sleep(0.2)
        now = len(os.listdir(fds))
        if now >= count:
            return now
        count = now
    return count


def test_listen_fds_for_another_process_is_ignored_and_cleared() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x"}
    assert inherited_socket(env) is None
    assert env == {}
    assert inherited_socket({}) is None
