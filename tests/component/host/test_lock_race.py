"""The races the socket path's lock closes (host/socketlock.py), each forced
into its worst interleaving.

* Two instances starting at once, in two processes: each is held right after
  its stale check until both have checked (without the lock) or one has and
  the other waits on the lock; then they bind. Exactly one serves; the other
  is refused naming the first's pid. Without the lock both binds go ahead: on
  the grpc path the later one may replace the first's socket (grpc's bind
  unlinks what is at the path), or fail, as the frames path's does, with
  EADDRINUSE and nobody named.
* An old instance stopping while a newer one starts: the old one is held
  between its listener's close and grpc's unlink of the path at its stop (its
  listener is shut, so connects get ECONNREFUSED as after a close, the file
  still there). The newer one must not bind before that stop is over, or the
  old one's stop unlinks the newer socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hooks import sdk
from hooks.sdk import HookServer
from runtimeproxy.config import ProxyConfig
from hooks.releasestep import RELEASE_STEP_TIMEOUT_S
from runtimeproxy.cripath.server import HOLD_LIMIT_S, SETTLE_AFTER_GRACE_S, STOP_PAST_GRACE_S, Proxy
from runtimeproxy.host import socketlock
from runtimeproxy.host.socketlock import lock_path

from ...unixsockets import lock_waits, recorded, stale_lock_holder, stale_socket, until_waiting
from .test_lock_release import proxy_at

PROJECT_ROOT = Path(__file__).resolve().parents[3]
CHILD_TIMEOUT = 60.0  # a racer process starting or stopping on a loaded machine: a bound on a hang, not a speed

# One racer. stdin: "go" (start), "bind" (go on past the stale check), "stop".
# stdout, one JSON object a line: prepared, waiting, serving, refused, stopped.
RACER = r"""
import asyncio, json, logging, sys
from pathlib import Path
from hooks.sdk import HookServer
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy
from runtimeproxy.host import unixsocket

which, data_path, path = sys.argv[1], sys.argv[2], Path(sys.argv[3])

def say(**event):
    print(json.dumps(event), flush=True)

