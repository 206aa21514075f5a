"""A start cancelled at grpc.aio's own start (its one await: the serving
task it has just created has not taken its first step) ends cancelled, its
server stopped and its socket path free. Cancelled in the caller's task,
grpc's start had the future it awaits cancelled: the serving task's
set_result raised InvalidStateError, which the stop that followed re-raised
in place of the CancelledError (serve: "fatal", exit 1 instead of 0).
And balloons' status socket (asyncio's server), cancelled as it starts serving."""

from __future__ import annotations

import asyncio
import os
import stat
from asyncio import base_events
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from hooks.balloons.status import StatusServer
from hooks.sdk import HookServer

from ...grpcstarts import cancelling_as_grpc_starts
from .test_lock_release import assert_path_free, proxy_at


def proxy_start(path: Path, servers: list[grpc.aio.Server]) -> Awaitable[None]:
    proxy = proxy_at(path, "grpc")
    servers.append(proxy.server)
    return proxy.start()


def hook_start(path: Path, servers: list[grpc.aio.Server], monkeypatch: pytest.MonkeyPatch) -> Awaitable[None]:
    make = grpc.aio.server

    def server(**options: Any) -> grpc.aio.Server:
        servers.append(make(**options))
        return servers[-1]

    monkeypatch.setattr(grpc.aio, "server", server)
    return HookServer(path, transport="grpc").start()


STARTS: dict[str, Callable[..., Awaitable[None]]] = {
    "proxy": lambda path, servers, _: proxy_start(path, servers),
    "hook server": hook_start,
}


class CancelledTwice:
    """A task to cancel as grpc starts, and once more a loop step later: as
    the start waits for grpc's, a second cancel must not reach grpc's start
    (gather would pass it on, and its InvalidStateError came back)."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task

    def cancel(self) -> bool:
        cancelled = self.task.cancel()  # its wake-up is queued first: the second finds it waiting
        asyncio.get_running_loop().call_soon(self.task.cancel)
        return cancelled


@pytest.mark.parametrize("twice", [False, True], ids=["cancelled once", "cancelled twice"])
@pytest.mark.parametrize("what", STARTS)
async def test_a_start_cancelled_at_grpcs_start_ends_cancelled_its_server_stopped_and_the_path_free(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, what: str, twice: bool
) -> None:
    path = sock_dir / "s.sock"
    servers: list[grpc.aio.Server] = []
    task = asyncio.ensure_future(STARTS[what](path, servers, monkeypatch))
    with cancelling_as_grpc_starts(CancelledTwice(task) if twice else task) as fired:  # type: ignore[arg-type]
        with pytest.raises(asyncio.CancelledError):  # not grpc's InvalidStateError
            await task
    assert fired == [True]
    (server,) = servers
    assert await server.wait_for_termination(0) is False  # stopped, and no crash for it to raise
    assert "InvalidStateError" not in caplog.text
    await assert_path_free(path)


def cancelling_as_asyncio_serves(monkeypatch: pytest.MonkeyPatch, task: asyncio.Task[Any]) -> list[bool]:
    """Cancel ``task`` as an asyncio server starts serving: listening and
    accepting, at the await after it."""
    real = base_events.Server._start_serving
    fired: list[bool] = []

    def start_serving(server: base_events.Server) -> None:
        real(server)
        fired.append(task.cancel())

    monkeypatch.setattr(base_events.Server, "_start_serving", start_serving)
    return fired


async def test_a_frames_hook_server_cancelled_as_it_starts_serving_lets_its_path_go(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hook run's default transport: its listener was left with the asyncio
    # server, unknown to its stop, and a socket file with no identity kept.
    path = sock_dir / "h.sock"
    task = asyncio.ensure_future(HookServer(path).start())
    fired = cancelling_as_asyncio_serves(monkeypatch, task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fired == [True]
    await assert_path_free(path)


async def test_the_status_socket_cancelled_as_it_starts_serving_lets_its_path_go(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Else its listener went on answering, unknown to its stop, the lock let go.
    path = sock_dir / "b.status.sock"
    status = StatusServer(path, lambda: {})
    task = asyncio.ensure_future(status.start())
    fired = cancelling_as_asyncio_serves(monkeypatch, task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fired == [True]
    await assert_path_free(path)


async def test_the_status_socket_is_never_wider_than_0660(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sock_dir / "b.status.sock"
    status = StatusServer(path, lambda: {})
    modes: list[int] = []
    chmod = os.chmod

    def recording_chmod(where: Any, mode: int) -> None:
        modes.append(stat.S_IMODE(os.lstat(where).st_mode))  # as bound
        chmod(where, mode)

    monkeypatch.setattr(os, "chmod", recording_chmod)
    umask = os.umask(0o022)  # a usual one: a socket bound under it is 0755
    try:
        await status.start()
    finally:
        os.umask(umask)
    try:
        assert modes == [0o660]
    finally:
        await status.stop()
