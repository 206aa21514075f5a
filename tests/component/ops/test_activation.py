"""Issue 12: socket activation. The test holds the listening socket like
systemd; the proxy serves on it, and a restart costs no call."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import struct
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from grpc import aio

from runtimeproxy.cripath.activation import inherited_socket

from ...sockact import HeldSocket
from .. import rawh2
from ..fakes import FakeBackend

LIST_PODS = "/runtime.v1.RuntimeService/ListPodSandbox"
# A call the proxy never makes itself (its start-up reads list pods and containers).
STATS = "/runtime.v1.RuntimeService/ListPodSandboxStats"
RST_STREAM, PING, GOAWAY, WINDOW_UPDATE = 0x3, 0x6, 0x7, 0x8  # frame types rawh2 does not name
REFUSED_STREAM = 0x7
CALLS = 16  # answered during a shutdown


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
@pytest.mark.parametrize(("loop", "data_path"), [("asyncio", "grpc"), ("uvloop", "grpc"), ("asyncio", "frames"),
                                                 ("uvloop", "frames")])
async def test_serves_on_the_inherited_socket_and_leaves_it_to_systemd(
    fake: FakeBackend, sock_dir: Path, held: HeldSocket, loop: str, data_path: str
) -> None:
    """On the grpc path a relay feeds grpc on a private socket (cripath/activation.py);
    the frames path serves the socket itself, with no relay and no private socket."""
    argv = serve_argv(held, fake, sock_dir, "--event-loop", loop, "--data-path", data_path)
    proxy = ServeProcess(argv, held.pass_fds, sock_dir / "proxy.log")
    await proxy.start()
    private = sock_dir / ".proxy.sock.private"
    try:
        async with aio.insecure_channel(f"unix://{held.path}") as channel:
            await channel.unary_unary(LIST_PODS)(b"", timeout=20)  # waits in the backlog until the proxy accepts
        if data_path == "grpc":
            assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
            assert [p.name for p in private.iterdir()] == [f"{proxy.process.pid}.sock"]  # type: ignore[union-attr]
        else:
            assert not private.exists()
    finally:
        assert await proxy.stop() == 0
    assert stat.S_ISSOCK(os.lstat(held.path).st_mode)  # systemd's socket stays
    assert not private.exists() or list(private.iterdir()) == []  # a private one is gone
    log = proxy.log.read_text()
    assert '"msg": "accepting on the socket from systemd"' in log
    assert '"msg": "stopped accepting; new connections wait in the backlog"' in log
    assert '"level": "warning"' not in log, log


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_a_restart_costs_no_call(fake: FakeBackend, sock_dir: Path, held: HeldSocket, data_path: str) -> None:
    """Calls go on at a steady pace over one channel while the proxy is
    restarted: each is answered OK (the backlog holds the new connection
    until the next instance accepts it, once its backend is probed)."""
    argv = serve_argv(held, fake, sock_dir, "--data-path", data_path)
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
        assert await _count_down_to(fds, baseline + 2) <= baseline + 2
    finally:
        assert await proxy.stop() == 0


CONNECTIONS = 30


async def _settled_count(fds: Path, timeout: float = 10.0, samples: int = 5) -> int:
    """The process's descriptor count once it held still for ``samples``
    samples in a row (at most ``timeout``): a process not scheduled between
    two samples leaves its count unchanged without having settled."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    count, same = len(os.listdir(fds)), 0
    while loop.time() < deadline and same < samples:
        await asyncio.sleep(0.1)
        now = len(os.listdir(fds))
        same = same + 1 if now == count else 0
        count = now
    return count


