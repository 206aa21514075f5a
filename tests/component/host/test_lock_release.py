"""The socket path's lock (host/socketlock.py) goes however a start or a stop
ends: a stop that raises or is cut short (a caller's timeout), a start that
fails or is cancelled once it listens. Else the lock stayed held until the
process exited: a second stop did nothing (the server was gone), and a new
instance on the path waited, then failed naming this process's pid. A start
cancelled as grpc starts: test_cancelled_start.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hooks.balloons.config import parse_config
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology
from hooks.sdk import HookServer
from runtimeproxy.config import ProxyConfig
from runtimeproxy.cripath.server import Proxy
from runtimeproxy.host.socketlock import SocketInUse, claim, lock_path

from ...unit.balloons.test_server import CONFIG, FakeRuntime

ENDINGS = ["cancelled", "raising"]


class Failed(Exception):
    """What a step made to fail raises."""


def cut_short(
    real: Callable[..., Awaitable[Any]], ending: str, entered: asyncio.Event, before: bool = False
) -> Callable[..., Awaitable[Any]]:
    """``real`` (not with ``before``), then: never done (cancelled by the
    test), or raising; on its first call: the calls after it are ``real``'s."""
    calls = 0

    async def step(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:
            return await real(*args)
        if not before:
            await real(*args)
        entered.set()
        if ending == "raising":
            raise Failed
        await asyncio.Event().wait()

    return step


async def end(task: asyncio.Future[Any], ending: str, entered: asyncio.Event) -> None:
    """Let ``task`` reach the step made to fail, end it so, and see it fail."""
    await entered.wait()
    if ending == "cancelled":
        task.cancel()
    with pytest.raises(asyncio.CancelledError if ending == "cancelled" else Failed):
        await task


async def assert_path_free(*paths: Path) -> None:
    """Nothing at each path nor its lock; a claim takes it at once."""
    for path in paths:
        assert not path.exists() and not lock_path(path).exists(), sorted(p.name for p in path.parent.iterdir())
        (await claim(path, wait_s=0)).release()


async def assert_serves(path: Path) -> None:
    _, writer = await asyncio.open_unix_connection(str(path))
    writer.close()


def proxy_at(path: Path, data_path: str) -> Proxy:
    # A backend nobody answers on: the proxy starts all the same (it probes in the background).
    return Proxy(ProxyConfig(listen=path, backend=path.with_name("backend.sock"), hook_dir=path.with_name("hooks"),
                             data_path=data_path))


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("data_path", ["grpc", "frames"])
async def test_a_proxy_stop_cut_short_lets_the_path_go(sock_dir: Path, data_path: str, ending: str) -> None:
    path = sock_dir / "p.sock"
    proxy = proxy_at(path, data_path)
    await proxy.start()
    entered = asyncio.Event()
    proxy.backend.close = cut_short(proxy.backend.close, ending, entered)  # type: ignore[method-assign]  # its last step
    await end(asyncio.ensure_future(proxy.stop(0)), ending, entered)
    await assert_path_free(path)


@pytest.mark.parametrize("ending", ENDINGS)
async def test_a_proxy_stop_cut_short_before_grpcs_stop_stops_grpc_before_letting_the_path_go(
    sock_dir: Path, ending: str
) -> None:
    # Else grpc's server ran on; its shutdown, when it came (a second stop, its
    # __del__), unlinked the path by name: the socket of the proxy after it.
    path = sock_dir / "p.sock"
    proxy = proxy_at(path, "grpc")
    await proxy.start()
    entered = asyncio.Event()
    proxy.health.end_watches = cut_short(proxy.health.end_watches, ending, entered)  # type: ignore[method-assign]
    await end(asyncio.ensure_future(proxy.stop(0)), ending, entered)
    await assert_path_free(path)
    newer = proxy_at(path, "grpc")
    await newer.start()
    try:
        await proxy.server.stop(None)  # the first's shutdown, however late it comes
        await assert_serves(path)
    finally:
        await newer.stop(0)
        await proxy.stop(0)  # the rest of the first's stop (its tasks, its backend channels)


@pytest.mark.parametrize("data_path", ["grpc", "frames"])
async def test_a_proxy_start_failing_after_its_bind_stops_it_and_lets_the_path_go(
    sock_dir: Path, data_path: str
) -> None:
    path = sock_dir / "p.sock"
    proxy = proxy_at(path, data_path)
    entered = asyncio.Event()
    proxy._set_health = cut_short(proxy._set_health, "raising", entered)  # type: ignore[method-assign]  # after _listen
    await end(asyncio.ensure_future(proxy.start()), "raising", entered)
    await assert_path_free(path)


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("transport", ["grpc", "frames"])
async def test_a_hook_server_stop_cut_short_lets_the_path_go(sock_dir: Path, transport: str, ending: str) -> None:
    path = sock_dir / "h.sock"
    hook = HookServer(path, transport=transport)
    await hook.start()
    entered = asyncio.Event()
    hook._server.stop = cut_short(hook._server.stop, ending, entered)  # type: ignore[union-attr]
    await end(asyncio.ensure_future(hook.stop(5)), ending, entered)
    await assert_path_free(path)
    await hook.stop()  # a second stop: nothing left to do


@pytest.mark.parametrize("ending", ENDINGS)
async def test_a_hook_server_stop_cut_short_before_grpcs_stop_stops_grpc_before_letting_the_path_go(
    sock_dir: Path, ending: str
) -> None:
    path = sock_dir / "h.sock"
    hook = HookServer(path, transport="grpc")
    await hook.start()
    server = hook._server
    assert server is not None
    entered = asyncio.Event()
    real_stop = server.stop
    server.stop = cut_short(real_stop, ending, entered, before=True)  # type: ignore[method-assign]
    await end(asyncio.ensure_future(hook.stop(5)), ending, entered)
    await assert_path_free(path)
    async with HookServer(path, transport="grpc"):
        await real_stop(None)  # the first's shutdown, however late it comes
        await assert_serves(path)


async def test_a_hook_server_that_cannot_stop_keeps_its_path_locked(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = sock_dir / "h.sock"
    hook = HookServer(path, transport="grpc")
    await hook.start()
    server, lock = hook._server, hook._path_lock
    assert server is not None and lock is not None
    real_stop = server.stop

    async def cannot_stop(grace: float | None) -> None:
        raise Failed

    server.stop = cannot_stop  # type: ignore[method-assign]
    with pytest.raises(Failed):
        await hook.stop()
    try:
        assert "server not stopped; its socket path stays locked" in caplog.text
        with pytest.raises(SocketInUse, match="in use by another process"):  # its server still answers
            await claim(path, wait_s=0)
    finally:
        await real_stop(None)
        lock.release()
    await assert_path_free(path)


@pytest.mark.parametrize("ending", ENDINGS)
async def test_balloons_stop_cut_short_on_its_status_socket_lets_both_paths_go(sock_dir: Path, ending: str) -> None:
    hook = BalloonsHook(str(sock_dir / "b.sock"), parse_config(CONFIG), topology=Topology.synthetic(1, 1, 8, 1),
                        runtime=FakeRuntime())
    await hook.start()
    entered = asyncio.Event()
    status_server = hook._status._server
    assert status_server is not None
    status_server.wait_closed = cut_short(status_server.wait_closed, ending, entered)  # type: ignore[method-assign]
    await end(asyncio.ensure_future(hook.stop(0)), ending, entered)
    await assert_path_free(Path(hook.socket_path), hook.status_socket)
