"""A client that opens calls and never reads the answers holds a bounded
share of the proxy, and gives it all back when its connection closes."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..fakes import FakeBackend
from ..rawh2 import SlowReader

VERSION = "/runtime.v1.RuntimeService/Version"
LIST = "/runtime.v1.RuntimeService/ListContainers"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def until(check: Callable[[], bool], timeout: float, every: float = 0.25) -> bool:
    """Poll ``check`` (resident memory has no event to await) until true or timeout."""
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - resident memory has no event; bounded
            await asyncio.sleep(every)
    return True


async def calls(channel: aio.Channel, path: str, count: int) -> None:
    await asyncio.gather(*(channel.unary_unary(path)(b"", timeout=30) for _ in range(count)))


@pytest.fixture
async def proxy_process(fake: FakeBackend, sock_dir: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, Path, Path]]:
    """``runtime-proxy serve`` in front of ``fake``, answering; its log in a file."""
    listen, log = sock_dir / "proxy.sock", sock_dir / "proxy.log"
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtimeproxy.cli", "serve",
            "--listen", str(listen), "--backend", str(fake.socket), "--hook-dir", str(sock_dir / "hooks"),
            stderr=stderr,
        )
    try:
        async with aio.insecure_channel(f"unix://{listen}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True)
            async for answer in watch:
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            watch.cancel()
        yield process, listen, log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_connection_that_never_reads_is_bounded_and_released_on_close(fake, proxy_process) -> None:
    process, listen, log = proxy_process
    async with aio.insecure_channel(f"unix://{listen}") as client:
        # The baseline includes what serving 1,000 calls at once takes (grpc's
        # own tables grow to the peak): what must not stay is the slow client's.
        for _ in range(2):
            await calls(client, VERSION, 1000)
        await asyncio.sleep(6)  # one pass of the memory release (limits.TRIM_INTERVAL_S)
        baseline = rss_mib(process.pid)

        slow = await SlowReader.connect(listen)
        for _ in range(20):
            await slow.open_calls(LIST, 100)  # 2,000 calls; their answers are never read
        await fake.wait_calls(LIST, 1000, timeout=60)
        during = rss_mib(process.pid)
        await calls(client, VERSION, 10)  # another client is served meanwhile
        # The connection may hold 1,000 calls (max-concurrent-streams; grpc
        # core counts a stream or so loosely); the rest were refused.
        assert len(fake.calls(LIST)) < 1050

        await slow.close()
        # Before the fix it stayed near its high-water mark (about 2x); a
        # first hostile connection leaves some 8-10 MiB in grpc's arenas.
        bound = baseline * 1.25
        try:
            await until(lambda: rss_mib(process.pid) <= bound, timeout=30)
        except TimeoutError:
            pytest.fail(
                f"RSS {rss_mib(process.pid):.1f} MiB after the slow client left; "
                f"baseline {baseline:.1f}, with it {during:.1f}, bound {bound:.1f}"
            )
        await calls(client, VERSION, 10)  # and served after
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert " error " not in text, text[-3000:]


async def test_calls_of_a_closed_connection_end_with_their_backend_calls(fake, start_proxy, sock_dir) -> None:
    """No relay outlives its client: the backend calls it made are cancelled
    and the proxy's tasks go back to what they were."""
    fake.script(LIST, hang=True)  # the runtime never answers these
    await start_proxy(fake.socket)
    idle_tasks = len(asyncio.all_tasks())
    slow = await SlowReader.connect(sock_dir / "proxy.sock")
    await slow.open_calls(LIST, 200)
    await fake.wait_calls(LIST, 200, timeout=30)
    assert len(asyncio.all_tasks()) > idle_tasks + 200
    await slow.close()
    await until(lambda: fake.cancelled.count(LIST) == 200, timeout=30)
    await until(lambda: len(asyncio.all_tasks()) <= idle_tasks, timeout=30)