async def _count_down_to(fds: Path, limit: int, timeout: float = 10.0) -> int:
    """The process's descriptor count once it fell to ``limit`` (at most ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    count = len(os.listdir(fds))
    while count > limit and loop.time() < deadline:
        await asyncio.sleep(0.1)
        count = len(os.listdir(fds))
    return count


def test_listen_fds_for_another_process_is_ignored_and_cleared() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x"}
    assert inherited_socket(env) is None
    assert env == {}
    assert inherited_socket({}) is None


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_a_call_crossing_the_shutdown_is_refused_for_a_retry(
    fake: FakeBackend, sock_dir: Path, held: HeldSocket, data_path: str
) -> None:
    """A call the client sent before it read the shutdown's GOAWAY must be
    one it may retry on the next instance: refused (RST_STREAM
    REFUSED_STREAM), or above the last stream id of a GOAWAY. grpc core would
    take it and cancel it (CANCELLED, which kubelet does not retry); a raw
    client sends it right after the first GOAWAY, where that race lands."""
    proxy = ServeProcess(serve_argv(held, fake, sock_dir, "--data-path", data_path), held.pass_fds,
                         sock_dir / "proxy.log")
    await proxy.start()
    reader, writer = await asyncio.open_unix_connection(str(held.path))
    try:
        writer.write(rawh2.PREFACE + rawh2.frame(rawh2.SETTINGS, 0, 0, b""))
        writer.write(rawh2.grpc_call(1, STATS))
        await _frames_until(reader, writer, lambda kind, flags, sid, _: sid == 1 and kind == rawh2.HEADERS
                            and bool(flags & rawh2.END_STREAM))
        served = len(fake.calls(STATS))
        assert proxy.process is not None
        proxy.process.send_signal(signal.SIGTERM)
        goaways: list[int] = []

        def goaway(kind: int, flags: int, sid: int, payload: bytes) -> bool:
            if kind == GOAWAY:
                goaways.append(int.from_bytes(payload[:4], "big") & 0x7FFFFFFF)
            return kind == GOAWAY

        await _frames_until(reader, writer, goaway)
        writer.write(rawh2.grpc_call(3, STATS))  # as if sent just before the GOAWAY was read
        answers: list[tuple[int, int, bytes]] = []

        def stream_3(kind: int, flags: int, sid: int, payload: bytes) -> bool:
            goaway(kind, flags, sid, payload)
            if sid == 3:
                answers.append((kind, flags, payload))
            return kind == RST_STREAM and sid == 3

        await _frames_until(reader, writer, stream_3, until_closed=True)
    finally:
        writer.close()
        assert await proxy.stop() == 0
    refused = (RST_STREAM, 0, REFUSED_STREAM.to_bytes(4, "big")) in answers
    assert refused or min(goaways) < 3, (goaways, answers)
    assert goaways == sorted(goaways, reverse=True)  # a later GOAWAY never names a higher stream
    assert served == 1 and len(fake.calls(STATS)) == 1  # stream 3 never reached the runtime


async def _frames_until(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, done: Callable[
        [int, int, int, bytes], bool], until_closed: bool = False, timeout: float = 20.0) -> None:
    """Read frames (acknowledging SETTINGS and PING) until ``done`` says so, or
    the server closes the connection (allowed with ``until_closed``)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                head = await reader.readexactly(9)
                payload = await reader.readexactly(int.from_bytes(head[:3], "big"))
            except asyncio.IncompleteReadError:
                assert until_closed, "the server closed the connection"
                return
            kind, flags, sid = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            if kind == rawh2.SETTINGS and not flags & rawh2.ACK:
                writer.write(rawh2.frame(rawh2.SETTINGS, rawh2.ACK, 0, b""))
            elif kind == PING and not flags & rawh2.ACK:
                writer.write(rawh2.frame(PING, rawh2.ACK, 0, payload))
            if done(kind, flags, sid, payload):
                return


@pytest.mark.parametrize("data_path", ["frames", "grpc"])
async def test_answers_given_during_the_shutdown_reach_the_client_whole(
    fake: FakeBackend, sock_dir: Path, held: HeldSocket, data_path: str
) -> None:
    """Calls the runtime answers once the shutdown has begun (after the
    GOAWAY): their whole answers reach the client before the connection
    closes (the relay closed it as soon as grpc was done with the calls,
    answers still on their way included)."""
    answer = bytes(range(256)) * 256  # 64 KiB each
    fake.script(STATS, hang=True, response=answer)
    proxy = ServeProcess(serve_argv(held, fake, sock_dir, "--data-path", data_path), held.pass_fds,
                         sock_dir / "proxy.log")
    await proxy.start()
    reader, writer = await asyncio.open_unix_connection(str(held.path))
    streams = range(1, 2 * CALLS, 2)
    try:
        wide = 1 << 24  # every answer fits the windows: the client need not grant more
        writer.write(rawh2.PREFACE + rawh2.frame(rawh2.SETTINGS, 0, 0, struct.pack(">HI", 4, wide))
                     + rawh2.frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", wide)))
        writer.write(b"".join(rawh2.grpc_call(sid, STATS) for sid in streams))
        await fake.wait_calls(STATS, CALLS, timeout=20)
        assert proxy.process is not None
        proxy.process.send_signal(signal.SIGTERM)
        await _frames_until(reader, writer, lambda kind, flags, sid, _: kind == GOAWAY)
        fake.scripts[STATS].release.set()
        bodies: dict[int, bytearray] = {sid: bytearray() for sid in streams}
        ended: set[int] = set()

        def answered(kind: int, flags: int, sid: int, payload: bytes) -> bool:
            if kind == rawh2.DATA:
                bodies[sid].extend(payload)
            if kind == rawh2.HEADERS and flags & rawh2.END_STREAM:
                ended.add(sid)
            return len(ended) == CALLS

        await _frames_until(reader, writer, answered)
    finally:
        writer.close()
        assert await proxy.stop() == 0
    assert {sid: bytes(body) for sid, body in bodies.items()} == {
        sid: b"\x00" + len(answer).to_bytes(4, "big") + answer for sid in streams}
