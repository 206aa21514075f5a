"""A start cancelled at grpc.aio's own start (its one await: the serving
task it has just created has not taken its first step) ends cancelled, its
server stopped and its socket path free. Cancelled in the caller's task,
grpc's start had the future it awaits cancelled: the serving task's
set_result raised InvalidStateError, which the stop that followed re-raised
in place of the CancelledError (serve: "fatal", exit 1 instead of 0)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

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


@pytest.mark.parametrize("what", STARTS)
async def test_a_start_cancelled_at_grpcs_start_ends_cancelled_its_server_stopped_and_the_path_free(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    path = sock_dir / "s.sock"
    servers: list[grpc.aio.Server] = []
    task = asyncio.ensure_future(STARTS[what](path, servers, monkeypatch))
    with cancelling_as_grpc_starts(task) as fired:
        with pytest.raises(asyncio.CancelledError):  # not grpc's InvalidStateError
            await task
    assert fired == [True]
    (server,) = servers
    assert await server.wait_for_termination(0) is False  # stopped, and no crash for it to raise
    assert "InvalidStateError" not in caplog.text
    await assert_path_free(path)