class Waiting(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("socket path held by another instance"):
            say(waiting=True)

lock_log = logging.getLogger("runtimeproxy.host.socketlock")
lock_log.addHandler(Waiting())
lock_log.setLevel(logging.INFO)

remove_stale = unixsocket.remove_stale  # the stale check, under the lock

def prepare_then_hold(at, timeout=unixsocket.PROBE_TIMEOUT):
    remove_stale(at, timeout)
    say(prepared=True)
    sys.stdin.readline()  # "bind"

unixsocket.remove_stale = prepare_then_hold

async def main():
    if which == "proxy":
        server = Proxy(ProxyConfig(listen=path, backend=path.with_name("backend.sock"), data_path=data_path))
    else:
        server = HookServer(path, transport=data_path)
    sys.stdin.readline()  # "go"
    try:
        await server.start()
    except Exception as exc:
        say(refused=type(exc).__name__, message=str(exc))
        return
    say(serving=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "stop"
    await server.stop(0)
    say(stopped=True)

asyncio.run(main())
"""


class Racer:
    def __init__(self, proc: asyncio.subprocess.Process, events: asyncio.Queue[tuple[Racer, dict]]) -> None:
        self.proc = proc
        self.events: list[dict] = []
        self._reader = asyncio.ensure_future(self._read(events))

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _read(self, events: asyncio.Queue[tuple[Racer, dict]]) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            event = json.loads(line)
            self.events.append(event)
            await events.put((self, event))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())

    def saw(self, key: str) -> bool:
        return any(key in event for event in self.events)


@contextlib.asynccontextmanager
async def racers(which: str, data_path: str, path: Path) -> AsyncIterator[tuple[list[Racer], asyncio.Queue]]:
    events: asyncio.Queue[tuple[Racer, dict]] = asyncio.Queue()
    started: list[Racer] = []
    try:
        for _ in range(2):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", RACER, which, data_path, str(path),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=PROJECT_ROOT)  # fmt: skip
            started.append(Racer(proc, events))
        yield started, events
    finally:
        for racer in started:
            if racer.proc.returncode is None:
                racer.proc.kill()
            await racer.proc.wait()


async def next_event(events: asyncio.Queue[tuple[Racer, dict]]) -> tuple[Racer, dict]:
    try:
        return await asyncio.wait_for(events.get(), CHILD_TIMEOUT)
    except TimeoutError:
        pytest.fail(f"no racer said anything within {CHILD_TIMEOUT}s")


@pytest.mark.parametrize(("which", "data_path", "error"), [
    ("proxy", "grpc", "ListenError"), ("proxy", "frames", "ListenError"),
    ("sdk", "grpc", "HookServerError"), ("sdk", "frames", "HookServerError"),
])  # fmt: skip
async def test_two_instances_starting_at_once_one_serves_the_other_is_refused_naming_it(
    sock_dir: Path, which: str, data_path: str, error: str
) -> None:
    path = sock_dir / "race.sock"
    async with racers(which, data_path, path) as (both, events):
        for racer in both:
            racer.send("go")
        # Past the stale check: both (no lock), or one, the other waiting on its lock.
        while True:
            await next_event(events)
            prepared = [r for r in both if r.saw("prepared")]
            if len(prepared) == 2 or (prepared and any(r.saw("waiting") for r in both)):
                break
        for racer in prepared:
            racer.send("bind")
        while not all(r.saw("serving") or r.saw("refused") for r in both):
            await next_event(events)

        serving = [r for r in both if r.saw("serving")]
        assert len(serving) == 1, [r.events for r in both]
        (winner,) = serving
        (loser,) = [r for r in both if r is not winner]
        (refusal,) = [e for e in loser.events if "refused" in e]
        assert refusal["refused"] == error
        assert refusal["message"] == (f"{path} is in use by another process (pid {winner.pid}, holding "
                                      f"{lock_path(path)}); refusing to take it over")
        # Its pid, and how long its stop may take for one that waits for it.
        stop_s = (ProxyConfig().grace_period + STOP_PAST_GRACE_S if which == "proxy"
                  else 1.0 + sdk.STOP_PAST_GRACE_S + RELEASE_STEP_TIMEOUT_S)  # (its release step's bound too)
        assert recorded(lock_path(path)) == (winner.pid, stop_s)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # the winner's socket, still at the path

        winner.send("stop")
        while not winner.saw("stopped"):
            await next_event(events)
    assert sorted(p.name for p in sock_dir.iterdir()) == []  # its socket and its lock went with it


def shut_listener(path: Path) -> None:
    """Make the socket this process listens on at ``path`` refuse connections
    (ECONNREFUSED), its file left in place: grpc's stop at the moment its
    listener is closed and the path not yet unlinked."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # not a socket, or gone
        with sock:
            if (sock.family == socket.AF_UNIX and sock.getsockname() == str(path)
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                sock.shutdown(socket.SHUT_RD)  # for a unix listener: refuse every connect from now on
                return
    raise AssertionError(f"nothing in this process listens on {path}")


@pytest.mark.parametrize("which", ["proxy", "sdk"])
async def test_an_old_instance_stopping_does_not_unlink_a_newer_ones_socket(sock_dir: Path, which: str) -> None:
    path = sock_dir / "s.sock"

    def make() -> Proxy | HookServer:
        return proxy_at(path, "grpc") if which == "proxy" else HookServer(path, transport="grpc")

    old, new = make(), make()
    await old.start()
    shut_listener(path)  # old: its listener closed, grpc's stop not yet through
    with lock_waits() as waiting:
        starting = asyncio.ensure_future(new.start())
        waited = asyncio.ensure_future(waiting.wait())
        try:
            # The lock makes the new one wait; without it, it takes the path now.
            done, _ = await asyncio.wait([starting, waited], timeout=CHILD_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
            assert done, f"the new instance neither waited nor started within {CHILD_TIMEOUT}s"
            await old.stop(0)  # grpc unlinks the path it bound
            await starting
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(path))  # the new one serves at the path
        finally:
            waited.cancel()
            await asyncio.gather(waited, return_exceptions=True)
            await new.stop(0)


@pytest.mark.parametrize("grace", [10.0, 40.0])
async def test_a_proxy_waits_for_a_stopping_one_as_long_as_a_stop_with_its_grace_period_takes(
    fake_backend_path: Path, sock_dir: Path, grace: float
) -> None:
    # A stop takes up to the grace period, its held calls' time and the post
    # hooks' past the grace, and more: with a long grace period, more than
    # socketlock's own wait.
    path = sock_dir / "s.sock"
    old = await socketlock.claim(path)
    stale_socket(path)  # the old one stopping: not serving, its lock held
    new = Proxy(ProxyConfig(listen=path, backend=fake_backend_path, hook_dir=sock_dir / "hooks", grace_period=grace))
    with lock_waits() as waiting:
        starting = asyncio.ensure_future(new.start())
        try:
            await asyncio.wait_for(waiting.wait(), CHILD_TIMEOUT)
            (record,) = waiting.records
            assert record.wait_s >= max(socketlock.LOCK_WAIT_S, grace + HOLD_LIMIT_S + SETTLE_AFTER_GRACE_S)
            old.release()
            await starting
        finally:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            old.release()
            await new.stop(0)


async def test_a_proxy_waits_for_a_stopping_one_with_a_longer_grace_period_as_long_as_its_stop_takes(
    fake_backend_path: Path, sock_dir: Path
) -> None:
    # The old proxy (another process) has a grace period of 40 s, the new one
    # 10 s: the new one waits as long as the old one's stop may take, which
    # it recorded in its lock file; without that, 30 s, the old one still
    # stopping, and the new one failed.
    path = sock_dir / "s.sock"
    new = Proxy(ProxyConfig(listen=path, backend=fake_backend_path, hook_dir=sock_dir / "hooks", grace_period=10))
    async with stale_lock_holder(path, 40 + STOP_PAST_GRACE_S) as old:
        with lock_waits() as waiting:
            starting = asyncio.ensure_future(new.start())
            try:
                await until_waiting(waiting, starting, CHILD_TIMEOUT)
                (record,) = waiting.records
                assert (record.holder_pid, record.wait_from, record.own_wait_s) == (
                    old.pid, "holder", socketlock.LOCK_WAIT_S)
                assert record.wait_s == 40 + STOP_PAST_GRACE_S + socketlock.HOLDER_MARGIN_S
                assert old.stdin is not None
                old.stdin.close()  # its stop is over: it exits, and its lock goes
                await asyncio.wait_for(starting, CHILD_TIMEOUT)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                    client.connect(str(path))  # the new one serves at the path
            finally:
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                await new.stop(0)


@pytest.fixture
def fake_backend_path(sock_dir: Path) -> Path:
    """A backend nobody answers on: the proxy starts all the same (it probes in the background)."""
    return sock_dir / "backend.sock"


@pytest.mark.parametrize(("grace", "stop_s"), [(50, 50 + sdk.STOP_PAST_GRACE_S + RELEASE_STEP_TIMEOUT_S),
                                               (0, 1 + sdk.STOP_PAST_GRACE_S + RELEASE_STEP_TIMEOUT_S)])
async def test_a_hook_servers_stop_with_a_longer_grace_records_how_long_it_may_take(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, grace: float, stop_s: float
) -> None:
    # A server waiting for this one's stop waits by that record: the
    # constructor's grace (1 s) would let it give up 49 s early.
    path = sock_dir / "h.sock"
    server = HookServer(path, grace=1)
    await server.start()
    inner = server._server
    assert inner is not None
    stop = inner.stop
    begun, go_on = asyncio.Event(), asyncio.Event()

    async def held_stop(grace: float | None) -> None:
        begun.set()
        await go_on.wait()
        await stop(grace)

    monkeypatch.setattr(inner, "stop", held_stop)
    stopping = asyncio.ensure_future(server.stop(grace))
    try:
        await asyncio.wait_for(begun.wait(), CHILD_TIMEOUT)
        assert recorded(lock_path(path)) == (os.getpid(), stop_s)
    finally:
        go_on.set()
        await asyncio.wait_for(stopping, CHILD_TIMEOUT)
    assert not lock_path(path).exists()
