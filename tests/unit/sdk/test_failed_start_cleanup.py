"""A HookServer start that fails once it has gone past a step (hooks/sdk.py,
hooks/listen.py): a grpc listener bound but never started has its socket
file removed, if it is still the one it bound.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hooks.sdk import HookServer
from runtimeproxy.host import socketlock

WAIT = 10.0  # at most, for what must happen: a failure, not a hang


async def assert_lock_free(path: Path) -> None:
    assert not socketlock.lock_path(path).exists()
    (await asyncio.wait_for(socketlock.claim(path, wait_s=0), WAIT)).release()  # no holder: claimed at once


@pytest.fixture
def grpc_start_fails(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """grpc.aio's start raises, once bound; a path put in ``replace`` has a
    newer server's socket bound there first (ours unlinked), kept open."""
    replace: list[Path] = []
    newer: list[socket.socket] = []

    async def start(self: grpc.aio.Server) -> None:
        for path in replace:
            path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            newer.append(sock)
        raise RuntimeError("start failed")

    monkeypatch.setattr(grpc.aio._server.Server, "start", start)
    yield replace
    for sock in newer:
        sock.close()


async def test_a_grpc_listener_bound_but_never_started_has_its_socket_removed(
    sock_dir: Path, grpc_start_fails: list[Path]
) -> None:
    """grpc unlinks its socket at the stop of a server that started only
    (before: the file stayed until the next start's stale check)."""
    path = sock_dir / "h.sock"
    with pytest.raises(RuntimeError, match="start failed"):
        await HookServer(path, transport="grpc").start()
    assert not path.exists()
    await assert_lock_free(path)


async def test_a_socket_another_server_bound_in_place_of_the_never_started_ones_is_kept(
    sock_dir: Path, grpc_start_fails: list[Path]
) -> None:
    """Only the file it bound (its inode): a newer server's socket at the path stays (passes without the
    fix, which removes nothing; it fails if the removal skips the identity check)."""
    path = sock_dir / "h.sock"
    grpc_start_fails.append(path)
    with pytest.raises(RuntimeError, match="start failed"):
        await HookServer(path, transport="grpc").start()
    assert path.is_socket()
