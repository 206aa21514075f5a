"""A balloons hook's start ended early (hooks/balloons/server.py): a stop
while its status socket's start is at its last await, and a start failing
at its hook listener once its socket's lock is claimed (each can start again).
"""

from __future__ import annotations

import asyncio
from asyncio import base_events
from pathlib import Path

import pytest

from hooks.balloons.config import parse_config
from hooks.balloons.runtime import RuntimeClient
from hooks.balloons.server import BalloonsHook
from hooks.balloons.topology import Topology
from hooks.errors import HookServerError
from runtimeproxy.host import socketlock
from tests.unixsockets import socket_mode_fails

from .test_saved_reserved import ALONE

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


async def test_a_stop_at_the_status_sockets_last_await_removes_its_socket_and_lock(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused in StatusServer.start's ``start_serving`` (listening, its lock
    claimed, its socket bound): the stop's ``_before_stop`` stops the status
    server there, which removes its socket and lets its lock go, then cuts
    the start, the status step being part of it (BuiltinHook._start): the
    start has ended, "cancelled by a stop", once the stop returns (before:
    the status step ran after the shared start, which the stop found ended;
    the start, still paused, ended only as it resumed, and a start again
    meanwhile was refused "used once"). Nothing serves or is left running,
    and a start again serves (guards existing behaviour)."""
    before = asyncio.all_tasks()  # (a session-wide loop: tasks of others may run)
    hook = BalloonsHook(str(sock_dir / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(sock_dir / "runtime.sock")))
    status_path = hook.status_socket
    paused, go_on = asyncio.Event(), asyncio.Event()
    servers: list[base_events.Server] = []
    real_start_serving = base_events.Server.start_serving

    async def start_serving(server: base_events.Server) -> None:
        """asyncio's own, then held until ``go_on`` (still inside StatusServer.start's await of it)."""
        await real_start_serving(server)
        sockets = server.sockets
        if sockets and sockets[0].getsockname() == str(status_path):  # not the hook socket's (frames)
            servers.append(server)
            paused.set()
            await go_on.wait()

    monkeypatch.setattr(base_events.Server, "start_serving", start_serving)
    starting = asyncio.ensure_future(hook.start())
    await asyncio.wait_for(paused.wait(), WAIT)
    assert status_path.is_socket()  # bound, its lock held
    await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
    # The stop's own status.stop() removed them, not the start's second one, which has not run yet.
    assert not status_path.exists() and not socketlock.lock_path(status_path).exists()
    with pytest.raises(HookServerError, match="cancelled by a stop"):
        await asyncio.wait_for(starting, WAIT)  # not held till the status step resumes
    go_on.set()
    assert not hook.serving
    assert not status_path.exists() and not Path(hook.socket_path).exists()
    for path in (status_path, Path(hook.socket_path)):  # each lock let go: claimed at once
        assert not socketlock.lock_path(path).exists()
        socketlock.release(await asyncio.wait_for(socketlock.claim(path, wait_s=0), WAIT))
    (server,) = servers
    assert not server.is_serving() and server.sockets == ()  # its listening socket closed, nothing accepts
    with pytest.raises((FileNotFoundError, ConnectionRefusedError)):
        await asyncio.open_unix_connection(str(status_path))
    assert hook._runtime.closed
    assert asyncio.all_tasks() == before  # no start nor stop step left running
    monkeypatch.undo()
    await asyncio.wait_for(hook.start(), WAIT)  # a start cut by a stop leaves the hook startable
    try:
        assert hook.serving and status_path.is_socket() and not hook._runtime.closed
    finally:
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
    assert asyncio.all_tasks() == before


async def test_a_start_failing_at_its_listener_runs_the_release_step_and_can_start_again(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lock claimed, the start fails at its listener: ``_before_release``
    runs (the runtime client closed, the last set written, under the lock;
    before that: the lock went with neither). A start again, the cause gone,
    starts (before this: refused as "used once"); that it serves:
    test_start_again.py."""
    hook = BalloonsHook(str(sock_dir / "b.sock"), parse_config(ALONE), topology=Topology.synthetic(1, 2, 4, 1),
                        runtime=RuntimeClient(str(sock_dir / "runtime.sock")))
    socket_mode_fails(monkeypatch, hook.socket_path)
    with pytest.raises(HookServerError, match="cannot set the mode"):
        await hook.start()
    assert hook._runtime.closed and not hook.serving and not Path(hook.socket_path).exists()
    monkeypatch.undo()
    await asyncio.wait_for(hook.start(), WAIT)
    try:
        assert hook.serving and not hook._runtime.closed
    finally:
        await asyncio.wait_for(hook.stop(0, drain=0), WAIT)
